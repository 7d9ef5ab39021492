#include "runtime/op_signature.h"

#include <xxhash.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstring>

#include "runtime/msgpack_codec.h"

namespace kforge {

// Note [Canonical signature encoding]
// A signature is one msgpack array, arrays only (no maps, so no key order to agree on):
//   [1 (encoding version), op, overload, [arg...], [backend, arch]]
// and each arg is [kind, payload...]:
//   none        [0]
//   tensor      [1, dtype, device, [sizes...], [strides...], alignment (1..16, a power of 2)]
//   tensor list [2, [[dtype, device, [sizes...], [strides...], alignment]...]]
//   bool        [3, b]        int     [4, i]       float  [5, f64]
//   string      [6, s]        int list [7, [i...]]
// msgpack-c packs every integer in its smallest form and we pack every float as float64 with all
// NaNs made one NaN, so one signature has exactly one encoding. The id is XXH3-128 of those bytes.
// Changing any of this changes every id: bump the encoding version and the cache format version.

namespace {

constexpr uint8_t kEncodingVersion = 1;
enum ArgKind : uint8_t { kNone = 0, kTensor = 1, kTensorList = 2, kBool = 3, kInt = 4, kFloat = 5,
                         kString = 6, kIntList = 7 };

constexpr size_t kMaxArgs = 64;
constexpr size_t kMaxNameLen = 256;
constexpr size_t kMaxListLen = 256;
constexpr size_t kMaxStringArg = 1024;
constexpr size_t kMaxEncodedBytes = 64u << 10;

constexpr std::array<std::string_view, kDTypeCount> kDTypeNames = {
    "float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64",
    "bool", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2"};
constexpr std::array<int, kDTypeCount> kDTypeSizes = {4, 8, 2, 2, 1, 1, 2, 4, 8, 1, 8, 16, 1, 1};

void pack_tensor_body(codec::Packer& pk, const TensorMeta& t) {
  pk.pack(static_cast<uint8_t>(t.dtype));
  pk.pack(static_cast<uint8_t>(t.device));
  pk.pack_array(static_cast<uint32_t>(t.sizes.size()));
  for (int64_t s : t.sizes) pk.pack(s);
  pk.pack_array(static_cast<uint32_t>(t.strides.size()));
  for (int64_t s : t.strides) pk.pack(s);
  pk.pack(t.alignment);
}

Status read_int_list(const codec::Reader& r, size_t max_len, std::vector<int64_t>* out) {
  KFORGE_ASSIGN_OR_RETURN(size_t n, r.array_size());
  if (n > max_len) return r.error("list of " + std::to_string(n) + " exceeds " + std::to_string(max_len));
  out->clear();
  out->reserve(n);
  for (size_t i = 0; i < n; ++i) {
    KFORGE_ASSIGN_OR_RETURN(int64_t v, r.at(i).i64());
    out->push_back(v);
  }
  return Status();
}

// Reads the 5 fields of a tensor starting at element `first` of array reader `r`.
StatusOr<TensorMeta> read_tensor_body(const codec::Reader& r, size_t first) {
  TensorMeta t;
  KFORGE_ASSIGN_OR_RETURN(int64_t dt, r.field(first, "dtype").i64_in(0, kDTypeCount - 1));
  t.dtype = static_cast<DType>(dt);
  KFORGE_ASSIGN_OR_RETURN(int64_t dev, r.field(first + 1, "device").i64_in(0, 1));
  t.device = static_cast<DeviceType>(dev);
  KFORGE_RETURN_IF_ERROR(read_int_list(r.field(first + 2, "sizes"), kMaxTensorRank, &t.sizes));
  KFORGE_RETURN_IF_ERROR(read_int_list(r.field(first + 3, "strides"), kMaxTensorRank, &t.strides));
  if (t.sizes.size() != t.strides.size()) {
    return r.error("tensor has " + std::to_string(t.sizes.size()) + " sizes but " +
                   std::to_string(t.strides.size()) + " strides");
  }
  for (size_t d = 0; d < t.sizes.size(); ++d) {
    if (t.sizes[d] < 0) return r.field(first + 2, "sizes").at(d).error("negative size");
  }
  if (t.numel() < 0) return r.error("tensor's element count overflows int64");
  KFORGE_ASSIGN_OR_RETURN(int64_t align, r.field(first + 4, "alignment").i64_in(1, kMaxAlignment));
  if (!std::has_single_bit(static_cast<uint64_t>(align))) return r.field(first + 4, "alignment").error("alignment is not a power of two");
  t.alignment = static_cast<uint32_t>(align);
  return t;
}

StatusOr<Arg> read_arg(const codec::Reader& r) {
  KFORGE_ASSIGN_OR_RETURN(size_t n, r.array_size());
  if (n == 0) return r.error("empty argument");
  KFORGE_ASSIGN_OR_RETURN(int64_t kind, r.field(0, "kind").i64_in(0, kIntList));
  auto want = [&](size_t k) { return r.expect_array(k); };
  switch (static_cast<ArgKind>(kind)) {
    case kNone:
      KFORGE_RETURN_IF_ERROR(want(1));
      return Arg::none();
    case kTensor: {
      KFORGE_RETURN_IF_ERROR(want(6));
      KFORGE_ASSIGN_OR_RETURN(TensorMeta t, read_tensor_body(r, 1));
      return Arg::tensor(std::move(t));
    }
    case kTensorList: {
      KFORGE_RETURN_IF_ERROR(want(2));
      codec::Reader list = r.at(1);
      KFORGE_ASSIGN_OR_RETURN(size_t m, list.array_size());
      if (m > kMaxListLen) return list.error("tensor list of " + std::to_string(m) + " exceeds " + std::to_string(kMaxListLen));
      std::vector<TensorMeta> ts;
      ts.reserve(m);
      for (size_t i = 0; i < m; ++i) {
        codec::Reader e = list.at(i);
        KFORGE_RETURN_IF_ERROR(e.expect_array(5));
        KFORGE_ASSIGN_OR_RETURN(TensorMeta t, read_tensor_body(e, 0));
        ts.push_back(std::move(t));
      }
      return Arg::tensor_list(std::move(ts));
    }
    case kBool: {
      KFORGE_RETURN_IF_ERROR(want(2));
      KFORGE_ASSIGN_OR_RETURN(bool b, r.at(1).boolean());
      return Arg::boolean(b);
    }
    case kInt: {
      KFORGE_RETURN_IF_ERROR(want(2));
      KFORGE_ASSIGN_OR_RETURN(int64_t i, r.at(1).i64());
      return Arg::integer(i);
    }
    case kFloat: {
      KFORGE_RETURN_IF_ERROR(want(2));
      // Only float64 is canonical; an integer here would re-encode differently.
      if (r.at(1).object().type != msgpack::type::FLOAT64) return r.at(1).error("expected float64");
      KFORGE_ASSIGN_OR_RETURN(double d, r.at(1).f64());
      if (std::isnan(d)) d = std::numeric_limits<double>::quiet_NaN();
      return Arg::real(d);
    }
    case kString: {
      KFORGE_RETURN_IF_ERROR(want(2));
      KFORGE_ASSIGN_OR_RETURN(std::string s, r.at(1).str(kMaxStringArg));
      return Arg::string(std::move(s));
    }
    case kIntList: {
      KFORGE_RETURN_IF_ERROR(want(2));
      std::vector<int64_t> v;
      KFORGE_RETURN_IF_ERROR(read_int_list(r.at(1), kMaxListLen, &v));
      return Arg::int_list(std::move(v));
    }
  }
  return r.error("unknown argument kind");
}

void append_tensor(std::string& out, const TensorMeta& t) {
  out += dtype_name(t.dtype);
  out += '[';
  for (size_t d = 0; d < t.sizes.size(); ++d) {
    if (d) out += ',';
    out += std::to_string(t.sizes[d]);
  }
  out += ']';
  if (!t.is_contiguous()) {
    out += "{strides=";
    for (size_t d = 0; d < t.strides.size(); ++d) {
      if (d) out += ',';
      out += std::to_string(t.strides[d]);
    }
    out += '}';
  }
  if (t.alignment < 16) out += "{align=" + std::to_string(t.alignment) + "}";
}

}  // namespace

std::string_view dtype_name(DType t) noexcept {
  auto i = static_cast<size_t>(t);
  return i < kDTypeNames.size() ? kDTypeNames[i] : std::string_view("invalid");
}

StatusOr<DType> dtype_from_name(std::string_view name) {
  for (size_t i = 0; i < kDTypeNames.size(); ++i) {
    if (kDTypeNames[i] == name) return static_cast<DType>(i);
  }
  return invalid_argument("unknown dtype '" + std::string(name) + "'");
}

int dtype_size_bytes(DType t) noexcept {
  auto i = static_cast<size_t>(t);
  return i < kDTypeSizes.size() ? kDTypeSizes[i] : 0;
}

std::string_view device_type_name(DeviceType d) noexcept { return d == DeviceType::kCuda ? "cuda" : "cpu"; }
std::string_view backend_name(Backend b) noexcept { return b == Backend::kCuda ? "cuda" : "cpu"; }

StatusOr<Backend> backend_from_name(std::string_view name) {
  if (name == "cpu") return Backend::kCpu;
  if (name == "cuda") return Backend::kCuda;
  return invalid_argument("unknown backend '" + std::string(name) + "' (expected cpu or cuda)");
}

int64_t TensorMeta::numel() const noexcept {
  int64_t n = 1;
  for (int64_t s : sizes) {
    if (__builtin_mul_overflow(n, s, &n)) return -1;
  }
  return n;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (size_t d = sizes.size(); d-- > 1;) strides[d - 1] = strides[d] * sizes[d];
  return strides;
}

TensorMeta contiguous_tensor(DType dtype, DeviceType device, std::vector<int64_t> sizes) {
  TensorMeta t;
  t.dtype = dtype;
  t.device = device;
  t.strides = contiguous_strides(sizes);
  t.sizes = std::move(sizes);
  return t;
}

bool TensorMeta::is_contiguous() const noexcept {
  int64_t expected = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] != 1 && strides[d] != expected) return false;
    // A layout whose extent overflows int64 cannot be contiguous (and decode rejects it anyway).
    if (__builtin_mul_overflow(expected, sizes[d], &expected)) return false;
  }
  return true;
}

