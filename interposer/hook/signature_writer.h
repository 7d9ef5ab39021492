// SignatureWriter: an OpSignature's canonical bytes, written straight into a fixed buffer that
// lives on the caller's stack, and their SignatureId. It is the hook's fast path: no heap
// allocation, no locks, no exceptions.
//
//   SignatureWriter w;
//   w.begin("aten::_softmax", "", 3);
//   w.tensor(DType::kFloat32, DeviceType::kCpu, sizes, strides, rank, pointer_alignment(data));
//   w.integer(-1);
//   w.boolean(false);
//   w.target(Backend::kCpu, "x86_64-avx2");
//   if (!w.ok()) fall_through();          // longer than kSignatureBufferBytes: "unknown"
//   SignatureId id = w.id();              // == OpSignature{...}.id(), on every host
//
// The constant parts of a call's bytes, an operator's head [version, op, overload, [ and a target
// [backend, arch]], can be encoded once into SignaturePieces and copied per call instead:
// w.begin(head) writes what w.begin(op, overload, nargs) writes, w.append(target) what
// w.target(backend, arch) writes.
//
// Promise: for the same values, bytes() equals OpSignature::encode() byte for byte (Note
// [Canonical signature encoding] in runtime/op_signature.cc: arrays only, integers in msgpack-c's
// smallest form, floats as float64 with one NaN), so id() equals OpSignature::id(). A signature
// is refused (ok() false) exactly when its encoding is longer than kSignatureBufferBytes. The
// writer does not check the decoder's limits (rank, list lengths, string lengths); callers that
// want ids a daemon can decode keep within them (the hook does: stack_signature.cc). Nothing here
// includes torch, so tests/interposer/stack_signature_test.cc checks the promise without it.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string_view>

#include "runtime/op_signature.h"

namespace kforge::hook {

// Signatures longer than this are "unknown" on the fast path: the call falls through, uncounted
// by signature. 1 KiB holds every catalog operator with rank-16 tensors.
inline constexpr size_t kSignatureBufferBytes = 1024;

// Largest power of two, at most kMaxAlignment (16), that divides the address
// (TensorMeta::alignment). A null pointer (an empty tensor) is divisible by everything: 16.
inline uint32_t pointer_alignment(const void* p) noexcept {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return kMaxAlignment;
  const int tz = std::countr_zero(a);
  return tz >= 4 ? kMaxAlignment : (1u << tz);
}

class SignatureWriter;

// A constant run of canonical bytes, encoded once and appended per call with one fixed-size copy.
// valid() is false when the run is longer than kCapacity (a name that long): callers then write
// the same values with begin()/target().
class SignaturePiece {
 public:
  static constexpr size_t kCapacity = 64;

  // What SignatureWriter::begin(op, overload, nargs) writes.
  static SignaturePiece head(std::string_view op, std::string_view overload, uint32_t nargs) noexcept;
  // What SignatureWriter::target(backend, arch) writes.
  static SignaturePiece target(Backend backend, std::string_view arch) noexcept;

  bool valid() const noexcept { return valid_; }
  std::string_view bytes() const noexcept { return {reinterpret_cast<const char*>(bytes_), size_}; }

 private:
  friend class SignatureWriter;
  // w's bytes after the first `skip`.
  static SignaturePiece from(const SignatureWriter& w, size_t skip) noexcept;

  unsigned char bytes_[kCapacity] = {};
  uint8_t size_ = 0;
  bool valid_ = false;
};

// Note [Writer bounds]
// The writer checks room once per group of bytes, not once per byte. buf_ has kSlack bytes past
// kSignatureBufferBytes, and every group (a header, a scalar argument, one list element, a
// SignaturePiece, a whole tensor of rank <= kMaxTensorRank) encodes to at most kSlack bytes. A
// group is written only while size_ <= kSignatureBufferBytes, so it stays inside buf_ unchecked;
// after it, end_group() marks the writer overflowed if size_ went past kSignatureBufferBytes (and
// restarts it at 0, so later groups stay inside buf_; the bytes are meaningless once !ok()). The
// size only grows, so "some group ended past the limit" is exactly "the encoding is longer than
// the limit", which is what the byte-by-byte check said before. Strings, the one group of
// unbounded length, are checked before they are copied; tensors of higher rank settle per value.
class SignatureWriter {
 public:
  SignatureWriter() = default;
  SignatureWriter(const SignatureWriter&) = delete;
  SignatureWriter& operator=(const SignatureWriter&) = delete;

  // [version, op, overload, [ ... `nargs` arguments follow.
  void begin(std::string_view op, std::string_view overload, uint32_t nargs) noexcept {
    size_ = 0;
    overflow_ = false;
    unsigned char* p = buf_;
    p = emit_array(p, 5);
    p = emit_uint(p, kEncodingVersion);
    size_ = static_cast<size_t>(p - buf_);
    put_str(op);
    put_str(overload);
    p = emit_array(buf_ + size_, nargs);
    end_group(p);
  }
  // The same as begin(op, overload, nargs) for a head made by SignaturePiece::head.
  // Precondition: head.valid().
  [[gnu::always_inline]] void begin(const SignaturePiece& head) noexcept {
    overflow_ = false;
    std::memcpy(buf_, head.bytes_, SignaturePiece::kCapacity);
    size_ = head.size_;
  }

