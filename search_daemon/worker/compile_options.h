// What goes on a candidate's compile command besides its source: the fixed CPU flags, and the
// allow-lists that decide which of a KernelSpec's compile options may join them.
//
//   for (const std::string& o : spec.compile_options)
//     if (std::optional<std::string> why = refuse_cpu_option(o)) return "not allowed: " + *why;
//
// Promises: pure functions of the option text (no I/O, nothing throws). An option is refused when
// it could reach outside the build (an output path, an include directory, a response file, a
// linker flag, a plugin, dump or profile files), when it would make the object depend on the
// build host's CPU (-march=native), which the cache key does not cover, when it trades
// floating-point accuracy for speed, or when it would start parallel compile jobs on the serving
// host's cores (-flto other than -flto=1: Note [Idle workers] in evaluator/worker_process.h). The
// reason comes back as text for the build log; the caller never passes a refused option to the
// compiler.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace kforge {

// Every CPU compile gets these, before the spec's options; the build cache key covers them.
inline constexpr std::array<const char*, 4> kFixedCpuFlags = {"-std=c++17", "-O2", "-fPIC", "-shared"};

// Why `option` may not be passed to the compiler, or nullopt when it may.
std::optional<std::string> refuse_cpu_option(std::string_view o);

// NVRTC's options that trade accuracy for speed, refused for the same reason as on the CPU.
std::optional<std::string> refuse_cuda_option(std::string_view o);

}  // namespace kforge
