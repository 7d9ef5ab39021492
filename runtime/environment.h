// Environment: everything a cached kernel depends on besides its signature.
//
// It is part of every cache key. Promise: two environments share cache entries only when every
// field is equal, so a mismatch in any field (driver, NVRTC, GPU model, torch, kforge's own format)
// is a cache miss, never a load of a kernel built for something else. The canonical encoding is a
// msgpack array in a fixed order (see Note [Canonical environment encoding] in environment.cc);
// key() is its 128-bit XXH3 hash, equal on every host for equal environments.
//
//   Environment env = cpu_host_environment("2.9.0");
//   env.compiler = "g++ 12.2.0";                 // the worker knows its compiler
//   EnvironmentKey k = env.key();                // part of the cache entry's key
//   for (const std::string& d : env.differences(entry_env)) log("cache miss: " + d);
//   // "driver_version: 13000 != 12080"
//
// Manifests and messages that embed an environment use codec::pack / codec::read_environment
// (below; callers include runtime/msgpack_codec.h for Packer and Reader).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/op_signature.h"
#include "runtime/status.h"

namespace kforge {

// kforge's cache and kernel format version. Bump it whenever the meaning of a cached kernel
// changes (launch-plan semantics, ABI of CPU kernels, manifest layout): every old entry then
// misses instead of being misread.
inline constexpr uint32_t kFormatVersion = 1;

// A 128-bit id, like a signature's: same hash, same hex form.
using EnvironmentKey = SignatureId;

struct Environment {
  Backend backend = Backend::kCpu;
  // "sm_90" for CUDA; for CPU the machine plus its widest vector ISA: "x86_64-avx2", "aarch64".
  std::string arch;
  // "NVIDIA H200": different GPU models never share entries, even at the same arch, because the
  // winner of a timing search on one is not the winner on another. For CPU: the CPU model name.
  std::string device_model;
  int32_t driver_version = 0;   // as cuDriverGetVersion reports it (13000 = 13.0); 0 for CPU
  int32_t nvrtc_version = 0;    // major*1000 + minor*10 (12080 = 12.8); 0 for CPU
  std::string compiler;         // CPU: compiler id and version ("g++ 12.2.0"); empty for CUDA
  std::string torch_version;    // torch.__version__, e.g. "2.9.0+cu130"
  uint32_t format_version = kFormatVersion;

  // Canonical msgpack bytes: equal environments give equal bytes.
  std::string encode() const;
  // Parses bytes from encode(); rejects malformed input with a reason naming the field
  // ("environment.driver_version: expected integer, got string"). Never throws.
  static StatusOr<Environment> decode(std::string_view bytes);
  // XXH3-128 of encode().
  EnvironmentKey key() const;
  // One line for logs: backend=cuda arch="sm_90" device_model="NVIDIA H200" ... format_version=1
  std::string to_string() const;
  // One line per field that differs, in field order, "<field>: <this> != <other>"; strings are
  // quoted: {"driver_version: 13000 != 12080", "arch: \"sm_90\" != \"sm_80\""}. Empty iff equal.
  std::vector<std::string> differences(const Environment& other) const;

  friend bool operator==(const Environment&, const Environment&) = default;
};

// Upper bound on each string field in a decoded environment.
inline constexpr size_t kMaxEnvironmentString = 256;

// The environment of this host's CPU backend: backend=cpu, arch from uname's machine plus (on
// x86-64) the widest of avx512f/avx2/sse4.2 the CPU supports, device_model from /proc/cpuinfo's
// "model name" (empty if unknown), driver/nvrtc 0. `compiler` is left empty: the compiler that
// builds CPU candidates is the worker's, so the worker fills it.
Environment cpu_host_environment(std::string torch_version);

}  // namespace kforge

namespace kforge::codec {

class Packer;   // runtime/msgpack_codec.h, internal to the runtime
class Reader;

// The nested form: pack() writes exactly the bytes of Environment::encode(), so an embedded
// environment has the same key; read_environment() accepts exactly what decode() accepts, with
// errors under r's path ("manifest.environment.arch: expected string, got integer").
void pack(Packer& pk, const Environment& env);
StatusOr<Environment> read_environment(const Reader& r);

}  // namespace kforge::codec