  // One argument each.
  void none() noexcept {
    unsigned char* p = cursor();
    *p++ = 0x91;
    *p++ = kNone;
    end_group(p);
  }
  [[gnu::always_inline]] void tensor(DType dtype, DeviceType device, const int64_t* sizes,
                                     const int64_t* strides, size_t rank, uint32_t alignment) noexcept {
    unsigned char* p = cursor();
    *p++ = 0x96;
    *p++ = kTensor;
    tensor_body(p, dtype, device, sizes, strides, rank, alignment);
  }
  // A tensor list: tensor_list(n), then n tensor_list_item() calls.
  void tensor_list(uint32_t n) noexcept {
    unsigned char* p = cursor();
    *p++ = 0x92;
    *p++ = kTensorList;
    end_group(emit_array(p, n));
  }
  [[gnu::always_inline]] void tensor_list_item(DType dtype, DeviceType device, const int64_t* sizes,
                                               const int64_t* strides, size_t rank, uint32_t alignment) noexcept {
    unsigned char* p = cursor();
    *p++ = 0x95;
    tensor_body(p, dtype, device, sizes, strides, rank, alignment);
  }
  void boolean(bool b) noexcept {
    unsigned char* p = cursor();
    *p++ = 0x92;
    *p++ = kBool;
    *p++ = b ? 0xc3 : 0xc2;
    end_group(p);
  }
  void integer(int64_t i) noexcept {
    unsigned char* p = cursor();
    *p++ = 0x92;
    *p++ = kInt;
    end_group(emit_int(p, i));
  }
  void real(double d) noexcept {
    unsigned char* p = cursor();
    *p++ = 0x92;
    *p++ = kFloat;
    if (d != d) d = std::numeric_limits<double>::quiet_NaN();   // one NaN, as Packer::pack_f64
    *p++ = 0xcb;
    end_group(store_be(p, std::bit_cast<uint64_t>(d)));
  }
  void string(std::string_view s) noexcept {
    unsigned char* p = cursor();
    *p++ = 0x92;
    *p++ = kString;
    end_group(p);
    put_str(s);
  }
  // An int list: int_list(n), then n int_list_item() calls.
  void int_list(uint32_t n) noexcept {
    unsigned char* p = cursor();
    *p++ = 0x92;
    *p++ = kIntList;
    end_group(emit_array(p, n));
  }
  void int_list_item(int64_t i) noexcept { end_group(emit_int(cursor(), i)); }

  // Closes the argument list: [backend, arch]].
  void target(Backend backend, std::string_view arch) noexcept {
    unsigned char* p = cursor();
    *p++ = 0x92;
    end_group(emit_uint(p, static_cast<uint8_t>(backend)));
    put_str(arch);
  }
  // Appends a piece made by SignaturePiece (a target, usually). Precondition: piece.valid().
  [[gnu::always_inline]] void append(const SignaturePiece& piece) noexcept {
    unsigned char* p = cursor();
    std::memcpy(p, piece.bytes_, SignaturePiece::kCapacity);
    end_group(p + piece.size_);
  }

  // False once anything did not fit: bytes() is then incomplete and must not be used.
  bool ok() const noexcept { return !overflow_; }
  std::string_view bytes() const noexcept {
    return {reinterpret_cast<const char*>(buf_), size_};
  }
  // XXH3-128 of bytes(), the same function as kforge::hash128.
  SignatureId id() const noexcept;

 private:
  // Kept in step with op_signature.cc (the test compares whole encodings, so a drift fails it).
  static constexpr uint8_t kEncodingVersion = 1;
  enum : uint8_t { kNone = 0, kTensor = 1, kTensorList = 2, kBool = 3, kInt = 4, kFloat = 5,
                   kString = 6, kIntList = 7 };

  // The most one group writes (Note [Writer bounds]): a tensor of rank kMaxTensorRank is
  // 2 + 2 + 2 + 2 x (3 + 9 x rank) + 5 bytes, a SignaturePiece copy 64, any other group 11.
  static constexpr size_t kSlack = 320;
  static_assert(kSlack >= 2 + 2 + 2 + 2 * (3 + 9 * kMaxTensorRank) + 5);
  static_assert(kSlack >= SignaturePiece::kCapacity);

  unsigned char* cursor() noexcept { return buf_ + size_; }
  void end_group(unsigned char* p) noexcept {
    size_ = static_cast<size_t>(p - buf_);
    if (size_ > kSignatureBufferBytes) [[unlikely]] overflow();
  }
  void overflow() noexcept {
    overflow_ = true;
    size_ = 0;
  }

