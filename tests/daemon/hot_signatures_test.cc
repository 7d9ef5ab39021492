// The daemon's view of the attached processes and the scheduler's rule (Note [Search priority]):
// cumulative counters per process, time shares, headroom over the roofline floor, thresholds.
#include <catch2/catch.hpp>

#include <algorithm>

#include "search_daemon/daemon/hot_signatures.h"

using namespace kforge;
using namespace kforge::daemon;

namespace {

OpSignature softmax(int64_t rows, int64_t cols) {
  TensorMeta m;
  m.dtype = DType::kFloat32;
  m.device = DeviceType::kCuda;
  m.sizes = {rows, cols};
  m.strides = {cols, 1};
  return OpSignature{"aten::_softmax", "", {Arg::tensor(m), Arg::integer(-1), Arg::boolean(false)}, Target{Backend::kCuda, "sm_90"}};
}

wire::HotEntry entry(const OpSignature& sig, uint64_t calls, uint64_t sampled, uint64_t ns) {
  wire::HotEntry e;
  e.signature = sig;
  e.calls = calls;
  e.sampled_calls = sampled;
  e.sampled_total_ns = ns;
  return e;
}

wire::HotReport report(int32_t pid, uint64_t seq, std::vector<wire::HotEntry> entries) {
  wire::HotReport r;
  r.pid = pid;
  r.sequence = seq;
  r.entries = std::move(entries);
  return r;
}

const auto kRunnable = [](const OpSignature&) { return true; };
const auto kBandwidth = [](const OpSignature&) { return 4e12; };

}  // namespace

TEST_CASE("hot signatures: cumulative counters per process, and a report gap is counted, not lost") {
  HotSignatures hot(HotOptions{10, 0});
  const OpSignature a = softmax(64, 256);
  wire::Hello hello;
  hello.pid = 101;
  hello.torch_version = "2.11.0";
  hot.on_hello("peer1", hello);
  hot.on_report("peer1", report(101, 1, {entry(a, 100, 10, 10000)}));
  hot.on_report("peer1", report(101, 3, {entry(a, 300, 30, 30000)}));   // report 2 was lost
  SignatureRecord* r = hot.find(a.id());
  REQUIRE(r != nullptr);
  CHECK(r->calls() == 300);            // the latest cumulative count, not 100 + 300
  CHECK(r->mean_ns() == Approx(1000));
  CHECK(hot.processes().at("peer1").sequence_gaps == 1);
  // A second process adds its own counts.
  hot.on_report("peer2", report(202, 1, {entry(a, 50, 5, 10000)}));
  CHECK(r->calls() == 350);
  CHECK(r->mean_ns() == Approx(40000.0 / 35));
  CHECK(hot.live_peers().size() == 2);
  hot.on_goodbye("peer2", wire::Goodbye{202, "interpreter exit"});
  CHECK(hot.live_peers() == std::vector<std::string>{"peer1"});
}

