// What an intercepted call costs, measured from C++ through the dispatcher: no Python interpreter in
// the loop, so one process's number varies by a few ns where bench/hook_hit_overhead.py's children
// vary by tens (callgrind instruction counts, which do not vary at all, are the other way to see
// the hook's share: bench/results/2026-12-04-cpu-hook-miss-cost.log).
//
//   LD_LIBRARY_PATH=<torch>/lib build/bench/bench_hook_call_cost [--hook <libkforge_hook-torchX.Y.so>]
//                                                                [--batches N]
//
// Times at::add on two 4-element tensors, at::_softmax on [4, 16] over the last dimension and
// at::native_layer_norm on [4, 16] with a 16-element weight and bias: CPU, one thread, inference
// mode, on a miss (nothing in the replacement table). Each op runs N batches (default 300) of 2000
// back-to-back calls and reports the 10th percentile of the batches' per-call times: a batch takes
// a few ms, less than a scheduler quantum, so batches slowed by other processes on a busy machine
// are the ones left out. --hook dlopens the hook first (torch is loaded, as when the shim loads it).
// The hook cannot be unloaded: compare processes with and without it, alternating, e.g.
//   for r in 1 2 3 4 5 6; do bench_hook_call_cost; bench_hook_call_cost --hook $HOOK; done
// Prints one line: add=<ns> softmax=<ns> native_layer_norm=<ns>.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr int kBatch = 2000;

template <class F>
double ns_per_call(F&& f, int batches) {
  for (int i = 0; i < 5000; ++i) f();   // first sight of the signature, warm caches
  std::vector<double> per_call;
  per_call.reserve(static_cast<size_t>(batches));
  for (int b = 0; b < batches; ++b) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kBatch; ++i) f();
    const auto t1 = std::chrono::steady_clock::now();
    per_call.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / kBatch);
  }
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 10];
}

}  // namespace

int main(int argc, char** argv) {
  const char* hook = nullptr;
  int batches = 300;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--hook") == 0 && i + 1 < argc) {
      hook = argv[++i];
    } else if (std::strcmp(argv[i], "--batches") == 0 && i + 1 < argc) {
      batches = std::atoi(argv[++i]);
    } else {
      batches = 0;
      break;
    }
  }
  if (batches < 10) {
    std::fprintf(stderr, "usage: %s [--hook <libkforge_hook-torchX.Y.so>] [--batches N >= 10]\n", argv[0]);
    return 2;
  }
  at::set_num_threads(1);
  if (hook != nullptr && dlopen(hook, RTLD_NOW | RTLD_LOCAL) == nullptr) {
    std::fprintf(stderr, "cannot load %s: %s\n", hook, dlerror());
    return 1;
  }
  c10::InferenceMode inference;
  const at::Tensor a = at::ones({4});
  const at::Tensor b = at::ones({4});
  const at::Tensor x = at::ones({4, 16});
  const at::Tensor weight = at::ones({16});
  const at::Tensor bias = at::zeros({16});
  const double add = ns_per_call([&] { return at::add(a, b); }, batches);
  const double softmax = ns_per_call([&] { return at::_softmax(x, -1, false); }, batches);
  const double layer_norm = ns_per_call([&] { return at::native_layer_norm(x, {16}, weight, bias, 1e-5); }, batches);
  std::printf("add=%.1f softmax=%.1f native_layer_norm=%.1f\n", add, softmax, layer_norm);
  return 0;
}