bool operator==(const Arg& a, const Arg& b) {
  if (a.value.index() != b.value.index()) return false;
  if (const double* x = std::get_if<double>(&a.value)) {
    const double y = std::get<double>(b.value);
    if (std::isnan(*x) && std::isnan(y)) return true;
    return std::memcmp(x, &y, sizeof y) == 0;  // -0.0 and 0.0 are different keys, like their bytes
  }
  return a.value == b.value;
}

std::string SignatureId::hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    s[static_cast<size_t>(15 - i)] = kDigits[(hi >> (4 * i)) & 0xf];
    s[static_cast<size_t>(31 - i)] = kDigits[(lo >> (4 * i)) & 0xf];
  }
  return s;
}

StatusOr<SignatureId> SignatureId::from_hex(std::string_view hex) {
  if (hex.size() != 32) return invalid_argument("id must be 32 hex digits, got " + std::to_string(hex.size()));
  SignatureId id;
  for (size_t i = 0; i < 32; ++i) {
    char c = hex[i];
    uint64_t v;
    if (c >= '0' && c <= '9') v = static_cast<uint64_t>(c - '0');
    else if (c >= 'a' && c <= 'f') v = static_cast<uint64_t>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v = static_cast<uint64_t>(c - 'A' + 10);
    else return invalid_argument("id has a non-hex character at position " + std::to_string(i + 1));
    uint64_t& half = i < 16 ? id.hi : id.lo;
    half = (half << 4) | v;
  }
  return id;
}

