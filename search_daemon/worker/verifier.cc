#include "search_daemon/worker/verifier.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <optional>

#include "runtime/accuracy.h"
#include "runtime/op_catalog.h"
#include "search_daemon/worker/trial_data.h"

namespace kforge::eval {

namespace {

std::string fmt(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", x);
  return buf;
}

// "[3, 17]" for flat index 3 * 64 + 17 of sizes [*, 64].
std::string index_text(int64_t flat, at::IntArrayRef sizes) {
  std::vector<int64_t> idx(sizes.size(), 0);
  for (size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] > 0) {
      idx[d] = flat % sizes[d];
      flat /= sizes[d];
    }
  }
  std::string s = "[";
  for (size_t d = 0; d < idx.size(); ++d) s += (d ? ", " : "") + std::to_string(idx[d]);
  return s + "]";
}

std::string layout_text(at::IntArrayRef sizes, at::IntArrayRef strides) {
  return c10::str(sizes) + "/" + c10::str(strides);
}

// The bits of a tensor as integers of the same width (complex: its real view's), for bitwise and
// NaN-safe comparisons and for poisoning.
at::Tensor bits_of(const at::Tensor& t) {
  const at::Tensor real = t.is_complex() ? at::view_as_real(t) : t;
  return real.view(bits_type(real.scalar_type()));
}

int64_t poison_of(const at::Tensor& t) {
  return poison_bits(t.is_complex() ? c10::toRealValueType(t.scalar_type()) : t.scalar_type());
}

// Values for messages: the element as a double ("nan", "inf" spelled out by %g).
std::string element_text(const at::Tensor& t, int64_t flat) {
  const at::Tensor e = t.reshape({-1}).narrow(0, flat, 1).to(at::kDouble).cpu();
  return fmt(e.item<double>());
}

// The first flat index where `mask` (bool, any layout) is true, or -1.
int64_t first_true(const at::Tensor& mask) {
  const at::Tensor nz = at::nonzero(mask.reshape({-1})).cpu();
  return nz.size(0) > 0 ? nz[0][0].item<int64_t>() : -1;
}

// One trial's inputs, by name.
struct TrialPlan {
  Distribution dist;
  uint64_t seed;
  const wire::CapturedInputs* captured;
  std::string label;
};

std::vector<TrialPlan> plan_trials(const VerifyRequest& r) {
  const uint32_t wanted = std::max(r.policy.trials, kMinTrials);
  std::vector<TrialPlan> t;
  const Distribution fixed[] = {Distribution::kNormal, Distribution::kUniform, Distribution::kLarge,
                                Distribution::kOffset, Distribution::kZeros};
  for (Distribution d : fixed) t.push_back({d, 0, nullptr, distribution_name(d)});
  if (r.input_stats != nullptr && !r.input_stats->empty()) t.push_back({Distribution::kObserved, 0, nullptr, "observed"});
  if (r.captured != nullptr) {
    for (size_t k = 0; k < r.captured->size(); ++k) {
      t.push_back({Distribution::kCaptured, 0, &(*r.captured)[k], "captured#" + std::to_string(k + 1)});
    }
  }
  for (int extra = 2; t.size() < wanted; ++extra) {
    t.push_back({Distribution::kNormal, 0, nullptr, "normal#" + std::to_string(extra)});
  }
  for (size_t i = 0; i < t.size(); ++i) t[i].seed = r.policy.seed * 1000003 + i + 1;
  return t;
}

// The float64 reference's arguments: floating tensors as float64, and the arguments the catalog
// marks as choosing the result's type (ArgRole::kResultType: half_to_float, dtype) set so the
// kernel computes and returns float64.
torch::jit::Stack reference_stack(const TrialInputs& in, const OpSignature& sig) {
  torch::jit::Stack s = in.stack_float64();
  const catalog::OpEntry* op = catalog::find(sig);
  if (op == nullptr) return s;
  for (size_t i = 0; i < s.size() && i < op->args.size(); ++i) {
    if (op->args[i].role != catalog::ArgRole::kResultType) continue;
    if (s[i].isBool()) s[i] = c10::IValue(false);
    if (s[i].isInt()) s[i] = c10::IValue(static_cast<int64_t>(at::kDouble));
  }
  return s;
}

