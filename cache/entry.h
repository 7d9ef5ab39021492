// CacheEntry: what one verified kernel in the cache is, independent of how it is stored.
//
// An entry is keyed by (signature, environment): EntryKey = XXH3-128 of the two canonical
// encodings concatenated (entry_key() below). Everything else (the kernel, its verification report,
// timings and provenance) is the entry's immutable content; only EntryStatus changes after publish.
//
//   CacheEntry e;
//   e.signature = sig; e.environment = env; e.spec = spec;
//   e.blobs.push_back({"cubin", cubin_bytes});
//   e.verification = report; e.timings = timings; e.provenance = {"template:softmax", ...};
//   StatusOr<EntryKey> key = store.publish(e);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/environment.h"
#include "runtime/kernel_spec.h"
#include "runtime/op_signature.h"

namespace kforge {

// The blob of an entry a language model wrote: the conversation that wrote it and what the search
// had spent on the model by then, as JSON (Note [LLM provenance] in
// search_daemon/proposers/llm/llm_proposer.cc); `kforge cache show` summarizes it, `--llm` prints
// it. Never a kernel artifact: the hook loads blobs by their artifact names.
inline constexpr const char kLlmProvenanceBlob[] = "llm-provenance.json";

using EntryKey = SignatureId;   // same 128-bit id type; hex() is the 32-digit form users see
EntryKey entry_key(const OpSignature& sig, const Environment& env);

// What the worker found when it verified the kernel (DESIGN.md, Worker/Verify).
struct VerificationReport {
  uint32_t trials = 0;
  double max_abs_error = 0;        // candidate vs float64 reference
  double rel_error = 0;            // ||cand - ref|| / ||ref||
  double torch_max_abs_error = 0;  // PyTorch's own kernel vs the same reference
  double torch_rel_error = 0;
  bool passed = false;
  std::string details;             // human-readable summary: distributions, checks run
  friend bool operator==(const VerificationReport&, const VerificationReport&) = default;
};

struct Timings {
  double baseline_ns = 0;          // PyTorch's kernel, median
  double candidate_ns = 0;         // the entry's kernel, median
  double spread = 0;               // relative spread of the candidate's runs (0.01 = ±1%)
  uint32_t runs = 0;
  double speedup() const { return candidate_ns > 0 ? baseline_ns / candidate_ns : 0; }
  friend bool operator==(const Timings&, const Timings&) = default;
};

struct Provenance {
  std::string proposer;            // "template:softmax_rowwise", "llm:<model>", "import:<bundle>"
  std::string search_id;           // the daemon's search that found it (empty if none)
  std::string kforge_version;
  int64_t created_unix_ms = 0;
  std::string host;                // hostname of the publisher
  friend bool operator==(const Provenance&, const Provenance&) = default;
};

// A named binary artifact of the kernel (compiled cubin, CPU shared object, PTX). Stored
// content-addressed by SHA-256.
struct BlobData {
  std::string name;                // "cubin", "so", "ptx", kLlmProvenanceBlob
  std::string bytes;
};

struct CacheEntry {
  OpSignature signature;
  Environment environment;
  KernelSpec spec;
  std::vector<BlobData> blobs;
  VerificationReport verification;
  Timings timings;
  Provenance provenance;
};

// The mutable part: set by users (disable, pin) and by the hook (quarantine after a failed
// shadow phase). Kept beside the immutable manifest.
enum class EntryState : uint8_t { kActive = 0, kDisabled = 1, kQuarantined = 2 };
std::string_view entry_state_name(EntryState s) noexcept;   // "active", "disabled", "quarantined"

struct EntryStatus {
  EntryState state = EntryState::kActive;
  std::string reason;              // why disabled/quarantined (empty when active)
  int64_t changed_unix_ms = 0;
  bool pinned = false;             // gc never removes a pinned entry
  int64_t last_use_unix_ms = 0;    // 0 = never used since publish
  bool usable() const { return state == EntryState::kActive; }
};

struct BlobRef {
  std::string name;
  std::string sha256_hex;          // 64 lowercase hex digits
  uint64_t size = 0;
};

// An entry as read back from the store: content verified (manifest checksum, FlatBuffers
// verifier, key recomputed from the embedded signature and environment), blobs referenced by hash
// and checked when read (Store::read_blob).
struct StoredEntry {
  EntryKey key;
  OpSignature signature;
  Environment environment;
  KernelSpec spec;
  std::vector<BlobRef> blobs;
  VerificationReport verification;
  Timings timings;
  Provenance provenance;
  EntryStatus status;
  uint64_t manifest_bytes = 0;     // size on disk of the manifest file
};

}  // namespace kforge