SignatureId hash128(std::string_view bytes) noexcept {
  XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return SignatureId{h.high64, h.low64};
}

namespace codec {

void pack(Packer& pk, const OpSignature& sig) {
  pk.pack_array(5);
  pk.pack(kEncodingVersion);
  pk.pack(sig.op);
  pk.pack(sig.overload);
  pk.pack_array(static_cast<uint32_t>(sig.args.size()));
  for (const Arg& a : sig.args) {
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, std::monostate>) {
            pk.pack_array(1);
            pk.pack(static_cast<uint8_t>(kNone));
          } else if constexpr (std::is_same_v<V, TensorMeta>) {
            pk.pack_array(6);
            pk.pack(static_cast<uint8_t>(kTensor));
            pack_tensor_body(pk, v);
          } else if constexpr (std::is_same_v<V, std::vector<TensorMeta>>) {
            pk.pack_array(2);
            pk.pack(static_cast<uint8_t>(kTensorList));
            pk.pack_array(static_cast<uint32_t>(v.size()));
            for (const TensorMeta& t : v) {
              pk.pack_array(5);
              pack_tensor_body(pk, t);
            }
          } else if constexpr (std::is_same_v<V, bool>) {
            pk.pack_array(2);
            pk.pack(static_cast<uint8_t>(kBool));
            pk.pack(v);
          } else if constexpr (std::is_same_v<V, int64_t>) {
            pk.pack_array(2);
            pk.pack(static_cast<uint8_t>(kInt));
            pk.pack(v);
          } else if constexpr (std::is_same_v<V, double>) {
            pk.pack_array(2);
            pk.pack(static_cast<uint8_t>(kFloat));
            pk.pack_f64(v);
          } else if constexpr (std::is_same_v<V, std::string>) {
            pk.pack_array(2);
            pk.pack(static_cast<uint8_t>(kString));
            pk.pack(v);
          } else {
            static_assert(std::is_same_v<V, std::vector<int64_t>>);
            pk.pack_array(2);
            pk.pack(static_cast<uint8_t>(kIntList));
            pk.pack_array(static_cast<uint32_t>(v.size()));
            for (int64_t i : v) pk.pack(i);
          }
        },
        a.value);
  }
  pk.pack_array(2);
  pk.pack(static_cast<uint8_t>(sig.target.backend));
  pk.pack(sig.target.arch);
}