// Note [Verifying in place]
// A plan output written in place (ResolvedOutput::in_place_of: relu_, add_; Note [In-place
// outputs] in runtime/kernel_spec.cc) is the trial's own argument: nothing is allocated or
// poisoned for it. PyTorch's kernel and the float64 reference run on copies of that argument (in
// its layout), so the trial's argument keeps its drawn values until a candidate run; before every
// candidate run its values are put back (make_run_buffers, from in_place_values), and after the
// run the output is read through it. The argument's guards are still checked, its data is not "input_modified";
// every other input must stay untouched. "not_written" becomes: the candidate left the argument as
// it was where PyTorch's kernel changed it (an in-place kernel that wrote somewhere else).

// Which signature arguments the plan writes in place, by argument index.
std::vector<bool> in_place_args(const ResolvedLaunchPlan& plan, size_t num_args) {
  std::vector<bool> w(num_args, false);
  for (const ResolvedOutput& o : plan.outputs) {
    if (o.in_place_of >= 0 && static_cast<size_t>(o.in_place_of) < num_args) w[static_cast<size_t>(o.in_place_of)] = true;
  }
  return w;
}

// `stack` with each argument the plan writes in place replaced by a copy in the same layout (the
// same tensor's values, or the float64 conversion's), so that running PyTorch's kernel on it
// leaves the trial's tensor alone.
torch::jit::Stack with_in_place_copies(torch::jit::Stack stack, const std::vector<bool>& written) {
  for (size_t i = 0; i < stack.size() && i < written.size(); ++i) {
    if (!written[i] || !stack[i].isTensor()) continue;
    const at::Tensor t = stack[i].toTensor();
    stack[i] = at::empty_strided(t.sizes(), t.strides(), t.options()).copy_(t);
  }
  return stack;
}

// The candidate's output and scratch buffers for one run, poisoned.
struct RunBuffers {
  std::vector<std::optional<GuardedBuffer>> out_buffers;   // none for an output written in place
  std::vector<at::Tensor> outputs;
  std::vector<GuardedBuffer> scratch;
  std::vector<void*> out_ptrs;
  std::vector<void*> scratch_ptrs;
};

enum class Poison { kFirst, kSecond };

// `in_place_values`: per signature argument, the values an argument written in place is reset to
// before the run (Note [Verifying in place]); undefined for the others.
RunBuffers make_run_buffers(const EvalDevice& device, const ResolvedLaunchPlan& plan, Poison poison,
                            const TrialInputs& in, const std::vector<at::Tensor>& in_place_values) {
  RunBuffers b;
  for (const ResolvedOutput& o : plan.outputs) {
    if (o.in_place_of >= 0) {
      const auto i = static_cast<size_t>(o.in_place_of);
      const at::Tensor& self = in.args().at(i).tensors.at(0);
      self.copy_(in_place_values.at(i));
      b.out_ptrs.push_back(self.data_ptr());
      b.outputs.push_back(self);
      b.out_buffers.emplace_back(std::nullopt);
      continue;
    }
    const at::ScalarType st = to_scalar_type(o.dtype);
    GuardedBuffer g = GuardedBuffer::make(device.device(), o.storage_bytes, 0, GuardedBuffer::Guard::kCanary, st);
    at::Tensor v = g.view(st, o.sizes, o.strides);
    if (v.numel() > 0) {
      if (poison == Poison::kFirst) {
        bits_of(v).fill_(poison_of(v));
      } else {
        // Finite and unremarkable: a candidate that reads an output before writing it now gets a
        // number instead of a NaN, and its result changes.
        v.fill_(1);
      }
    }
    b.out_ptrs.push_back(g.data());
    b.outputs.push_back(v);
    b.out_buffers.push_back(std::move(g));
  }
  for (const ResolvedScratch& s : plan.scratch) {
    GuardedBuffer g = GuardedBuffer::make(device.device(), s.bytes, 0, GuardedBuffer::Guard::kCanary, at::kByte);
    g.fill_data(poison == Poison::kFirst ? 0xFF : 0x00);
    b.scratch_ptrs.push_back(s.bytes > 0 ? g.data() : nullptr);
    b.scratch.push_back(std::move(g));
  }
  return b;
}

