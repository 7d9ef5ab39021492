// Bounded msgpack decoding with precise errors, shared by every kforge decoder (signatures,
// kernel specs, wire messages). Internal to the runtime: public headers do not include it.
//
// Promises: parse() never throws, enforces size/depth limits before allocating, rejects trailing
// bytes, and every Reader error names the path of the offending field ("hot[3].args[1].sizes[0]:
// expected integer, got string").
#pragma once

#include <msgpack.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "runtime/op_signature.h"
#include "runtime/status.h"

namespace kforge::codec {

struct Limits {
  size_t max_bytes = 16u << 20;      // whole message
  size_t max_array = 1u << 16;       // elements in one array
  size_t max_map = 1024;             // pairs in one map
  size_t max_str = 1u << 20;         // bytes in one string
  size_t max_bin = 8u << 20;         // bytes in one binary blob
  size_t max_depth = 32;             // nesting
};

// Parses exactly one msgpack object spanning all of `bytes`.
StatusOr<msgpack::object_handle> parse(std::string_view bytes, const Limits& limits);

std::string_view type_name(msgpack::type::object_type t) noexcept;

// A read-only view of one msgpack object plus the path that reached it, for error messages.
class Reader {
 public:
  Reader(const msgpack::object& obj, std::string path) : obj_(&obj), path_(std::move(path)) {}

  const std::string& path() const noexcept { return path_; }
  const msgpack::object& object() const noexcept { return *obj_; }
  bool is_nil() const noexcept { return obj_->type == msgpack::type::NIL; }

  // Array access. array_size() fails unless the object is an array.
  StatusOr<size_t> array_size() const;
  // Fails unless the object is an array of exactly `n` (or between lo and hi) elements.
  Status expect_array(size_t n) const;
  Status expect_array(size_t lo, size_t hi) const;
  // Precondition: is an array and i < size (checked by the calls above).
  Reader at(size_t i) const;
  // Element i of a positional record, named in error paths as "<path>.<name>".
  Reader field(size_t i, std::string_view name) const;

  StatusOr<int64_t> i64() const;
  StatusOr<uint64_t> u64() const;
  StatusOr<int64_t> i64_in(int64_t lo, int64_t hi) const;   // inclusive range
  StatusOr<double> f64() const;                             // float or integer
  StatusOr<bool> boolean() const;
  StatusOr<std::string> str(size_t max_len) const;
  StatusOr<std::string> bin(size_t max_len) const;          // bin (or str) bytes

  Status error(std::string_view what) const;                // invalid_argument("<path>: <what>")

 private:
  const msgpack::object* obj_;
  std::string path_;
};

// Appends msgpack to an sbuffer. Integers are packed in their smallest msgpack form and doubles
// always as float64 with NaN canonicalized, which is what makes encodings canonical. (msgpack-c's
// own pack_double writes integral doubles as integers; never call it for canonical data.)
class Packer : public msgpack::packer<msgpack::sbuffer> {
 public:
  explicit Packer(msgpack::sbuffer& buf) : msgpack::packer<msgpack::sbuffer>(buf), buf_(&buf) {}
  void pack_f64(double v);
  // A msgpack str / bin of these bytes.
  void pack_text(std::string_view s) {
    pack_str(static_cast<uint32_t>(s.size()));
    pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
  }
  void pack_bytes(std::string_view s) {
    pack_bin(static_cast<uint32_t>(s.size()));
    pack_bin_body(s.data(), static_cast<uint32_t>(s.size()));
  }

 private:
  msgpack::sbuffer* buf_;
};

// ---- record helpers: what every decoder of positional records (wire messages, the eval protocol)
// reads fields with; each error names the field's path.

// A record is a positional array of at least `fields` elements; more are a newer peer's additions
// (forward compatibility within a version), ignored by the reader.
Status open_record(const Reader& r, size_t fields);
template <class T>
Status read_uint(const Reader& r, T* out, uint64_t max = std::numeric_limits<T>::max()) {
  KFORGE_ASSIGN_OR_RETURN(uint64_t v, r.u64());
  if (v > max) return r.error("value " + std::to_string(v) + " exceeds " + std::to_string(max));
  *out = static_cast<T>(v);
  return Status();
}
Status read_f64(const Reader& r, double* out);
Status read_bool(const Reader& r, bool* out);
Status read_str(const Reader& r, size_t max_len, std::string* out);
// A field that holds another type's canonical bytes, decoded by that type's own decoder; its
// errors are prefixed with this field's path.
template <class T>
Status read_embedded(const Reader& r, size_t max, T* out) {
  KFORGE_ASSIGN_OR_RETURN(std::string bytes, r.bin(max));
  StatusOr<T> v = T::decode(bytes);
  if (!v.ok()) return r.error(v.status().message());
  *out = std::move(*v);
  return Status();
}

// Nested forms of the vocabulary types, for messages and manifests that embed them. The bytes
// are exactly those of the type's own encode(), so an embedded signature hashes the same.
void pack(Packer& pk, const OpSignature& sig);
StatusOr<OpSignature> read_op_signature(const Reader& r);

}  // namespace kforge::codec