StatusOr<OpSignature> read_op_signature(const Reader& r) {
  KFORGE_RETURN_IF_ERROR(r.expect_array(5));
  KFORGE_ASSIGN_OR_RETURN(int64_t version, r.field(0, "version").i64());
  if (version != kEncodingVersion) {
    return r.field(0, "version").error("signature encoding version " + std::to_string(version) + " is not supported (expected " +
                         std::to_string(kEncodingVersion) + ")");
  }
  OpSignature sig;
  KFORGE_ASSIGN_OR_RETURN(sig.op, r.field(1, "op").str(kMaxNameLen));
  if (sig.op.empty()) return r.field(1, "op").error("empty operator name");
  KFORGE_ASSIGN_OR_RETURN(sig.overload, r.field(2, "overload").str(kMaxNameLen));
  Reader args = r.field(3, "args");
  KFORGE_ASSIGN_OR_RETURN(size_t nargs, args.array_size());
  if (nargs > kMaxArgs) return args.error(std::to_string(nargs) + " arguments exceed " + std::to_string(kMaxArgs));
  sig.args.reserve(nargs);
  for (size_t i = 0; i < nargs; ++i) {
    KFORGE_ASSIGN_OR_RETURN(Arg a, read_arg(args.at(i)));
    sig.args.push_back(std::move(a));
  }
  Reader target = r.field(4, "target");
  KFORGE_RETURN_IF_ERROR(target.expect_array(2));
  KFORGE_ASSIGN_OR_RETURN(int64_t backend, target.field(0, "backend").i64_in(0, 1));
  sig.target.backend = static_cast<Backend>(backend);
  KFORGE_ASSIGN_OR_RETURN(sig.target.arch, target.field(1, "arch").str(kMaxNameLen));
  return sig;
}

}  // namespace codec

