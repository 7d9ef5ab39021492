#include "interposer/hook/signature_writer.h"

#include <xxhash.h>

namespace kforge::hook {

SignaturePiece SignaturePiece::from(const SignatureWriter& w, size_t skip) noexcept {
  SignaturePiece piece;
  if (!w.ok()) return piece;
  const std::string_view b = w.bytes().substr(skip);
  if (b.size() > kCapacity) return piece;
  std::memcpy(piece.bytes_, b.data(), b.size());
  piece.size_ = static_cast<uint8_t>(b.size());
  piece.valid_ = true;
  return piece;
}

SignaturePiece SignaturePiece::head(std::string_view op, std::string_view overload, uint32_t nargs) noexcept {
  SignatureWriter w;
  w.begin(op, overload, nargs);
  return from(w, 0);
}

SignaturePiece SignaturePiece::target(Backend backend, std::string_view arch) noexcept {
  // Written after an empty head, which is then left out.
  SignatureWriter w;
  w.begin("", "", 0);
  const size_t head = w.bytes().size();
  w.target(backend, arch);
  return from(w, head);
}

// Same function as kforge::hash128 (runtime/op_signature.cc), compiled inline here: the fast path
// must not pay a call into the runtime library per intercepted call.
SignatureId SignatureWriter::id() const noexcept {
  const XXH128_hash_t h = XXH3_128bits(buf_, size_);
  return SignatureId{h.high64, h.low64};
}

}  // namespace kforge::hook
