#include "search_daemon/worker/measurer.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <utility>

#include "runtime/op_catalog.h"
#include "search_daemon/worker/timing_stats.h"
#include "search_daemon/worker/trial_data.h"

namespace kforge::eval {

namespace {

constexpr int64_t kRotationBytes = int64_t{128} << 20;

// Note [Preempted pairs]: how many times one round is timed again when a thread of the worker was
// preempted during it; after that the round is kept as it is (the median copes with the odd one).
constexpr int kMaxRoundRetries = 4;

// Involuntary context switches of every thread of this process so far: a change across a timed
// call means some thread of ours (the caller, or one of torch's pool) lost its core meanwhile.
long involuntary_switches() {
  rusage u{};
  return ::getrusage(RUSAGE_SELF, &u) == 0 ? u.ru_nivcsw : 0;
}

// One timed call of the candidate as the hook's active path makes it. Throws on a launch error.
void run_candidate(EvalDevice& device, const LoadedCandidate& c, const ResolvedLaunchPlan& plan,
                   const std::vector<void*>& inputs, std::vector<at::Tensor>& keep) {
  keep.clear();
  std::vector<void*> outs, scratch;
  for (const ResolvedOutput& o : plan.outputs) {
    if (o.in_place_of >= 0) {   // the input itself (Note [In-place outputs] in runtime/kernel_spec.cc)
      outs.push_back(inputs.at(static_cast<size_t>(o.in_place_of)));
      continue;
    }
    keep.push_back(at::empty_strided(o.sizes, o.strides, device.options(to_scalar_type(o.dtype))));
    outs.push_back(keep.back().data_ptr());
  }
  for (const ResolvedScratch& s : plan.scratch) {
    if (s.bytes <= 0) {
      scratch.push_back(nullptr);
      continue;
    }
    keep.push_back(at::empty({s.bytes}, device.options(at::kByte)));
    scratch.push_back(keep.back().data_ptr());
  }
  const Status st = c.launch(plan, inputs, outs, scratch, CpuRunOptions{});
  if (!st.ok()) throw std::runtime_error("candidate launch failed: " + st.message());
}

}  // namespace

// Note [PyTorch's kernel for a key]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The baseline is the kernel the dispatcher runs for the backend's key (below autograd, as the
// hook's interceptors see it): the computed dispatch table's entry, which for an operator with no
// kernel of its own at CPU or CUDA (clone, _to_copy, embedding, mul.Scalar: CompositeExplicit-
// Autograd) is the composite kernel. OperatorHandle::callBoxedForDispatchKey is not that: it takes
// a kernel registered at exactly that key, else the key's backend fallback, and CPU and CUDA have
// none, so it called an empty KernelFunction (a jump to address 0): every measure of those four
// operators killed the worker with SIGSEGV, which the search took for the candidate's fault.
MeasureRun measure(EvalDevice& device, const LoadedCandidate& candidate, const MeasureRequest& r) {
  // Note [Measuring within the budget]: the share of the phase's budget spent so far.
  using Clock = std::chrono::steady_clock;
  const Clock::time_point began = Clock::now();
  auto share_at = [&](Clock::time_point when) {
    return r.budget_ms == 0 ? 0.0 : std::chrono::duration<double, std::milli>(when - began).count() / r.budget_ms;
  };
  MeasureRun m;
  const c10::DispatchKey key = r.signature->target.backend == Backend::kCuda ? c10::DispatchKey::CUDA
                                                                              : c10::DispatchKey::CPU;
  try {
    std::vector<TrialInputs> sets;
    StatusOr<TrialInputs> first =
        TrialInputs::make(*r.signature, device.device(), Distribution::kNormal, r.policy.seed * 7919 + 1, {}, nullptr);
    if (!first.ok()) {
      m.error = "cannot make timing inputs: " + first.status().message();
      return m;
    }
    const int64_t set_bytes = std::max<int64_t>(first->data_bytes(), 1);
    const int64_t rotation = std::clamp<int64_t>((kRotationBytes + set_bytes - 1) / set_bytes, 2, 8);
    sets.push_back(std::move(*first));
    for (int64_t i = 1; i < rotation && set_bytes <= (int64_t{1} << 31); ++i) {
      StatusOr<TrialInputs> more = TrialInputs::make(*r.signature, device.device(), Distribution::kNormal,
                                                     r.policy.seed * 7919 + 1 + static_cast<uint64_t>(i), {}, nullptr);
      if (!more.ok()) break;
      sets.push_back(std::move(*more));
    }
    std::vector<std::vector<void*>> pointers;
    for (const TrialInputs& s : sets) pointers.push_back(s.tensor_pointers());
    // An in-place operator writes its input: before each timed call (of either kernel) the
    // arguments it writes get their drawn values back, so every call computes on the same data
    // (repeated in-place calls would drift into infinities or denormals), outside the interval
    // and before the cache flush.
    std::vector<std::pair<at::Tensor, at::Tensor>> in_place;   // (the argument, its drawn values), per set
    std::vector<std::vector<size_t>> in_place_of_set(sets.size());
    for (const ResolvedOutput& o : r.plan->outputs) {
      if (o.in_place_of < 0) continue;
      for (size_t set = 0; set < sets.size(); ++set) {
        const at::Tensor& self = sets[set].args().at(static_cast<size_t>(o.in_place_of)).tensors.at(0);
        in_place_of_set[set].push_back(in_place.size());
        in_place.emplace_back(self, self.clone());
      }
    }
    auto reset_in_place = [&](size_t set) {
      for (size_t k : in_place_of_set[set]) in_place[k].first.copy_(in_place[k].second);
    };

    std::vector<at::Tensor> keep;
    // Set when a timed interval saw one of our threads preempted (Note [Preempted pairs]).
    bool preempted = false;
    auto time_candidate = [&](size_t set) {
      reset_in_place(set);
      device.flush_caches();
      const long switches = involuntary_switches();
      EvalDevice::Interval t = device.start_interval();
      run_candidate(device, candidate, *r.plan, pointers[set], keep);
      const double ns = device.finish_interval(t);
      preempted = preempted || involuntary_switches() != switches;
      keep.clear();
      return ns;
    };
    auto time_baseline = [&](size_t set) {
      if (r.policy.self_baseline) return time_candidate(set);
      torch::jit::Stack stack = sets[set].stack();
      reset_in_place(set);
      device.flush_caches();
      const long switches = involuntary_switches();
      EvalDevice::Interval t = device.start_interval();
      r.op.redispatchBoxed(c10::DispatchKeySet(key), &stack);   // Note [PyTorch's kernel for a key]
      const double ns = device.finish_interval(t);
      preempted = preempted || involuntary_switches() != switches;
      stack.clear();
      return ns;
    };

    // Note [Whose fault is a death in measure]
    // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    // A worker that dies in measure is taken for the candidate's doing (the daemon sees a death
    // and the phase). PyTorch's own kernel runs first, alone, in a phase of its own: a death there
    // (a kernel PyTorch cannot run for this signature, or a worker defect such as calling an empty
    // KernelFunction) is reported as the worker's error, and never blames a candidate.
    if (r.on_phase) r.on_phase("baseline");
    (void)time_baseline(0);
    if (r.on_phase) r.on_phase("measure");
    for (uint32_t i = 0; i < r.policy.warmup_runs; ++i) {
      (void)time_baseline(i % sets.size());
      (void)time_candidate(i % sets.size());
    }
    TimingOutcome& t = m.timing;
    const catalog::OpCost cost = catalog::op_cost(*r.signature, r.plan->outputs);
    t.clock = device.clock_name();
    t.bytes = cost.bytes;
    t.flops = cost.flops;
    t.bandwidth_ceiling_bytes_per_s = device.bandwidth_ceiling();
    t.call_floor_ns = device.call_floor_ns();
    t.expected_baseline_ns = expected_op_ns(cost.bytes, t.bandwidth_ceiling_bytes_per_s, t.call_floor_ns);
    // Note [Plausible timing]: a run that cannot be believed is made again, a few times at most.
    for (uint32_t attempt = 1; attempt <= kMaxTimingAttempts; ++attempt) {
      const Clock::time_point attempt_began = Clock::now();
      const uint32_t runs = std::max(r.policy.measure_runs, kMinMeasureRuns);
      std::vector<TimedPair> pairs;
      pairs.reserve(runs);
      for (uint32_t i = 0; i < runs; ++i) {
        const size_t set = i % sets.size();
        TimedPair p;
        for (int retry = 0; retry <= kMaxRoundRetries; ++retry) {
          preempted = false;
          if (i % 2 == 0) {
            p.baseline_ns = time_baseline(set);
            p.candidate_ns = time_candidate(set);
          } else {
            p.candidate_ns = time_candidate(set);
            p.baseline_ns = time_baseline(set);
          }
          if (!preempted || share_at(Clock::now()) > 0.5) break;
        }
        pairs.push_back(p);
      }
      const Status done = device.synchronize();
      if (!done.ok()) {
        m.fault = device.context_lost();
        m.error = "the device failed during timing: " + done.message();
        return m;
      }
      StatusOr<PairedTiming> s = summarize_pairs(pairs);
      if (!s.ok()) {
        m.error = s.status().message();
        return m;
      }
      t.runs = s->runs;
      t.baseline_median_ns = s->baseline_median_ns;
      t.candidate_median_ns = s->candidate_median_ns;
      t.baseline_spread = s->baseline_spread;
      t.candidate_spread = s->candidate_spread;
      t.speedup = s->speedup;
      t.noise_band = s->noise_band;
      t.significant = s->significant;
      t.attempts = attempt;
      t.implausible = r.policy.self_baseline
                          ? std::string()
                          : implausibility(t.baseline_median_ns, t.candidate_median_ns, t.bytes,
                                           t.bandwidth_ceiling_bytes_per_s, t.call_floor_ns,
                                           r.policy.max_baseline_model_ratio);
      if (t.implausible.empty()) break;
      const Clock::time_point now = Clock::now();
      if (share_at(now + (now - attempt_began)) > 0.8) break;   // another attempt would not end in time
    }
    const double seconds = t.candidate_median_ns * 1e-9;
    t.achieved_bytes_per_s = seconds > 0 ? cost.bytes / seconds : 0;
    t.achieved_flops_per_s = seconds > 0 ? cost.flops / seconds : 0;
  } catch (const std::exception& e) {
    (void)device.synchronize();
    m.fault = device.context_lost();
    m.error = std::string("timing failed: ") + std::string(e.what()).substr(0, 400);
  }
  return m;
}

}  // namespace kforge::eval