struct Failure {
  std::string check;
  std::string detail;
};

// A failure of `check` if run `b`'s outputs differ from run 1's (`first`, whose bits are `bits`) in
// any element: how many, and the first with both values.
std::optional<Failure> differs(const RunBuffers& first, const RunBuffers& b, const std::vector<at::Tensor>& bits,
                               const char* check, const std::string& what) {
  for (size_t k = 0; k < b.outputs.size(); ++k) {
    if (!bits[k].defined()) continue;
    const at::Tensor diff = bits_of(b.outputs[k]).ne(bits[k]);
    const int64_t n = diff.sum().item<int64_t>();
    if (n > 0) {
      const int64_t i = first_true(diff);
      return Failure{check, what + " " + std::to_string(n) + " elements of output " + std::to_string(k) +
                                " (first at " + index_text(i, b.outputs[k].sizes()) + ": " +
                                element_text(first.outputs[k], i) + " then " + element_text(b.outputs[k], i) + ")"};
    }
  }
  return std::nullopt;
}

// Note [Verify profile]
// ~~~~~~~~~~~~~~~~~~~~~
// Where a verification's time goes, for KFORGE_WORKER_PROFILE: per trial, drawing the inputs,
// PyTorch's kernel and the float64 reference, the candidate's runs with their memory, determinism
// and staleness checks, and the accuracy comparison; one line on the worker's stderr per
// verification. Each section ends with the device synchronized, so GPU work is charged to the
// section that queued it (which slows a profiled verification a little; an unprofiled one never
// synchronizes for it). A trial that fails stops the clock where it failed.
struct VerifyProfile {
  enum Section : size_t { kInputs, kReference, kRuns, kAccuracy, kSections };
  bool on = false;
  double ms[kSections] = {};
  std::chrono::steady_clock::time_point last{};
  void start() {
    if (on) last = std::chrono::steady_clock::now();
  }
  void end(Section section, EvalDevice& device) {
    if (!on) return;
    (void)device.synchronize();
    const auto now = std::chrono::steady_clock::now();
    ms[section] += std::chrono::duration<double, std::milli>(now - last).count();
    last = now;
  }
};

class TrialRunner {
 public:
  TrialRunner(EvalDevice& device, const LoadedCandidate& candidate, const VerifyRequest& r, VerifyRun& out)
      : device_(device), candidate_(candidate), r_(r), out_(out) {
    profile_.on = r.profile;
  }
  const VerifyProfile& profile() const { return profile_; }

  // Empty optional: the trial passed. Sets out_.fault / out_.worker_error where it applies.
  std::optional<Failure> run(const TrialPlan& t, size_t trial_index);

 private:
  // Launches into `b` and waits; a failure names the check ("launch"; a fault sets out_.fault).
  std::optional<Failure> launch(const TrialInputs& in, RunBuffers& b, uint64_t block_seed, int smem_poison);
  std::optional<Failure> check_memory(const TrialInputs& in, const std::vector<at::Tensor>& before, const RunBuffers& b);

  EvalDevice& device_;
  const LoadedCandidate& candidate_;
  const VerifyRequest& r_;
  VerifyRun& out_;
  std::vector<at::Tensor> prev_candidate_;   // the previous trial's candidate outputs (bits)
  std::vector<at::Tensor> prev_torch_;       // and PyTorch's
  std::vector<bool> written_;                // the arguments the plan writes in place
  VerifyProfile profile_;
};

std::optional<Failure> TrialRunner::launch(const TrialInputs& in, RunBuffers& b, uint64_t block_seed,
                                           int smem_poison) {
  CpuRunOptions o;
  o.block_order_seed = block_seed;
  o.shared_mem_poison = smem_poison;
  const Status s = candidate_.launch(*r_.plan, in.tensor_pointers(), b.out_ptrs, b.scratch_ptrs, o);
  if (!s.ok()) {
    (void)device_.synchronize();
    if (device_.context_lost()) {
      out_.fault = true;
      return Failure{"launch", "the launch failed and the CUDA context is lost: " + s.message()};
    }
    return Failure{"launch", s.message()};
  }
  const Status done = device_.synchronize();
  if (!done.ok()) {
    if (device_.context_lost()) out_.fault = true;
    return Failure{"launch", "the kernel failed: " + done.message()};
  }
  return std::nullopt;
}

