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
// Promise: for the same values, bytes() equals OpSignature::encode() byte for byte (Note
// [Canonical signature encoding] in runtime/op_signature.cc: arrays only, integers in msgpack-c's
// smallest form, floats as float64 with one NaN), so id() equals OpSignature::id(). The writer
// does not check the decoder's limits (rank, list lengths, string lengths); callers that want ids
// a daemon can decode keep within them (the hook does: stack_signature.cc). Nothing here includes
// torch, so tests/interposer/stack_signature_test.cc checks the promise without it.
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

class SignatureWriter {
 public:
  SignatureWriter() = default;
  SignatureWriter(const SignatureWriter&) = delete;
  SignatureWriter& operator=(const SignatureWriter&) = delete;

  // [version, op, overload, [ ... `nargs` arguments follow.
  void begin(std::string_view op, std::string_view overload, uint32_t nargs) noexcept {
    size_ = 0;
    overflow_ = false;
    put_array(5);
    put_uint(kEncodingVersion);
    put_str(op);
    put_str(overload);
    put_array(nargs);
  }

  // One argument each.
  void none() noexcept {
    put_array(1);
    put_uint(kNone);
  }
  void tensor(DType dtype, DeviceType device, const int64_t* sizes, const int64_t* strides,
              size_t rank, uint32_t alignment) noexcept {
    put_array(6);
    put_uint(kTensor);
    tensor_body(dtype, device, sizes, strides, rank, alignment);
  }
  // A tensor list: tensor_list(n), then n tensor_list_item() calls.
  void tensor_list(uint32_t n) noexcept {
    put_array(2);
    put_uint(kTensorList);
    put_array(n);
  }
  void tensor_list_item(DType dtype, DeviceType device, const int64_t* sizes,
                        const int64_t* strides, size_t rank, uint32_t alignment) noexcept {
    put_array(5);
    tensor_body(dtype, device, sizes, strides, rank, alignment);
  }
  void boolean(bool b) noexcept {
    put_array(2);
    put_uint(kBool);
    put_byte(b ? 0xc3 : 0xc2);
  }
  void integer(int64_t i) noexcept {
    put_array(2);
    put_uint(kInt);
    put_int(i);
  }
  void real(double d) noexcept {
    put_array(2);
    put_uint(kFloat);
    put_f64(d);
  }
  void string(std::string_view s) noexcept {
    put_array(2);
    put_uint(kString);
    put_str(s);
  }
  // An int list: int_list(n), then n int_list_item() calls.
  void int_list(uint32_t n) noexcept {
    put_array(2);
    put_uint(kIntList);
    put_array(n);
  }
  void int_list_item(int64_t i) noexcept { put_int(i); }

  // Closes the argument list: [backend, arch]].
  void target(Backend backend, std::string_view arch) noexcept {
    put_array(2);
    put_uint(static_cast<uint8_t>(backend));
    put_str(arch);
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

  void tensor_body(DType dtype, DeviceType device, const int64_t* sizes, const int64_t* strides,
                   size_t rank, uint32_t alignment) noexcept {
    put_uint(static_cast<uint8_t>(dtype));
    put_uint(static_cast<uint8_t>(device));
    put_array(static_cast<uint32_t>(rank));
    for (size_t d = 0; d < rank; ++d) put_int(sizes[d]);
    put_array(static_cast<uint32_t>(rank));
    for (size_t d = 0; d < rank; ++d) put_int(strides[d]);
    put_uint(alignment);
  }

  bool reserve(size_t n) noexcept {
    if (overflow_ || n > kSignatureBufferBytes - size_) {
      overflow_ = true;
      return false;
    }
    return true;
  }
  void put_byte(unsigned v) noexcept {
    if (reserve(1)) buf_[size_++] = static_cast<unsigned char>(v);
  }
  // `n` big-endian bytes of v after a one-byte tag.
  void put_tagged(unsigned tag, uint64_t v, int n) noexcept {
    if (!reserve(static_cast<size_t>(n) + 1)) return;
    buf_[size_++] = static_cast<unsigned char>(tag);
    for (int i = n - 1; i >= 0; --i) buf_[size_++] = static_cast<unsigned char>(v >> (8 * i));
  }
  void put_array(uint32_t n) noexcept {
    if (n < 16) put_byte(0x90u | n);
    else if (n < 65536) put_tagged(0xdc, n, 2);
    else put_tagged(0xdd, n, 4);
  }
  // msgpack-c's smallest forms (pack_imp_int64; unsigned values take the same forms).
  void put_uint(uint64_t v) noexcept {
    if (v < 128) put_byte(static_cast<unsigned>(v));
    else if (v < 256) put_tagged(0xcc, v, 1);
    else if (v < 65536) put_tagged(0xcd, v, 2);
    else if (v < (uint64_t{1} << 32)) put_tagged(0xce, v, 4);
    else put_tagged(0xcf, v, 8);
  }
  void put_int(int64_t v) noexcept {
    if (v >= 0) return put_uint(static_cast<uint64_t>(v));
    const auto u = static_cast<uint64_t>(v);
    if (v >= -32) put_byte(static_cast<unsigned>(u & 0xff));
    else if (v >= -128) put_tagged(0xd0, u, 1);
    else if (v >= -32768) put_tagged(0xd1, u, 2);
    else if (v >= INT64_C(-2147483648)) put_tagged(0xd2, u, 4);
    else put_tagged(0xd3, u, 8);
  }
  void put_f64(double d) noexcept {
    if (d != d) d = std::numeric_limits<double>::quiet_NaN();   // one NaN, as Packer::pack_f64
    put_tagged(0xcb, std::bit_cast<uint64_t>(d), 8);
  }
  void put_str(std::string_view s) noexcept {
    const size_t n = s.size();
    if (n < 32) put_byte(0xa0u | static_cast<unsigned>(n));
    else if (n < 256) put_tagged(0xd9, n, 1);
    else if (n < 65536) put_tagged(0xda, n, 2);
    else if (n <= UINT32_MAX) put_tagged(0xdb, n, 4);
    else overflow_ = true;
    if (n > 0 && reserve(n)) {
      std::memcpy(buf_ + size_, s.data(), n);
      size_ += n;
    }
  }

  size_t size_ = 0;
  bool overflow_ = false;
  unsigned char buf_[kSignatureBufferBytes];
};

}  // namespace kforge::hook
