#include "runtime/msgpack_codec.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace kforge::codec {

StatusOr<msgpack::object_handle> parse(std::string_view bytes, const Limits& limits) {
  if (bytes.size() > limits.max_bytes) {
    return out_of_range("message of " + std::to_string(bytes.size()) + " bytes exceeds the limit of " +
                        std::to_string(limits.max_bytes));
  }
  if (bytes.empty()) return invalid_argument("empty message");
  // msgpack-c reports malformed input by throwing; nothing escapes this function.
  try {
    size_t offset = 0;
    msgpack::unpack_limit lim(limits.max_array, limits.max_map, limits.max_str, limits.max_bin,
                              /*ext=*/0, limits.max_depth);
    msgpack::object_handle oh =
        msgpack::unpack(bytes.data(), bytes.size(), offset, nullptr, nullptr, lim);
    if (offset != bytes.size()) {
      return invalid_argument(std::to_string(bytes.size() - offset) +
                              " trailing bytes after the message at offset " + std::to_string(offset));
    }
    return oh;
  } catch (const msgpack::insufficient_bytes&) {
    return invalid_argument("truncated message (" + std::to_string(bytes.size()) + " bytes)");
  } catch (const msgpack::ext_size_overflow&) {
    return invalid_argument("msgpack ext values are not part of any kforge format");
  } catch (const msgpack::depth_size_overflow&) {
    return out_of_range("message nesting exceeds depth " + std::to_string(limits.max_depth));
  } catch (const msgpack::size_overflow& e) {
    return out_of_range(std::string("message exceeds a size limit: ") + e.what());
  } catch (const std::exception& e) {
    return invalid_argument(std::string("malformed msgpack: ") + e.what());
  }
}

std::string_view type_name(msgpack::type::object_type t) noexcept {
  switch (t) {
    case msgpack::type::NIL: return "nil";
    case msgpack::type::BOOLEAN: return "bool";
    case msgpack::type::POSITIVE_INTEGER:
    case msgpack::type::NEGATIVE_INTEGER: return "integer";
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: return "float";
    case msgpack::type::STR: return "string";
    case msgpack::type::BIN: return "binary";
    case msgpack::type::ARRAY: return "array";
    case msgpack::type::MAP: return "map";
    case msgpack::type::EXT: return "ext";
  }
  return "unknown";
}

Status Reader::error(std::string_view what) const {
  return invalid_argument((path_.empty() ? std::string("message") : path_) + ": " + std::string(what));
}

StatusOr<size_t> Reader::array_size() const {
  if (obj_->type != msgpack::type::ARRAY) {
    return error("expected array, got " + std::string(type_name(obj_->type)));
  }
  return static_cast<size_t>(obj_->via.array.size);
}

Status Reader::expect_array(size_t n) const { return expect_array(n, n); }

Status Reader::expect_array(size_t lo, size_t hi) const {
  auto n = array_size();
  if (!n.ok()) return n.status();
  if (*n < lo || *n > hi) {
    std::string want = lo == hi ? std::to_string(lo) : std::to_string(lo) + ".." + std::to_string(hi);
    return error("expected " + want + " elements, got " + std::to_string(*n));
  }
  return Status();
}

Reader Reader::at(size_t i) const {
  return Reader(obj_->via.array.ptr[i], path_ + "[" + std::to_string(i) + "]");
}

Reader Reader::field(size_t i, std::string_view name) const {
  return Reader(obj_->via.array.ptr[i], path_ + "." + std::string(name));
}

StatusOr<int64_t> Reader::i64() const {
  if (obj_->type == msgpack::type::POSITIVE_INTEGER) {
    if (obj_->via.u64 > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return error("integer " + std::to_string(obj_->via.u64) + " does not fit in int64");
    }
    return static_cast<int64_t>(obj_->via.u64);
  }
  if (obj_->type == msgpack::type::NEGATIVE_INTEGER) return obj_->via.i64;
  return error("expected integer, got " + std::string(type_name(obj_->type)));
}

StatusOr<uint64_t> Reader::u64() const {
  if (obj_->type == msgpack::type::POSITIVE_INTEGER) return obj_->via.u64;
  if (obj_->type == msgpack::type::NEGATIVE_INTEGER) return error("expected unsigned integer, got negative");
  return error("expected unsigned integer, got " + std::string(type_name(obj_->type)));
}

StatusOr<int64_t> Reader::i64_in(int64_t lo, int64_t hi) const {
  auto v = i64();
  if (!v.ok()) return v;
  if (*v < lo || *v > hi) {
    return error("value " + std::to_string(*v) + " outside [" + std::to_string(lo) + ", " +
                 std::to_string(hi) + "]");
  }
  return v;
}

StatusOr<double> Reader::f64() const {
  switch (obj_->type) {
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: return obj_->via.f64;
    case msgpack::type::POSITIVE_INTEGER: return static_cast<double>(obj_->via.u64);
    case msgpack::type::NEGATIVE_INTEGER: return static_cast<double>(obj_->via.i64);
    default: return error("expected float, got " + std::string(type_name(obj_->type)));
  }
}

StatusOr<bool> Reader::boolean() const {
  if (obj_->type != msgpack::type::BOOLEAN) {
    return error("expected bool, got " + std::string(type_name(obj_->type)));
  }
  return obj_->via.boolean;
}

StatusOr<std::string> Reader::str(size_t max_len) const {
  if (obj_->type != msgpack::type::STR) {
    return error("expected string, got " + std::string(type_name(obj_->type)));
  }
  if (obj_->via.str.size > max_len) {
    return error("string of " + std::to_string(obj_->via.str.size) + " bytes exceeds " +
                 std::to_string(max_len));
  }
  return std::string(obj_->via.str.ptr, obj_->via.str.size);
}

StatusOr<std::string> Reader::bin(size_t max_len) const {
  if (obj_->type == msgpack::type::STR) return str(max_len);
  if (obj_->type != msgpack::type::BIN) {
    return error("expected binary, got " + std::string(type_name(obj_->type)));
  }
  if (obj_->via.bin.size > max_len) {
    return error("binary of " + std::to_string(obj_->via.bin.size) + " bytes exceeds " +
                 std::to_string(max_len));
  }
  return std::string(obj_->via.bin.ptr, obj_->via.bin.size);
}

void Packer::pack_f64(double v) {
  if (std::isnan(v)) v = std::numeric_limits<double>::quiet_NaN();
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  char out[9];
  out[0] = static_cast<char>(0xcb);
  for (int i = 0; i < 8; ++i) out[1 + i] = static_cast<char>((bits >> (56 - 8 * i)) & 0xff);
  buf_->write(out, sizeof out);
}

Status open_record(const Reader& r, size_t fields) {
  KFORGE_ASSIGN_OR_RETURN(size_t n, r.array_size());
  if (n < fields) return r.error("expected " + std::to_string(fields) + " fields, got " + std::to_string(n));
  return Status();
}

Status read_f64(const Reader& r, double* out) {
  KFORGE_ASSIGN_OR_RETURN(*out, r.f64());
  return Status();
}

Status read_bool(const Reader& r, bool* out) {
  KFORGE_ASSIGN_OR_RETURN(*out, r.boolean());
  return Status();
}

Status read_str(const Reader& r, size_t max_len, std::string* out) {
  KFORGE_ASSIGN_OR_RETURN(*out, r.str(max_len));
  return Status();
}

}  // namespace kforge::codec
