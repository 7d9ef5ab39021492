#include "search_daemon/worker/trial_data.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "runtime/op_catalog.h"

namespace kforge::eval {

at::ScalarType to_scalar_type(DType t) {
  switch (t) {
    case DType::kFloat32: return at::kFloat;
    case DType::kFloat64: return at::kDouble;
    case DType::kFloat16: return at::kHalf;
    case DType::kBFloat16: return at::kBFloat16;
    case DType::kInt8: return at::kChar;
    case DType::kUInt8: return at::kByte;
    case DType::kInt16: return at::kShort;
    case DType::kInt32: return at::kInt;
    case DType::kInt64: return at::kLong;
    case DType::kBool: return at::kBool;
    case DType::kComplex64: return at::kComplexFloat;
    case DType::kComplex128: return at::kComplexDouble;
    case DType::kFloat8E4M3FN: return at::kFloat8_e4m3fn;
    case DType::kFloat8E5M2: return at::kFloat8_e5m2;
  }
  return at::kFloat;
}

bool is_floating(DType t) {
  switch (t) {
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E5M2:
      return true;
    default:
      return false;
  }
}

at::ScalarType bits_type(at::ScalarType t) {
  switch (c10::elementSize(t)) {
    case 1: return at::kByte;
    case 2: return at::kShort;
    case 4: return at::kInt;
    default: return at::kLong;
  }
}

int64_t poison_bits(at::ScalarType t) {
  // Signaling NaNs (quiet bit clear): IEEE arithmetic only ever produces quiet NaNs, so these bits
  // in an output mean nobody wrote the element.
  switch (t) {
    case at::kFloat: return static_cast<int32_t>(0x7FA5A5A5u);
    case at::kDouble: return static_cast<int64_t>(0x7FF4A5A5A5A5A5A5ull);
    case at::kHalf: return static_cast<int16_t>(0x7DA5);
    case at::kBFloat16: return static_cast<int16_t>(0x7FA5);
    case at::kFloat8_e4m3fn: return 0x7F;   // its only NaN
    case at::kFloat8_e5m2: return 0x7D;
    case at::kComplexFloat: return static_cast<int64_t>(0x7FA5A5A57FA5A5A5ull);
    default:
      switch (c10::elementSize(t)) {
        case 1: return 0xA5;
        case 2: return static_cast<int16_t>(0xA5A5);
        case 4: return static_cast<int32_t>(0xA5A5A5A5u);
        default: return static_cast<int64_t>(0xA5A5A5A5A5A5A5A5ull);
      }
  }
}

const char* distribution_name(Distribution d) {
  switch (d) {
    case Distribution::kNormal: return "normal";
    case Distribution::kUniform: return "uniform";
    case Distribution::kLarge: return "large";
    case Distribution::kOffset: return "offset";
    case Distribution::kZeros: return "zeros";
    case Distribution::kObserved: return "observed";
    case Distribution::kCaptured: return "captured";
  }
  return "?";
}

int64_t span_bytes(const TensorMeta& m) {
  int64_t last = 0;
  for (size_t d = 0; d < m.sizes.size(); ++d) {
    if (m.sizes[d] == 0) return 0;
    last += (m.sizes[d] - 1) * m.strides[d];
  }
  return (last + 1) * dtype_size_bytes(m.dtype);
}

// ---- GuardedBuffer --------------------------------------------------------------------------------

GuardedBuffer GuardedBuffer::make(at::Device device, int64_t data_bytes, int64_t misalign, Guard guard,
                                  at::ScalarType nan_dtype) {
  GuardedBuffer b;
  b.data_bytes_ = data_bytes;
  b.offset_ = kGuardBytes + misalign;
  const int64_t total = kGuardBytes + 64 + (data_bytes + 63) / 64 * 64 + kGuardBytes;
  b.bytes_ = at::empty({total}, at::TensorOptions().dtype(at::kByte).device(device));
  if (guard == Guard::kNaN) {
    // total is a multiple of 64, so of every element size: the whole buffer as NaNs of the dtype.
    b.bytes_.view(nan_dtype).fill_(std::numeric_limits<double>::quiet_NaN());
  } else {
    b.bytes_.fill_(kGuardByte);
  }
  return b;
}

void* GuardedBuffer::data() const { return static_cast<uint8_t*>(bytes_.data_ptr()) + offset_; }

at::Tensor GuardedBuffer::view(at::ScalarType t, at::IntArrayRef sizes, at::IntArrayRef strides) const {
  const int64_t elem = static_cast<int64_t>(c10::elementSize(t));
  // offset_ is a multiple of the element size (TrialInputs and the verifier check the alignment).
  return bytes_.view(t).as_strided(sizes, strides, offset_ / elem);
}

at::Tensor GuardedBuffer::data_region() const { return bytes_.narrow(0, offset_, data_bytes_); }

void GuardedBuffer::fill_data(uint8_t byte) const {
  if (data_bytes_ > 0) data_region().fill_(static_cast<int64_t>(byte));
}

std::string GuardedBuffer::guard_damage() const {
  const int64_t total = bytes_.numel();
  const at::Tensor before = bytes_.narrow(0, 0, offset_);
  const at::Tensor after = bytes_.narrow(0, offset_ + data_bytes_, total - offset_ - data_bytes_);
  std::string out;
  const at::Tensor bad_before = at::nonzero(before.ne(static_cast<int64_t>(kGuardByte))).cpu();
  if (bad_before.numel() > 0) {
    const int64_t farthest = offset_ - bad_before[0][0].item<int64_t>();
    out = std::to_string(bad_before.size(0)) + " bytes written before the start (as far as " +
          std::to_string(farthest) + " bytes before it)";
  }
  const at::Tensor bad_after = at::nonzero(after.ne(static_cast<int64_t>(kGuardByte))).cpu();
  if (bad_after.numel() > 0) {
    const int64_t first = bad_after[0][0].item<int64_t>();
    const int64_t last = bad_after[bad_after.size(0) - 1][0].item<int64_t>();
    if (!out.empty()) out += "; ";
    out += std::to_string(bad_after.size(0)) + " bytes written after the end (from " + std::to_string(first) +
           " to " + std::to_string(last) + " bytes past it)";
  }
  return out;
}

// ---- TrialInputs ------------------------------------------------------------------------------------

namespace {

// Scale of kLarge and mean of kOffset per dtype: large enough that exp() overflows without a max
// subtraction and one-pass variances cancel, small enough that the dtype holds the values.
double large_scale(DType t) { return t == DType::kFloat16 ? 1e3 : (t == DType::kFloat8E4M3FN || t == DType::kFloat8E5M2) ? 1e2 : 1e4; }
double offset_mean(DType t) { return (t == DType::kFloat16 || t == DType::kBFloat16) ? 1e2 : 1e3; }

// n floating values of `dist` on `device` (float32, or float64 for float64 tensors), from the
// default generators seeded by the caller.
at::Tensor draw(Distribution dist, int64_t n, DType dtype, at::Device device, const wire::InputStats* stats) {
  const at::ScalarType gen_type = dtype == DType::kFloat64 ? at::kDouble : at::kFloat;
  const at::TensorOptions o = at::TensorOptions().dtype(gen_type).device(device);
  switch (dist) {
    case Distribution::kUniform: return at::rand({n}, o).mul_(6).sub_(3);
    case Distribution::kLarge: return at::randn({n}, o).mul_(large_scale(dtype));
    case Distribution::kOffset: return at::randn({n}, o).add_(offset_mean(dtype));
    case Distribution::kZeros: return at::zeros({n}, o);
    case Distribution::kObserved:
      if (stats != nullptr) {
        const double mean = std::isfinite(stats->mean) ? stats->mean : 0;
        const double sd = std::isfinite(stats->stddev) && stats->stddev > 0 ? stats->stddev : 1;
        at::Tensor v = at::randn({n}, o).mul_(sd).add_(mean);
        if (std::isfinite(stats->min) && std::isfinite(stats->max) && stats->min <= stats->max) {
          v.clamp_(stats->min, stats->max);
        }
        if (stats->zero_fraction > 0) {
          v.masked_fill_(at::rand({n}, o).lt(std::min(stats->zero_fraction, 1.0)), 0);
        }
        // NaN and Inf where the process had them: at least one of each kind it saw, at the first
        // positions, so the candidate must propagate them exactly as PyTorch does.
        int64_t pos = 0;
        if (stats->nan_count > 0 && pos < n) v.narrow(0, pos++, 1).fill_(std::numeric_limits<double>::quiet_NaN());
        if (stats->inf_count > 0 && pos < n) v.narrow(0, pos++, 1).fill_(std::numeric_limits<double>::infinity());
        if (stats->inf_count > 1 && pos < n) v.narrow(0, pos++, 1).fill_(-std::numeric_limits<double>::infinity());
        return v;
      }
      return at::randn({n}, o);
    case Distribution::kNormal:
    case Distribution::kCaptured:
      return at::randn({n}, o);
  }
  return at::randn({n}, o);
}

// The catalog's input range (runtime/op_catalog.h) on values drawn for any: what a variance, a
// probability or an index must be for the operator's result to mean anything. NaN and Inf the
// distribution put there go too: such an argument never legitimately holds them.
at::Tensor within_range(at::Tensor v, catalog::InputRange range) {
  constexpr double kBig = 1e4;
  switch (range) {
    case catalog::InputRange::kAny:
    case catalog::InputRange::kIndex:
      return v;
    case catalog::InputRange::kPositive: return at::nan_to_num(v.abs(), 1.0, kBig, kBig).add_(1e-3);
    case catalog::InputRange::kNonNegative: return at::nan_to_num(v.abs(), 0.0, kBig, kBig);
    case catalog::InputRange::kProbability: return at::rand_like(v);
  }
  return v;
}

StatusOr<TrialArg> make_tensor_arg(const TensorMeta& m, const std::string& where, at::Device worker_device,
                                   Distribution dist, const wire::InputStats* stats,
                                   const wire::CapturedTensor* captured, catalog::InputRange range,
                                   int64_t index_bound) {
  const at::ScalarType st = to_scalar_type(m.dtype);
  const int64_t elem = dtype_size_bytes(m.dtype);
  const int64_t misalign = m.alignment < kMaxAlignment ? m.alignment : 0;
  if (misalign % elem != 0) {
    return invalid_argument(where + ": pointer alignment " + std::to_string(m.alignment) +
                            " bytes is below the element size " + std::to_string(elem));
  }
  const at::Device device = m.device == DeviceType::kCuda ? worker_device : at::Device(at::kCPU);
  if (m.device == DeviceType::kCuda && !worker_device.is_cuda()) {
    return invalid_argument(where + ": a CUDA tensor, but this worker runs on the CPU");
  }
  const int64_t span = span_bytes(m);
  TrialArg a;
  GuardedBuffer buf = GuardedBuffer::make(
      device, span, misalign, is_floating(m.dtype) ? GuardedBuffer::Guard::kNaN : GuardedBuffer::Guard::kCanary, st);
  if (span > 0) {
    at::Tensor flat = buf.data_region().view(st);
    const int64_t n = span / elem;
    if (range == catalog::InputRange::kIndex) {
      flat.copy_(at::randint(0, std::max<int64_t>(index_bound, 1), {n}, at::TensorOptions().dtype(at::kLong).device(device)));
    } else if (is_floating(m.dtype)) {
      flat.copy_(within_range(draw(dist, n, m.dtype, device, stats), range));
    } else if (m.dtype == DType::kBool) {
      flat.copy_(at::randint(0, 2, {n}, at::TensorOptions().dtype(at::kLong).device(device)).to(at::kBool));
    } else if (m.dtype == DType::kComplex64 || m.dtype == DType::kComplex128) {
      at::view_as_real(flat).copy_(at::randn({n, 2}, at::TensorOptions().dtype(at::kDouble).device(device)));
    } else {
      flat.copy_(at::randint(0, 10, {n}, at::TensorOptions().dtype(at::kLong).device(device)));
    }
  }
  at::Tensor view = buf.view(st, m.sizes, m.strides);
  if (captured != nullptr) {
    if (captured->dtype != m.dtype || captured->sizes != m.sizes) {
      return invalid_argument(where + ": the captured tensor is " + std::string(dtype_name(captured->dtype)) +
                              " with other sizes than the signature's");
    }
    at::Tensor host = at::empty(m.sizes, at::TensorOptions().dtype(st));
    if (static_cast<int64_t>(captured->bytes.size()) != host.numel() * elem) {
      return invalid_argument(where + ": the captured tensor has " + std::to_string(captured->bytes.size()) +
                              " bytes, expected " + std::to_string(host.numel() * elem));
    }
    if (!captured->bytes.empty()) std::memcpy(host.data_ptr(), captured->bytes.data(), captured->bytes.size());
    view.copy_(host);
  }
  a.value = view;
  a.tensors.push_back(view);
  a.buffers.push_back(std::move(buf));
  return a;
}

}  // namespace

StatusOr<TrialInputs> TrialInputs::make(const OpSignature& sig, at::Device device, Distribution dist, uint64_t seed,
                                        const std::vector<wire::InputStats>& stats,
                                        const wire::CapturedInputs* captured) {
  at::manual_seed(seed);
  TrialInputs in;
  in.args_.reserve(sig.args.size());
  const catalog::OpEntry* op = catalog::find(sig);
  for (size_t i = 0; i < sig.args.size(); ++i) {
    // The catalog's range for the argument, and an index's bound: another argument's dimension.
    const catalog::ArgDecl* decl = op != nullptr && i < op->args.size() ? &op->args[i] : nullptr;
    const catalog::InputRange range = decl != nullptr ? decl->range : catalog::InputRange::kAny;
    int64_t index_bound = 0;
    if (range == catalog::InputRange::kIndex) {
      const auto* bound = static_cast<size_t>(decl->index_arg) < sig.args.size()
                              ? std::get_if<TensorMeta>(&sig.args[static_cast<size_t>(decl->index_arg)].value)
                              : nullptr;
      if (bound != nullptr && static_cast<size_t>(decl->index_dim) < bound->sizes.size()) {
        index_bound = bound->sizes[static_cast<size_t>(decl->index_dim)];
      }
    }
    const std::string where = "argument " + std::to_string(i);
    const Arg::Value& v = sig.args[i].value;
    const wire::InputStats* st = nullptr;
    for (const wire::InputStats& s : stats) {
      if (s.arg_index == i) st = &s;
    }
    const wire::CapturedTensor* cap = nullptr;
    if (captured != nullptr) {
      for (const wire::CapturedTensor& t : captured->tensors) {
        if (t.arg_index == i) cap = &t;
      }
    }
    TrialArg a;
    if (std::holds_alternative<std::monostate>(v)) {
      a.value = c10::IValue();
    } else if (const auto* m = std::get_if<TensorMeta>(&v)) {
      KFORGE_ASSIGN_OR_RETURN(a, make_tensor_arg(*m, where, device, dist, st, cap, range, index_bound));
    } else if (const auto* list = std::get_if<std::vector<TensorMeta>>(&v)) {
      c10::List<at::Tensor> tensors;
      for (size_t k = 0; k < list->size(); ++k) {
        KFORGE_ASSIGN_OR_RETURN(TrialArg t, make_tensor_arg((*list)[k], where + "[" + std::to_string(k) + "]", device,
                                                           dist, st, nullptr, range, index_bound));
        tensors.push_back(t.tensors[0]);
        a.tensors.push_back(t.tensors[0]);
        a.buffers.push_back(std::move(t.buffers[0]));
      }
      a.value = c10::IValue(std::move(tensors));
    } else if (const auto* b = std::get_if<bool>(&v)) {
      a.value = c10::IValue(*b);
    } else if (const auto* n = std::get_if<int64_t>(&v)) {
      a.value = c10::IValue(*n);
    } else if (const auto* d = std::get_if<double>(&v)) {
      a.value = c10::IValue(*d);
    } else if (const auto* s = std::get_if<std::string>(&v)) {
      a.value = c10::IValue(*s);
    } else if (const auto* ints = std::get_if<std::vector<int64_t>>(&v)) {
      a.value = c10::IValue(c10::List<int64_t>(*ints));
    }
    in.args_.push_back(std::move(a));
  }
  return in;
}

torch::jit::Stack TrialInputs::stack() const {
  torch::jit::Stack s;
  s.reserve(args_.size());
  for (const TrialArg& a : args_) s.push_back(a.value);
  return s;
}

torch::jit::Stack TrialInputs::stack_float64() const {
  torch::jit::Stack s;
  s.reserve(args_.size());
  for (const TrialArg& a : args_) {
    if (a.value.isTensor() && at::isFloatingType(a.value.toTensor().scalar_type())) {
      s.emplace_back(a.value.toTensor().to(at::kDouble));
    } else if (a.value.isTensorList()) {
      c10::List<at::Tensor> converted;
      for (const at::Tensor& t : a.tensors) {
        converted.push_back(at::isFloatingType(t.scalar_type()) ? t.to(at::kDouble) : t);
      }
      s.emplace_back(std::move(converted));
    } else {
      s.push_back(a.value);
    }
  }
  return s;
}

std::vector<void*> TrialInputs::tensor_pointers() const {
  std::vector<void*> p(args_.size(), nullptr);
  for (size_t i = 0; i < args_.size(); ++i) {
    if (args_[i].value.isTensor()) p[i] = args_[i].buffers[0].data();
  }
  // Then every tensor list's elements, in argument order (Note [List inputs] in kernel_spec.cc).
  for (const TrialArg& a : args_) {
    if (!a.value.isTensorList()) continue;
    for (const GuardedBuffer& b : a.buffers) p.push_back(b.data());
  }
  return p;
}

std::vector<at::Tensor> TrialInputs::snapshot() const {
  std::vector<at::Tensor> out;
  for (const TrialArg& a : args_) {
    for (const GuardedBuffer& b : a.buffers) out.push_back(b.whole().clone());
  }
  return out;
}

std::string TrialInputs::changes_since(const std::vector<at::Tensor>& before, bool* in_guards,
                                       const std::vector<bool>* written_in_place) const {
  size_t k = 0;
  *in_guards = false;
  for (size_t i = 0; i < args_.size(); ++i) {
    const bool written = written_in_place != nullptr && i < written_in_place->size() && (*written_in_place)[i];
    for (size_t j = 0; j < args_[i].buffers.size(); ++j, ++k) {
      const GuardedBuffer& b = args_[i].buffers[j];
      if (k >= before.size() || at::equal(b.whole(), before[k])) continue;
      const int64_t start = static_cast<uint8_t*>(b.data()) - static_cast<uint8_t*>(b.whole().data_ptr());
      at::Tensor diff = b.whole().ne(before[k]);
      if (written) {   // its data region is the output's: only the guards count
        diff.narrow(0, start, b.data_bytes()).fill_(false);
        if (!diff.any().item<bool>()) continue;
      }
      const at::Tensor changed = at::nonzero(diff).cpu();
      const int64_t first = changed[0][0].item<int64_t>();
      const std::string which = "input " + std::to_string(i) + (args_[i].buffers.size() > 1 ? "[" + std::to_string(j) + "]" : "");
      if (first < start || first >= start + b.data_bytes()) {
        *in_guards = true;
        return which + ": " + std::to_string(changed.size(0)) + " bytes written outside the tensor (first at byte " +
               std::to_string(first - start) + " relative to its start)";
      }
      return which + ": " + std::to_string(changed.size(0)) + " bytes changed (first at byte " +
             std::to_string(first - start) + " of " + std::to_string(b.data_bytes()) + ")";
    }
  }
  return {};
}

int64_t TrialInputs::data_bytes() const {
  int64_t n = 0;
  for (const TrialArg& a : args_) {
    for (const GuardedBuffer& b : a.buffers) n += b.data_bytes();
  }
  return n;
}

}  // namespace kforge::eval