std::string OpSignature::encode() const {
  msgpack::sbuffer buf;
  codec::Packer pk(buf);
  codec::pack(pk, *this);
  return std::string(buf.data(), buf.size());
}

StatusOr<OpSignature> OpSignature::decode(std::string_view bytes) {
  codec::Limits limits;
  limits.max_bytes = kMaxEncodedBytes;
  limits.max_array = kMaxListLen;
  limits.max_map = 0;
  limits.max_str = kMaxStringArg;
  limits.max_bin = 0;
  limits.max_depth = 8;
  KFORGE_ASSIGN_OR_RETURN(msgpack::object_handle oh, codec::parse(bytes, limits));
  KFORGE_ASSIGN_OR_RETURN(OpSignature sig, codec::read_op_signature(codec::Reader(oh.get(), "signature")));
  // Canonical form only: a signature that re-encodes differently would have two ids.
  if (sig.encode() != bytes) return invalid_argument("signature: not in canonical encoding");
  return sig;
}

SignatureId OpSignature::id() const { return hash128(encode()); }

std::string OpSignature::to_string() const {
  std::string out = op;
  if (!overload.empty()) out += "." + overload;
  out += '(';
  for (size_t i = 0; i < args.size(); ++i) {
    if (i) out += ", ";
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, std::monostate>) out += "None";
          else if constexpr (std::is_same_v<V, TensorMeta>) append_tensor(out, v);
          else if constexpr (std::is_same_v<V, std::vector<TensorMeta>>) {
            out += '[';
            for (size_t k = 0; k < v.size(); ++k) {
              if (k) out += ", ";
              append_tensor(out, v[k]);
            }
            out += ']';
          } else if constexpr (std::is_same_v<V, bool>) out += v ? "true" : "false";
          else if constexpr (std::is_same_v<V, int64_t>) out += std::to_string(v);
          else if constexpr (std::is_same_v<V, double>) {
            char buf[32];
            std::snprintf(buf, sizeof buf, "%.17g", v);
            out += buf;
          } else if constexpr (std::is_same_v<V, std::string>) out += "'" + v + "'";
          else {
            out += '[';
            for (size_t k = 0; k < v.size(); ++k) {
              if (k) out += ',';
              out += std::to_string(v[k]);
            }
            out += ']';
          }
        },
        args[i].value);
  }
  out += ") ";
  out += backend_name(target.backend);
  if (!target.arch.empty()) out += ":" + target.arch;
  return out;
}

std::map<std::string, int64_t, std::less<>> OpSignature::named_sizes() const {
  std::map<std::string, int64_t, std::less<>> m;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string idx = std::to_string(i);
    const Arg::Value& v = args[i].value;
    if (const auto* t = std::get_if<TensorMeta>(&v)) {
      m["ndim" + idx] = static_cast<int64_t>(t->sizes.size());
      m["numel" + idx] = t->numel();
      for (size_t d = 0; d < t->sizes.size(); ++d) {
        m["size" + idx + "_" + std::to_string(d)] = t->sizes[d];
        m["stride" + idx + "_" + std::to_string(d)] = t->strides[d];
      }
    } else if (const auto* b = std::get_if<bool>(&v)) {
      m["arg" + idx] = *b ? 1 : 0;
    } else if (const auto* n = std::get_if<int64_t>(&v)) {
      m["arg" + idx] = *n;
    } else if (const auto* l = std::get_if<std::vector<int64_t>>(&v)) {
      m["len" + idx] = static_cast<int64_t>(l->size());
      for (size_t k = 0; k < l->size(); ++k) m["arg" + idx + "_" + std::to_string(k)] = (*l)[k];
    }
  }
  return m;
}

}  // namespace kforge