std::optional<Failure> TrialRunner::check_memory(const TrialInputs& in, const std::vector<at::Tensor>& before,
                                                 const RunBuffers& b) {
  for (size_t k = 0; k < b.out_buffers.size(); ++k) {
    if (!b.out_buffers[k]) continue;   // in place: the input's guards, below
    if (std::string d = b.out_buffers[k]->guard_damage(); !d.empty()) return Failure{"out_of_bounds", "output " + std::to_string(k) + ": " + d};
  }
  for (size_t k = 0; k < b.scratch.size(); ++k) {
    if (std::string d = b.scratch[k].guard_damage(); !d.empty()) return Failure{"out_of_bounds", "scratch " + std::to_string(k) + ": " + d};
  }
  bool in_guards = false;
  if (std::string d = in.changes_since(before, &in_guards, &written_); !d.empty()) {
    return Failure{in_guards ? "out_of_bounds" : "input_modified", d};
  }
  return std::nullopt;
}

std::optional<Failure> TrialRunner::run(const TrialPlan& t, size_t trial_index) {
  const ResolvedLaunchPlan& plan = *r_.plan;
  profile_.start();
  StatusOr<TrialInputs> made = TrialInputs::make(*r_.signature, device_.device(), t.dist, t.seed,
                                                 r_.input_stats != nullptr ? *r_.input_stats : std::vector<wire::InputStats>{},
                                                 t.captured);
  if (!made.ok()) {
    out_.worker_error = "cannot make the " + t.label + " inputs: " + made.status().message();
    return Failure{"inputs", out_.worker_error};
  }
  const TrialInputs& in = *made;
  written_ = in_place_args(plan, in.args().size());
  // Note [Verifying in place]: the drawn values of each argument written in place.
  std::vector<at::Tensor> in_place_values(in.args().size());
  for (size_t i = 0; i < written_.size(); ++i) {
    if (written_[i]) in_place_values[i] = in.args()[i].tensors.at(0).clone();
  }

  profile_.end(VerifyProfile::kInputs, device_);
  std::vector<at::Tensor> torch_out;
  std::vector<at::Tensor> ref;
  try {
    torch_out = call_op(r_.op, with_in_place_copies(in.stack(), written_));
    ref = call_op(r_.op, with_in_place_copies(reference_stack(in, *r_.signature), written_));
  } catch (const std::exception& e) {
    out_.worker_error = "PyTorch's kernel failed on the " + t.label + " inputs: " + std::string(e.what()).substr(0, 400);
    return Failure{"reference", out_.worker_error};
  }
  if (torch_out.size() != plan.outputs.size() || ref.size() != plan.outputs.size()) {
    out_.worker_error = "PyTorch's kernel returned " + std::to_string(torch_out.size()) + " tensors, the plan makes " +
                        std::to_string(plan.outputs.size());
    return Failure{"reference", out_.worker_error};
  }
  if (trial_index == 0) {
    for (size_t k = 0; k < plan.outputs.size(); ++k) {
      const ResolvedOutput& o = plan.outputs[k];
      const at::Tensor& e = torch_out[k];
      if (to_scalar_type(o.dtype) != e.scalar_type()) {
        return Failure{"output_layout", "output " + std::to_string(k) + ": dtype " + std::string(dtype_name(o.dtype)) +
                                            " != PyTorch's " + c10::toString(e.scalar_type())};
      }
      if (at::IntArrayRef(o.sizes) != e.sizes() || at::IntArrayRef(o.strides) != e.strides()) {
        return Failure{"output_layout", "output " + std::to_string(k) + ": sizes/strides " +
                                            layout_text(o.sizes, o.strides) + " != PyTorch's " +
                                            layout_text(e.sizes(), e.strides())};
      }
    }
  }

  profile_.end(VerifyProfile::kReference, device_);
  const std::vector<at::Tensor> before = in.snapshot();
  const uint64_t seed_base = 0x9E3779B97F4A7C15ull * (trial_index + 1);

  // Run 1: the result every other run is compared with.
  RunBuffers first = make_run_buffers(device_, plan, Poison::kFirst, in, in_place_values);
  if (auto f = launch(in, first, seed_base | 1, 0xFF)) return f;
  if (auto f = check_memory(in, before, first)) return f;
  std::vector<at::Tensor> bits;
  for (size_t k = 0; k < first.outputs.size(); ++k) {
    const at::Tensor& o = first.outputs[k];
    if (o.numel() == 0) {
      bits.push_back(at::Tensor());
      continue;
    }
    if (plan.outputs[k].in_place_of >= 0) {
      // Note [Verifying in place]: nothing to poison; left as drawn where PyTorch's kernel wrote.
      const at::Tensor drawn = bits_of(in_place_values[static_cast<size_t>(plan.outputs[k].in_place_of)]);
      const at::Tensor changed_by_torch = bits_of(torch_out[k]).ne(drawn);
      if (changed_by_torch.any().item<bool>() && at::equal(bits_of(o), drawn)) {
        const int64_t at_flat = first_true(changed_by_torch);
        return Failure{"not_written", "output " + std::to_string(k) + " (argument " +
                                          std::to_string(plan.outputs[k].in_place_of) +
                                          ", written in place) was left as it was, where PyTorch's kernel changed " +
                                          std::to_string(changed_by_torch.sum().item<int64_t>()) + " elements (first at " +
                                          index_text(at_flat, o.sizes()) + ")"};
      }
      bits.push_back(bits_of(o).clone());
      continue;
    }
    const at::Tensor unwritten = bits_of(o).eq(poison_of(o));
    const int64_t n = unwritten.sum().item<int64_t>();
    if (n > 0) {
      const int64_t at_flat = first_true(unwritten);
      return Failure{"not_written", "output " + std::to_string(k) + ": " + std::to_string(n) + " of " +
                                        std::to_string(o.numel()) + " elements never written (first at " +
                                        index_text(at_flat, o.sizes()) + ")"};
    }
    bits.push_back(bits_of(o).clone());
  }
  if (device_.is_cuda()) {
    // Work on another stream would still be running now; let it finish and look again.
    (void)device_.synchronize_all();
    if (device_.context_lost()) {
      out_.fault = true;
      return Failure{"async_write", "work outside the stream failed and the CUDA context is lost"};
    }
    for (size_t k = 0; k < first.outputs.size(); ++k) {
      if (bits[k].defined() && !at::equal(bits_of(first.outputs[k]), bits[k])) {
        return Failure{"async_write", "output " + std::to_string(k) + " changed after the candidate's stream finished"};
      }
    }
  }

  // Determinism: the same poisons, other block orders (CPU) or simply another run (CUDA).
  const uint32_t again = std::max<uint32_t>(1, r_.policy.determinism_runs);
  for (uint32_t run = 0; run < again; ++run) {
    RunBuffers b = make_run_buffers(device_, plan, Poison::kFirst, in, in_place_values);
    if (auto f = launch(in, b, seed_base + 2 * (run + 1) + 1, 0xFF)) return f;
    if (auto f = check_memory(in, before, b)) return f;
    if (auto f = differs(first, b, bits, "nondeterministic", "run " + std::to_string(run + 2) + " differs from run 1 in")) return f;
  }

  // Uninitialized reads: scratch, shared memory and outputs poisoned otherwise, blocks as in run 1.
  {
    RunBuffers b = make_run_buffers(device_, plan, Poison::kSecond, in, in_place_values);
    if (auto f = launch(in, b, seed_base | 1, 0x00)) return f;
    if (auto f = check_memory(in, before, b)) return f;
    if (auto f = differs(first, b, bits, "uninitialized_read",
                         "with scratch, shared memory and outputs poisoned otherwise, a run differs from run 1 in")) {
      return f;
    }
  }

  // A result that is the previous trial's, for other inputs.
  if (trial_index > 0 && prev_candidate_.size() == bits.size()) {
    bool all_stale = !bits.empty();
    bool torch_same = true;
    for (size_t k = 0; k < bits.size(); ++k) {
      if (!bits[k].defined() || !prev_candidate_[k].defined() || !at::equal(bits[k], prev_candidate_[k])) {
        all_stale = false;
        break;
      }
      torch_same = torch_same && at::equal(bits_of(torch_out[k]), prev_torch_[k]);
    }
    if (all_stale && !torch_same) {
      return Failure{"stale_output", "the outputs are bit for bit the previous trial's, while PyTorch's changed"};
    }
  }
  prev_candidate_ = bits;
  prev_torch_.clear();
  for (const at::Tensor& o : torch_out) prev_torch_.push_back(bits_of(o).clone());
  profile_.end(VerifyProfile::kRuns, device_);

  for (size_t k = 0; k < first.outputs.size(); ++k) {
    const at::Tensor& c = first.outputs[k];
    const at::Tensor& o = torch_out[k];
    const std::string out = "output " + std::to_string(k) + ": ";
    if (c.numel() == 0) continue;
    if (catalog::output_values_unspecified(*r_.signature, k)) continue;   // PyTorch's are uninitialized
    if (!at::isFloatingType(o.scalar_type()) && !at::isComplexType(o.scalar_type())) {
      const at::Tensor diff = c.ne(o);
      if (diff.any().item<bool>()) {
        const int64_t i = first_true(diff);
        return Failure{"accuracy", out + "values differ from PyTorch's (first at " + index_text(i, c.sizes()) + ": " +
                                       element_text(c, i) + " vs " + element_text(o, i) + ")"};
      }
      continue;
    }
    // Note [Accuracy in few passes]: NaN and Inf positions are compared in the outputs' own
    // dtype (a conversion to float64 keeps both exactly; complex outputs are converted first, as
    // the float64 comparison always took them), each side's error is formed once, and a largest
    // |error| is the infinity norm: the same numbers as comparing float64 copies of everything,
    // with a third of the passes over float64 tensors (outputs of 400 MB make 1.6 GB ones).
    const bool complex_out = c.is_complex();
    const at::Tensor cn = complex_out ? c.to(at::kDouble) : c;
    const at::Tensor on = complex_out ? o.to(at::kDouble) : o;
    const at::Tensor fd = ref[k].to(at::kDouble);
    const at::Tensor nan_diff = at::isnan(cn).ne(at::isnan(on));
    if (nan_diff.any().item<bool>()) {
      const int64_t i = first_true(nan_diff);
      return Failure{"nan_inf_positions", out + "NaN positions differ from PyTorch's (first at " +
                                              index_text(i, c.sizes()) + ": " + element_text(c, i) + " vs " +
                                              element_text(o, i) + ")"};
    }
    const at::Tensor inf_o = at::isinf(on);
    const at::Tensor inf_diff = at::logical_or(at::isinf(cn).ne(inf_o), at::logical_and(inf_o, cn.ne(on)));
    if (inf_diff.any().item<bool>()) {
      const int64_t i = first_true(inf_diff);
      return Failure{"nan_inf_positions", out + "Inf positions or signs differ from PyTorch's (first at " +
                                              index_text(i, c.sizes()) + ": " + element_text(c, i) + " vs " +
                                              element_text(o, i) + ")"};
    }
    // Compared where PyTorch's output and the reference are finite; elsewhere every error is 0.
    const at::Tensor outside = at::logical_not(at::logical_and(at::isfinite(on), at::isfinite(fd)));
    const at::Tensor fz = fd.masked_fill(outside, 0.0);
    const at::Tensor err_c = at::sub(cn.to(at::kDouble), fz).masked_fill_(outside, 0.0);
    const at::Tensor err_o = at::sub(on.to(at::kDouble), fz).masked_fill_(outside, 0.0);
    constexpr double kInf = std::numeric_limits<double>::infinity();
    const double ref_norm = fz.norm().item<double>();
    const double scale = ref_norm > 0 ? ref_norm : 1.0;
    ErrorMeasures cand{at::linalg_vector_norm(err_c, kInf).item<double>(), err_c.norm().item<double>() / scale,
                       at::linalg_vector_norm(fz, kInf).item<double>()};
    ErrorMeasures torch{at::linalg_vector_norm(err_o, kInf).item<double>(), err_o.norm().item<double>() / scale,
                        cand.ref_max};
    VerifyOutcome& v = out_.outcome;
    v.max_abs_error = std::max(v.max_abs_error, cand.max_abs);
    v.rel_error = std::max(v.rel_error, cand.rel_l2);
    v.torch_max_abs_error = std::max(v.torch_max_abs_error, torch.max_abs);
    v.torch_rel_error = std::max(v.torch_rel_error, torch.rel_l2);
    const DType dt = c.is_complex() ? DType::kFloat32 : r_.plan->outputs[k].dtype;
    const AccuracyVerdict verdict = judge_accuracy(cand, torch, dt);
    if (!verdict.passed) {
      const int64_t i = err_c.abs().reshape({-1}).argmax().item<int64_t>();
      return Failure{"accuracy", out + verdict.detail + "; worst at " + index_text(i, c.sizes()) + ": candidate " +
                                     element_text(c, i) + ", PyTorch " + element_text(o, i) + ", float64 reference " +
                                     element_text(fd, i)};
    }
  }
  profile_.end(VerifyProfile::kAccuracy, device_);
  return std::nullopt;
}

}  // namespace

