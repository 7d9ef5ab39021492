// How long computing a SignatureId (canonical encode + XXH3-128) takes for typical signatures.
// The hook's fast path (interposer issue) budgets 150 ns per intercepted call in total; this is
// the allocating reference path that the fast path must match bit for bit, measured for scale.
//
//   build/bench/bench_signature_id [iterations]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/op_signature.h"

using namespace kforge;

namespace {

TensorMeta contiguous(DType dt, std::vector<int64_t> sizes) { return contiguous_tensor(dt, DeviceType::kCuda, std::move(sizes)); }

double ns_per_op(const OpSignature& s, long iters, uint64_t* sink) {
  auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < iters; ++i) *sink += s.id().lo;
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(iters);
}

}  // namespace

int main(int argc, char** argv) {
  long iters = argc > 1 ? std::atol(argv[1]) : 1000000;
  if (iters <= 0) {
    std::fprintf(stderr, "usage: %s [iterations > 0]\n", argv[0]);
    return 2;
  }
  OpSignature softmax{"aten::_softmax", "",
                      {Arg::tensor(contiguous(DType::kBFloat16, {4096, 50257})), Arg::integer(-1), Arg::boolean(false)},
                      Target{Backend::kCuda, "sm_90"}};
  OpSignature layer_norm{"aten::native_layer_norm", "",
                         {Arg::tensor(contiguous(DType::kFloat16, {8, 1024, 4096})), Arg::int_list({4096}),
                          Arg::tensor(contiguous(DType::kFloat16, {4096})),
                          Arg::tensor(contiguous(DType::kFloat16, {4096})), Arg::real(1e-5)},
                         Target{Backend::kCuda, "sm_90"}};
  uint64_t sink = 0;
  ns_per_op(softmax, iters / 10, &sink);  // warm-up
  std::printf("signature id (encode + XXH3-128), %ld iterations each\n", iters);
  std::printf("%-28s %8zu bytes %8.1f ns/id\n", "aten::_softmax 3 args", softmax.encode().size(),
              ns_per_op(softmax, iters, &sink));
  std::printf("%-28s %8zu bytes %8.1f ns/id\n", "aten::native_layer_norm 5", layer_norm.encode().size(),
              ns_per_op(layer_norm, iters, &sink));
  std::printf("(checksum %llx)\n", static_cast<unsigned long long>(sink));
  return 0;
}
