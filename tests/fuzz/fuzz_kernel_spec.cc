// libFuzzer target for KernelSpec's decoder (runtime/kernel_spec.h).
//
// Checks, for arbitrary bytes: KernelSpec::decode() returns (never throws, crashes or trips a
// sanitizer) with a reason on failure; a decoded spec is valid, re-encodes to exactly the input
// (decode accepts the canonical form only), decodes again to an equal spec with identical bytes
// and the same id, and resolves against a real signature without crashing (the loader does that
// with every spec it reads from the cache).
//
//   fuzz_kernel_spec -max_total_time=60 -rss_limit_mb=2048 corpus_work tests/fuzz/corpus/kernel_spec
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "runtime/kernel_spec.h"

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_kernel_spec: %s: %s\n", what, detail.c_str());
  std::abort();
}

kforge::OpSignature signature(kforge::Backend backend) {
  using namespace kforge;
  TensorMeta t;
  t.dtype = DType::kBFloat16;
  t.device = backend == Backend::kCuda ? DeviceType::kCuda : DeviceType::kCpu;
  t.sizes = {4096, 50257};
  t.strides = {50257, 1};
  TensorMeta gappy = t;
  gappy.sizes = {3, 4, 5};
  gappy.strides = {1, 0, 12};
  return OpSignature{"aten::_softmax", "",
                     {Arg::tensor(t), Arg::integer(-1), Arg::boolean(false), Arg::real(0.5), Arg::tensor(gappy),
                      Arg::none()},
                     Target{backend, backend == Backend::kCuda ? "sm_90" : "x86_64"}};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kforge::KernelSpec;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  kforge::StatusOr<KernelSpec> spec = KernelSpec::decode(bytes);
  if (!spec.ok()) {
    if (spec.status().message().empty()) fail("rejected without a reason", "");
    return 0;
  }
  const kforge::Status valid = spec->validate();
  if (!valid.ok()) fail("decode returned a spec that does not validate", valid.message());
  const std::string once = spec->encode();
  if (once != bytes) fail("decode accepted a non-canonical encoding", std::to_string(once.size()) + " bytes");
  kforge::StatusOr<KernelSpec> again = KernelSpec::decode(once);
  if (!again.ok()) fail("re-encoded spec does not decode", again.status().message());
  if (!(*again == *spec)) fail("round trip changed the spec", "");
  if (again->encode() != once) fail("encoding is not canonical", "");
  if (again->id() != spec->id()) fail("round trip changed the id", "");

  static const kforge::OpSignature cuda = signature(kforge::Backend::kCuda);
  static const kforge::OpSignature cpu = signature(kforge::Backend::kCpu);
  auto plan = spec->resolve(spec->backend == kforge::Backend::kCuda ? cuda : cpu);
  if (!plan.ok()) {
    if (plan.status().message().empty()) fail("resolve failed without a reason", "");
    return 0;
  }
  if (plan->launches.size() != spec->plan.launches.size() || plan->outputs.size() != spec->plan.outputs.size() ||
      plan->scratch.size() != spec->plan.scratch.size()) {
    fail("resolve dropped part of the plan", "");
  }
  for (const kforge::ResolvedLaunch& l : plan->launches) {
    const uint64_t threads = uint64_t{l.block[0]} * l.block[1] * l.block[2];
    if (l.grid[0] == 0 || l.grid[1] == 0 || l.grid[2] == 0 || l.grid[1] > 65535 || l.grid[2] > 65535 ||
        threads == 0 || threads > 1024) {
      fail("resolve let an illegal launch shape through", "");
    }
  }
  return 0;
}
