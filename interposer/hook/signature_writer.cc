#include "interposer/hook/signature_writer.h"

#include <xxhash.h>

namespace kforge::hook {

// Same function as kforge::hash128 (runtime/op_signature.cc), compiled inline here: the fast path
// must not pay a call into the runtime library per intercepted call.
SignatureId SignatureWriter::id() const noexcept {
  const XXH128_hash_t h = XXH3_128bits(buf_, size_);
  return SignatureId{h.high64, h.low64};
}

}  // namespace kforge::hook
