#include "cache/entry.h"

namespace kforge {

// The two canonical encodings are self-delimiting msgpack, so their concatenation is unambiguous:
// no (signature, environment) pair shares its bytes with another.
EntryKey entry_key(const OpSignature& sig, const Environment& env) {
  std::string bytes = sig.encode();
  bytes += env.encode();
  return hash128(bytes);
}

std::string_view entry_state_name(EntryState s) noexcept {
  switch (s) {
    case EntryState::kActive:
      return "active";
    case EntryState::kDisabled:
      return "disabled";
    case EntryState::kQuarantined:
      return "quarantined";
  }
  return "unknown";
}

}  // namespace kforge