TEST_CASE("hot signatures: the scheduler picks the largest expected saving above the thresholds") {
  HotSignatures hot(HotOptions{100, 0.05});
  const OpSignature big = softmax(4096, 4096);     // 64 MiB in, 64 MiB out: floor 33.5 us at 4 TB/s
  const OpSignature small = softmax(8, 64);
  const OpSignature rare = softmax(16, 16);
  hot.on_report("p", report(1, 1, {entry(big, 1000, 100, 100 * 67'000),       // 2x the floor
                                    entry(small, 100000, 1000, 1000 * 5'000),  // tiny, many
                                    entry(rare, 50, 50, 50 * 1'000'000)}));    // under min_calls
  // small: 100000 x 5 us = 0.5 s of time, but its floor is ~4 ns: headroom ~1200, saving ~0.5 s.
  // big: 1000 x 67 us = 0.067 s, headroom 2: saving 0.033 s. rare: below min_calls.
  std::optional<SignatureId> next = hot.next_to_search(kRunnable, kBandwidth);
  REQUIRE(next);
  CHECK(*next == small.id());
  CHECK(hot.headroom(*hot.find(big.id()), 4e12) == Approx(2.0).epsilon(0.01));
  // Once it is searching, the next one.
  hot.find(small.id())->state = SearchState::kSearching;
  next = hot.next_to_search(kRunnable, kBandwidth);
  REQUIRE(next);
  CHECK(*next == big.id());
  hot.find(big.id())->state = SearchState::kSearching;
  CHECK_FALSE(hot.next_to_search(kRunnable, kBandwidth));   // rare never qualifies
}

TEST_CASE("hot signatures: a signature no slot can run waits as unrunnable, and is taken once one can") {
  HotSignatures hot(HotOptions{1, 0});
  const OpSignature a = softmax(64, 256);
  hot.on_report("p", report(1, 1, {entry(a, 10, 1, 1000)}));
  CHECK_FALSE(hot.next_to_search([](const OpSignature&) { return false; }, kBandwidth));
  CHECK(hot.find(a.id())->state == SearchState::kUnrunnable);
  CHECK_THAT(hot.find(a.id())->note, Catch::Contains("no evaluation slot runs cuda sm_90"));
  CHECK(hot.next_to_search(kRunnable, kBandwidth) == a.id());
}

TEST_CASE("hot signatures: time share is over the processes that reported the signature") {
  HotSignatures hot(HotOptions{1, 0});
  const OpSignature a = softmax(64, 256), b = softmax(128, 256);
  hot.on_report("p1", report(1, 1, {entry(a, 10, 10, 10 * 1000), entry(b, 10, 10, 10 * 3000)}));
  hot.on_report("p2", report(2, 1, {entry(b, 1000, 10, 10 * 3000)}));   // another process, b only
  CHECK(hot.time_share(*hot.find(a.id())) == Approx(10000.0 / (10000 + 30000)));
}

TEST_CASE("hot signatures: captured inputs attach to their signature, at most four") {
  HotSignatures hot(HotOptions{1, 0});
  const OpSignature a = softmax(64, 256);
  hot.on_report("p", report(1, 1, {entry(a, 10, 1, 1000)}));
  wire::CapturedInputs c;
  c.pid = 1;
  c.signature_id = a.id();
  for (int i = 0; i < 6; ++i) hot.on_captured("p", c);
  CHECK(hot.find(a.id())->captured.size() == 4);
  wire::CapturedInputs stray = c;
  stray.signature_id = softmax(1, 1).id();
  hot.on_captured("p", stray);   // a signature never reported: dropped
  CHECK(hot.signatures().size() == 1);
}

namespace {

const std::string kGpu0 = "GPU-5e2a910c-d34f-8b17-a0ff-00017e80c93b";
const std::string kGpu1 = "GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0";

wire::Hello hello_of(int32_t pid) {
  wire::Hello h;
  h.pid = pid;
  h.torch_version = "2.11.0";
  return h;
}

wire::HotReport gpus_report(int32_t pid, uint64_t seq, std::vector<std::string> gpus) {
  wire::HotReport r = report(pid, seq, {});
  r.gpus_in_use = std::move(gpus);
  return r;
}

}  // namespace

TEST_CASE("hot signatures: each process's latest GPUs in use, dropped when it says Goodbye or is found gone") {
  HotSignatures hot(HotOptions{10, 0});
  hot.on_hello("p1", hello_of(101));
  hot.on_hello("p2", hello_of(202));
  hot.on_report("p1", gpus_report(101, 1, {kGpu0}));
  hot.on_report("p2", gpus_report(202, 1, {kGpu0, kGpu1}));
  CHECK(hot.processes().at("p1").gpus_in_use == std::vector<std::string>{kGpu0});
  // The latest report says it all: p2 let go of GPU 0.
  hot.on_report("p2", gpus_report(202, 2, {kGpu1}));
  CHECK(hot.processes().at("p2").gpus_in_use == std::vector<std::string>{kGpu1});
  CHECK(serving_pids_on(hot.processes(), kGpu0) == std::vector<int32_t>{101});

  hot.on_goodbye("p2", wire::Goodbye{202, "interpreter exit"});
  CHECK(hot.processes().at("p2").gpus_in_use.empty());
  CHECK(serving_pids_on(hot.processes(), kGpu1).empty());

  // Killed without a Goodbye: found gone by its pid, its GPUs forgotten.
  std::vector<int32_t> dead = {101};
  const auto exists = [&](int32_t pid) { return std::find(dead.begin(), dead.end(), pid) == dead.end(); };
  CHECK(hot.forget_exited(exists) == std::vector<int32_t>{101});
  CHECK(hot.processes().at("p1").gone);
  CHECK(hot.processes().at("p1").gpus_in_use.empty());
  CHECK(hot.forget_exited(exists).empty());   // once
  CHECK(hot.live_peers().empty());
  // A process taken for gone that reports again (a pid namespace the daemon cannot see into) is back.
  hot.on_report("p1", gpus_report(101, 2, {kGpu0}));
  CHECK_FALSE(hot.processes().at("p1").gone);
  CHECK(serving_pids_on(hot.processes(), kGpu0) == std::vector<int32_t>{101});
  // ... but one that said Goodbye stays gone.
  hot.on_report("p2", gpus_report(202, 3, {kGpu1}));
  CHECK(hot.processes().at("p2").gone);
  // A new connection (Hello) knows nothing of GPUs until its next report.
  hot.on_hello("p1", hello_of(101));
  CHECK(hot.processes().at("p1").gpus_in_use.empty());
}

TEST_CASE("serving_pids_on: the attached processes whose latest report lists the GPU, each pid once, sorted") {
  std::map<std::string, ProcessRecord> procs;
  auto add = [&](const std::string& peer, int32_t pid, std::vector<std::string> gpus, bool gone) {
    ProcessRecord& p = procs[peer];
    p.peer = peer;
    p.hello.pid = pid;
    p.gpus_in_use = std::move(gpus);
    p.gone = gone;
  };
  add("a", 300, {kGpu0}, false);
  add("b", 100, {kGpu1, kGpu0}, false);
  add("c", 200, {kGpu0}, true);          // gone: not serving any more
  add("d", 300, {kGpu0}, false);         // the same process on a second connection
  add("e", 0, {kGpu0}, false);           // no pid known (never said Hello or reported)
  CHECK(serving_pids_on(procs, kGpu0) == std::vector<int32_t>{100, 300});
  CHECK(serving_pids_on(procs, kGpu1) == std::vector<int32_t>{100});
  CHECK(serving_pids_on(procs, "GPU-ffffffff-0000-0000-0000-000000000000").empty());
  CHECK(serving_pids_on(procs, "").empty());   // a CPU slot, or a GPU its worker could not name

  const std::map<std::string, std::vector<int32_t>> by_gpu = serving_gpus(procs);
  CHECK(by_gpu.size() == 2);
  CHECK(by_gpu.at(kGpu0) == std::vector<int32_t>{100, 300});
  CHECK(by_gpu.at(kGpu1) == std::vector<int32_t>{100});
  procs["b"].gone = true;
  CHECK(serving_gpus(procs).count(kGpu1) == 0);   // nobody left on it

  CHECK(pid_list({123, 456}) == "123, 456");
  CHECK(pid_list({}).empty());
}
