// ActiveGpus (interposer/hook/cuda_devices.h): which GPUs a serving process reports as in use, and
// the rules that keep the probe from harming the process: it never brings CUDA into a process that
// has not loaded it, and never touches the driver in a fork of a process that had (CUDA is undefined
// there). Which GPUs a real process reports is specified by tests/python/test_daemon_cuda.py (gpu).
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "interposer/hook/cuda_devices.h"

using kforge::hook::ActiveGpus;

namespace {

bool loaded(const char* soname) {
  void* h = ::dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
  if (h != nullptr) ::dlclose(h);
  return h != nullptr;
}

// Runs `check` in a forked child; true if it returned true there.
template <typename F>
bool in_child(F check) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) ::_exit(check() ? 0 : 1);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

TEST_CASE("ActiveGpus: a process without the CUDA driver loaded reports no GPU and does not load it") {
  if (loaded("libcuda.so.1")) {
    WARN("libcuda.so.1 is already in this test process; skipped");
    return;
  }
  auto* gpus = new ActiveGpus();   // never destroyed, as in the hook
  gpus->install_fork_handler();
  CHECK_FALSE(gpus->may_use_driver());
  CHECK(gpus->current().empty());
  CHECK_FALSE(loaded("libcuda.so.1"));   // asking did not bring CUDA in
}

TEST_CASE("ActiveGpus: a fork of a process that had the driver loaded never uses it, one forked before may") {
  // Stand-ins for libcuda: libm is in every C++ process; libanl (glibc's) is in almost none.
  auto* had_it = new ActiveGpus("libm.so.6");
  had_it->install_fork_handler();
  REQUIRE(had_it->may_use_driver());
  CHECK(in_child([&] { return !had_it->may_use_driver() && had_it->current().empty(); }));
  // ... nor in a fork of that fork.
  CHECK(in_child([&] { return in_child([&] { return !had_it->may_use_driver(); }); }));
  CHECK(had_it->may_use_driver());   // the parent itself keeps its CUDA

  if (loaded("libanl.so.1")) {
    WARN("libanl.so.1 is already in this test process; the forked-before case is skipped");
    return;
  }
  auto* later = new ActiveGpus("libanl.so.1");
  later->install_fork_handler();
  CHECK_FALSE(later->may_use_driver());
  // The child loads it itself, after the fork: its own CUDA, which it may report.
  CHECK(in_child([&] { return ::dlopen("libanl.so.1", RTLD_NOW) != nullptr && later->may_use_driver(); }));
  CHECK_FALSE(loaded("libanl.so.1"));
}
