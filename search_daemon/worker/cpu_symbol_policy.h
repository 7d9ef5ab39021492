// What a CPU candidate's shared object may import. A CPU kernel that passes verification is later
// dlopen'ed into users' serving processes, so it must be a pure function of its buffers: it may
// call the C math library and the mem* family, nothing that starts threads (work escaping the
// launch, the CPU's "another stream"), allocates, does I/O or controls processes.
//
//   StatusOr<std::vector<std::string>> bad = forbidden_imports(so_bytes);
//   if (!bad.ok()) ...            // not an ELF64 shared object we can read: refused too
//   if (!bad->empty()) refuse("imports " + join(*bad));
//
// Promises: reads the ELF image's dynamic symbol table from memory (no loading, no running);
// bounded and safe on any bytes (truncated or hostile images give an error, never a crash);
// returns the undefined dynamic symbols not in the allowed set, sorted. Weak references count too
// (the loader binds a weak pthread_create whenever the process has one); the ones the toolchain
// always emits (__cxa_finalize, __gmon_start__, _ITM_*) are in the allowed set.
// A DT_NEEDED other than libc, libm, libstdc++ and libgcc_s is reported as "needs <soname>".
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "runtime/status.h"

namespace kforge {

StatusOr<std::vector<std::string>> forbidden_imports(std::string_view elf_image);

// The allowed imports, for messages and docs.
const std::vector<std::string>& allowed_cpu_imports();

}  // namespace kforge