std::vector<at::Tensor> call_op(const c10::OperatorHandle& op, torch::jit::Stack stack) {
  op.callBoxed(&stack);
  std::vector<at::Tensor> out;
  for (const c10::IValue& v : stack) {
    if (!v.isTensor()) throw std::runtime_error("the operator returned a non-tensor value");
    out.push_back(v.toTensor());
  }
  return out;
}

VerifyRun verify(EvalDevice& device, const LoadedCandidate& candidate, const VerifyRequest& request) {
  VerifyRun run;
  VerifyOutcome& v = run.outcome;
  const std::vector<TrialPlan> trials = plan_trials(request);
  TrialRunner runner(device, candidate, request, run);
  std::string names;
  for (size_t i = 0; i < trials.size(); ++i) {
    names += (i ? ", " : "") + trials[i].label;
  }
  v.checks = std::to_string(trials.size()) + " trials (" + names + ") x " +
             std::to_string(2 + std::max<uint32_t>(1, request.policy.determinism_runs)) +
             " runs: layout, launch, bounds, inputs, written, " + (device.is_cuda() ? "async, " : "") +
             "determinism, uninitialized, stale, nan/inf, accuracy";
  for (size_t i = 0; i < trials.size(); ++i) {
    ++v.trials_run;
    std::optional<Failure> f;
    try {
      f = runner.run(trials[i], i);
    } catch (const std::exception& e) {
      // A torch error in the middle of a trial: the candidate's doing if it broke the context.
      (void)device.synchronize();
      if (device.context_lost()) {
        run.fault = true;
        f = Failure{"launch", std::string("the CUDA context is lost: ") + e.what()};
      } else {
        run.worker_error = std::string("verification failed inside the worker: ") + std::string(e.what()).substr(0, 400);
        f = Failure{"worker", run.worker_error};
      }
    }
    if (f) {
      v.failed_check = f->check;
      v.trial = trials[i].label;
      v.detail = f->detail;
      return run;
    }
    ++v.trials_passed;
  }
  if (request.profile) {
    const VerifyProfile& p = runner.profile();
    std::fprintf(stderr,
                 "kforge-worker: verify profile (KFORGE_WORKER_PROFILE): %s, %u trials passed: inputs %.1f ms, "
                 "PyTorch and float64 reference %.1f ms, candidate runs and their checks %.1f ms, accuracy %.1f ms\n",
                 request.signature->to_string().c_str(), v.trials_passed, p.ms[VerifyProfile::kInputs],
                 p.ms[VerifyProfile::kReference], p.ms[VerifyProfile::kRuns], p.ms[VerifyProfile::kAccuracy]);
  }
  return run;
}

}  // namespace kforge::eval