  // v's bytes, big-endian, in one store.
  static unsigned char* store_be(unsigned char* p, uint64_t v) noexcept {
    v = __builtin_bswap64(v);
    std::memcpy(p, &v, 8);
    return p + 8;
  }
  static unsigned char* store_be(unsigned char* p, uint32_t v) noexcept {
    v = __builtin_bswap32(v);
    std::memcpy(p, &v, 4);
    return p + 4;
  }
  static unsigned char* store_be(unsigned char* p, uint16_t v) noexcept {
    v = __builtin_bswap16(v);
    std::memcpy(p, &v, 2);
    return p + 2;
  }
  static unsigned char* emit_array(unsigned char* p, uint32_t n) noexcept {
    if (n < 16) [[likely]] {
      *p = static_cast<unsigned char>(0x90u | n);
      return p + 1;
    }
    if (n < 65536) {
      *p = 0xdc;
      return store_be(p + 1, static_cast<uint16_t>(n));
    }
    *p = 0xdd;
    return store_be(p + 1, n);
  }
  // msgpack-c's smallest forms (pack_imp_int64; unsigned values take the same forms).
  static unsigned char* emit_uint(unsigned char* p, uint64_t v) noexcept {
    if (v < 128) [[likely]] {
      *p = static_cast<unsigned char>(v);
      return p + 1;
    }
    return emit_wide_uint(p, v);
  }
  static unsigned char* emit_wide_uint(unsigned char* p, uint64_t v) noexcept {
    if (v < 256) {
      p[0] = 0xcc;
      p[1] = static_cast<unsigned char>(v);
      return p + 2;
    }
    if (v < 65536) {
      *p = 0xcd;
      return store_be(p + 1, static_cast<uint16_t>(v));
    }
    if (v < (uint64_t{1} << 32)) {
      *p = 0xce;
      return store_be(p + 1, static_cast<uint32_t>(v));
    }
    *p = 0xcf;
    return store_be(p + 1, v);
  }
  static unsigned char* emit_int(unsigned char* p, int64_t v) noexcept {
    const auto u = static_cast<uint64_t>(v);
    if (u < 128) [[likely]] {   // 0..127: positive fixint
      *p = static_cast<unsigned char>(u);
      return p + 1;
    }
    if (v >= 0) return emit_wide_uint(p, u);
    if (v >= -32) {
      *p = static_cast<unsigned char>(u & 0xff);
      return p + 1;
    }
    if (v >= -128) {
      p[0] = 0xd0;
      p[1] = static_cast<unsigned char>(u & 0xff);
      return p + 2;
    }
    if (v >= -32768) {
      *p = 0xd1;
      return store_be(p + 1, static_cast<uint16_t>(u));
    }
    if (v >= INT64_C(-2147483648)) {
      *p = 0xd2;
      return store_be(p + 1, static_cast<uint32_t>(u));
    }
    *p = 0xd3;
    return store_be(p + 1, u);
  }

  // [dtype, device, [sizes...], [strides...], alignment], after the caller's header bytes at p.
  // tensor() and this are inlined into the hook's tensor readers: a call with seven arguments costs
  // as much as a rank-1 body.
  [[gnu::always_inline]] void tensor_body(unsigned char* p, DType dtype, DeviceType device,
                                          const int64_t* sizes, const int64_t* strides, size_t rank,
                                          uint32_t alignment) noexcept {
    p = emit_uint(p, static_cast<uint8_t>(dtype));
    p = emit_uint(p, static_cast<uint8_t>(device));
    if (rank <= kMaxTensorRank) [[likely]] {
      p = emit_array(p, static_cast<uint32_t>(rank));
      for (size_t d = 0; d < rank; ++d) p = emit_int(p, sizes[d]);
      p = emit_array(p, static_cast<uint32_t>(rank));
      for (size_t d = 0; d < rank; ++d) p = emit_int(p, strides[d]);
      end_group(emit_uint(p, alignment));
      return;
    }
    // Longer than any group may be: one value at a time.
    end_group(emit_array(p, static_cast<uint32_t>(rank)));
    for (size_t d = 0; d < rank; ++d) end_group(emit_int(cursor(), sizes[d]));
    end_group(emit_array(cursor(), static_cast<uint32_t>(rank)));
    for (size_t d = 0; d < rank; ++d) end_group(emit_int(cursor(), strides[d]));
    end_group(emit_uint(cursor(), alignment));
  }

  void put_str(std::string_view s) noexcept {
    const size_t n = s.size();
    unsigned char* p = cursor();
    if (n < 32) [[likely]] {
      *p++ = static_cast<unsigned char>(0xa0u | n);
    } else if (n < 256) {
      *p++ = 0xd9;
      *p++ = static_cast<unsigned char>(n);
    } else if (n < 65536) {
      *p++ = 0xda;
      p = store_be(p, static_cast<uint16_t>(n));
    } else if (n <= UINT32_MAX) {
      *p++ = 0xdb;
      p = store_be(p, static_cast<uint32_t>(n));
    } else {
      return overflow();
    }
    end_group(p);
    if (overflow_ || n > kSignatureBufferBytes - size_) return overflow();
    if (n > 0) std::memcpy(buf_ + size_, s.data(), n);
    size_ += n;
  }

  size_t size_ = 0;
  bool overflow_ = false;
  unsigned char buf_[kSignatureBufferBytes + kSlack];
};

}  // namespace kforge::hook
