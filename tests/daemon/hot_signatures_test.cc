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

TEST_CASE("hot signatures: a signature no search has evaluated goes before a paused search, whatever the savings") {
  HotSignatures hot(HotOptions{100, 0});
  const OpSignature paused = softmax(8, 64);       // the larger saving (as above), 8 evaluations in
  const OpSignature fresh = softmax(4096, 4096);
  hot.on_report("p", report(1, 1, {entry(fresh, 1000, 100, 100 * 67'000), entry(paused, 100000, 1000, 1000 * 5'000)}));
  CHECK(hot.next_to_search(kRunnable, kBandwidth) == paused.id());
  hot.find(paused.id())->evaluations = 8;          // its search yielded (Note [Yielding searches])
  CHECK(hot.next_to_search(kRunnable, kBandwidth) == fresh.id());
  hot.find(fresh.id())->state = SearchState::kSearching;
  CHECK(hot.next_to_search(kRunnable, kBandwidth) == paused.id());   // then it resumes
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
  // Local peers: the transport gives their pids (SO_PEERCRED through ZeroMQ's peer address).
  const PeerCredentials c101{101, ""}, c202{202, ""};
  hot.on_hello("p1", hello_of(101), c101);
  hot.on_hello("p2", hello_of(202), c202);
  hot.on_report("p1", gpus_report(101, 1, {kGpu0}), c101);
  hot.on_report("p2", gpus_report(202, 1, {kGpu0, kGpu1}), c202);
  CHECK(hot.processes().at("p1").gpus_in_use == std::vector<std::string>{kGpu0});
  // The latest report says it all: p2 let go of GPU 0.
  hot.on_report("p2", gpus_report(202, 2, {kGpu1}), c202);
  CHECK(hot.processes().at("p2").gpus_in_use == std::vector<std::string>{kGpu1});
  CHECK(serving_pids_on(hot.processes(), kGpu0) == std::vector<int32_t>{101});

  hot.on_goodbye("p2", wire::Goodbye{202, "interpreter exit"}, c202);
  CHECK(hot.processes().at("p2").gpus_in_use.empty());
  CHECK(serving_pids_on(hot.processes(), kGpu1).empty());

  // Killed without a Goodbye: found gone by its pid, its GPUs forgotten.
  std::vector<int32_t> dead = {101};
  const auto alive = [&](int32_t pid) { return std::find(dead.begin(), dead.end(), pid) == dead.end(); };
  CHECK(hot.expire(alive).exited == std::vector<int32_t>{101});
  CHECK(hot.processes().at("p1").gone);
  CHECK(hot.processes().at("p1").gpus_in_use.empty());
  CHECK(hot.expire(alive).exited.empty());   // once
  CHECK(hot.live_peers().empty());
  // A process taken for gone that reports again is back.
  hot.on_report("p1", gpus_report(101, 2, {kGpu0}), c101);
  CHECK_FALSE(hot.processes().at("p1").gone);
  CHECK(serving_pids_on(hot.processes(), kGpu0) == std::vector<int32_t>{101});
  // ... but one that said Goodbye stays gone.
  hot.on_report("p2", gpus_report(202, 3, {kGpu1}), c202);
  CHECK(hot.processes().at("p2").gone);
  // A new connection (Hello) knows nothing of GPUs until its next report.
  hot.on_hello("p1", hello_of(101), c101);
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

// ---- Note [Bounded state]: what a hostile or broken client can make the daemon keep -----------------

namespace {

struct FakeClock {
  SteadyClock::time_point now = SteadyClock::time_point{} + std::chrono::hours(1);
  std::function<SteadyClock::time_point()> fn() {
    return [this] { return now; };
  }
};

HotOptions bounded(FakeClock& clock) {
  HotOptions o;
  o.min_calls = 1;
  o.clock = clock.fn();
  return o;
}

const auto kAllAlive = [](int32_t) { return true; };

}  // namespace

TEST_CASE("bounded state: a local peer is as alive as the process the kernel names, whatever its Hello claims") {
  FakeClock clock;
  HotSignatures hot(bounded(clock));
  // A client claiming to be pid 1 (init: alive for ever) from a process that is really 4242.
  hot.on_hello("liar", hello_of(1), PeerCredentials{4242, ""});
  CHECK(hot.processes().at("liar").peer_pid == 4242);
  CHECK(hot.expire(kAllAlive).exited.empty());
  const auto only_1_alive = [](int32_t pid) { return pid == 1; };
  const HotSignatures::Expired e = hot.expire(only_1_alive);
  CHECK(e.exited == std::vector<int32_t>{1});   // named as it claimed, judged by its real pid
  CHECK(hot.processes().at("liar").gone);
}

TEST_CASE("bounded state: a peer silent for process_timeout is gone, and a heartbeat (an empty report) keeps it") {
  FakeClock clock;
  HotOptions o = bounded(clock);
  o.process_timeout = std::chrono::seconds(60);
  HotSignatures hot(o);
  hot.on_hello("tcp-peer", hello_of(7), PeerCredentials{0, "10.0.0.2"});   // over tcp://: no pid to check
  hot.on_hello("quiet", hello_of(8), PeerCredentials{0, "10.0.0.3"});
  std::vector<int> found_silent_after;   // seconds
  for (int i = 1; i <= 9; ++i) {
    clock.now += std::chrono::seconds(10);
    hot.on_report("tcp-peer", report(7, static_cast<uint64_t>(i), {}), PeerCredentials{0, "10.0.0.2"});
    if (!hot.expire(kAllAlive).silent.empty()) found_silent_after.push_back(10 * i);
  }
  CHECK(found_silent_after == std::vector<int>{70});   // once, the first check past 60 s
  CHECK_FALSE(hot.processes().at("tcp-peer").gone);
  CHECK(hot.processes().at("quiet").gone);
  CHECK(hot.processes().at("quiet").goodbye_reason == "sent nothing for too long");
  // Heard from again: back.
  hot.on_report("quiet", report(8, 1, {}), PeerCredentials{0, "10.0.0.3"});
  CHECK_FALSE(hot.processes().at("quiet").gone);
}

TEST_CASE("bounded state: a gone process's record is dropped after gone_retention, and its counts are kept") {
  FakeClock clock;
  HotOptions o = bounded(clock);
  o.gone_retention = std::chrono::minutes(10);
  HotSignatures hot(o);
  const OpSignature a = softmax(64, 256);
  const PeerCredentials c{101, ""};
  hot.on_hello("p", hello_of(101), c);
  hot.on_report("p", report(101, 1, {entry(a, 300, 30, 30000)}), c);
  hot.on_report("q", report(202, 1, {entry(a, 100, 10, 20000)}), PeerCredentials{202, ""});
  hot.on_goodbye("p", wire::Goodbye{101, "interpreter exit"}, c);
  clock.now += std::chrono::minutes(11);
  CHECK(hot.expire(kAllAlive).dropped == 1);
  CHECK(hot.processes().count("p") == 0);
  // Its counters live on in the departed bucket: totals unchanged, one bucket however many left.
  const SignatureRecord& r = *hot.find(a.id());
  CHECK(r.calls() == 400);
  CHECK(r.mean_ns() == Approx(50000.0 / 40));
  CHECK(r.by_process.size() == 2);
  CHECK(r.by_process.count(SignatureRecord::kDeparted) == 1);
  CHECK(hot.counters().processes_expired == 1);
}

TEST_CASE("bounded state: thousands of Hellos keep at most max_peers_per_pid records per process, max_processes in all") {
  FakeClock clock;
  HotOptions o = bounded(clock);
  o.max_processes = 64;
  o.max_peers_per_pid = 8;
  HotSignatures hot(o);
  const OpSignature a = softmax(64, 256);
  // A real serving process that reports.
  hot.on_hello("serving", hello_of(500), PeerCredentials{500, ""});
  hot.on_report("serving", report(500, 1, {entry(a, 100, 10, 10000)}), PeerCredentials{500, ""});
  // One local attacker process opens 4000 connections, each with a Hello claiming another pid.
  for (int i = 0; i < 4000; ++i) {
    clock.now += std::chrono::milliseconds(1);
    hot.on_hello("fake" + std::to_string(i), hello_of(10000 + i), PeerCredentials{777, ""});
  }
  size_t from_attacker = 0;
  for (const auto& [peer, p] : hot.processes()) from_attacker += p.peer_pid == 777 ? 1 : 0;
  CHECK(from_attacker == 8);
  CHECK(hot.processes().count("serving") == 1);
  // Over tcp:// (no pid to group by): the global cap, bare Hellos evicted before a process that reports.
  for (int i = 0; i < 4000; ++i) {
    clock.now += std::chrono::milliseconds(1);
    hot.on_hello("tcp" + std::to_string(i), hello_of(20000 + i), PeerCredentials{0, "10.1.1.1"});
  }
  CHECK(hot.processes().size() <= 64);
  CHECK(hot.processes().count("serving") == 1);
  CHECK(hot.find(a.id())->calls() == 100);
  CHECK(hot.counters().processes_evicted >= 3992 + 4000 - 64);
}

TEST_CASE("bounded state: a process's signatures past its quota are refused and counted") {
  FakeClock clock;
  HotOptions o = bounded(clock);
  o.max_signatures_per_process = 100;
  HotSignatures hot(o);
  std::vector<wire::HotEntry> entries;
  for (int i = 0; i < 150; ++i) entries.push_back(entry(softmax(8, 16 + i), 10, 1, 1000));
  CHECK(hot.on_report("p", report(1, 1, entries), PeerCredentials{1, ""}) == 50);
  CHECK(hot.signatures().size() == 100);
  CHECK(hot.processes().at("p").signatures_refused == 50);
  // The same signatures again (cumulative counters) update what was taken; the rest stay refused.
  CHECK(hot.on_report("p", report(1, 2, entries), PeerCredentials{1, ""}) == 50);
  CHECK(hot.signatures().size() == 100);
  // Another process is not charged for the first one's.
  CHECK(hot.on_report("q", report(2, 1, {entry(softmax(8, 16), 5, 1, 1000)}), PeerCredentials{2, ""}) == 0);
  CHECK(hot.find(softmax(8, 16).id())->calls() == 15);
}

TEST_CASE("bounded state: past max_signatures the coldest are evicted, never one being searched") {
  FakeClock clock;
  HotOptions o = bounded(clock);
  o.max_signatures = 256;
  HotSignatures hot(o);
  const OpSignature hot_one = softmax(4096, 4096);
  const OpSignature searched = softmax(1, 1);
  hot.on_report("p", report(1, 1, {entry(hot_one, 1000000, 1000, 1000 * 50000), entry(searched, 1, 0, 0)}),
                PeerCredentials{1, ""});
  hot.find(searched.id())->state = SearchState::kSearching;
  for (int batch = 0; batch < 8; ++batch) {
    std::vector<wire::HotEntry> entries;
    for (int i = 0; i < 1000; ++i) entries.push_back(entry(softmax(2 + batch, 16 + i), 1 + static_cast<uint64_t>(i), 1, 100));
    (void)hot.on_report("p" + std::to_string(batch), report(10 + batch, 1, entries), PeerCredentials{10 + batch, ""});
    CHECK(hot.signatures().size() <= 256);
  }
  CHECK(hot.find(hot_one.id()) != nullptr);
  CHECK(hot.find(searched.id()) != nullptr);
  CHECK(hot.counters().signatures_evicted >= 8000 + 2 - 256);
}

TEST_CASE("time share: an active and an observing process reporting one signature never make it over 100%") {
  // The active process's calls are fast, the observing process's slow: pooling one mean over both
  // in the numerator while the denominator used each process's own gave 4600% (issue 19, item 7).
  FakeClock clock;
  HotSignatures hot(bounded(clock));
  const OpSignature s = softmax(64, 256), t = softmax(32, 32);
  hot.on_report("active", report(1, 1, {entry(s, 1000, 10, 10 * 100)}), PeerCredentials{1, ""});
  hot.on_report("observing", report(2, 1, {entry(s, 10, 10, 10 * 100000), entry(t, 1000, 10, 10 * 1)}),
                PeerCredentials{2, ""});
  const double share = hot.time_share(*hot.find(s.id()));
  CHECK(share == Approx((1000.0 * 100 + 10.0 * 100000) / (1000.0 * 100 + 10.0 * 100000 + 1000.0 * 1)));
  CHECK(share <= 1.0);
  CHECK(hot.find(s.id())->total_ns() == Approx(1000.0 * 100 + 10.0 * 100000));
}

TEST_CASE("peer credentials: ZeroMQ's ipc peer address carries the pid, and a tcp one is an address") {
  CHECK(peer_credentials_from_address("localhost:1000:1000:3658").pid == 3658);
  CHECK(peer_credentials_from_address("localhost:0:0:1").pid == 1);
  const PeerCredentials tcp = peer_credentials_from_address("192.168.1.7");
  CHECK(tcp.pid == 0);
  CHECK(tcp.address == "192.168.1.7");
  CHECK(peer_credentials_from_address("fe80::1:2:3").pid == 0);   // IPv6: an address, not credentials
  CHECK(peer_credentials_from_address("").pid == 0);
  CHECK(peer_credentials_from_address("localhost:0:0:-5").pid == 0);
  CHECK(peer_credentials_from_address("localhost:0:0:99999999999").pid == 0);
}
