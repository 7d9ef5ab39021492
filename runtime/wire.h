// The hook <-> daemon wire protocol: one header shared by both sides, versioned.
//
// Every message is the msgpack array ["kforge", version, type, body], where version is
// kWireVersion (u16), type a MessageType (u8), and body a positional array whose layout each
// struct below documents field by field. Hook -> daemon: Hello, HotReport, CapturedInputs,
// Goodbye. Daemon -> hooks: KernelReady, Revoke.
//
// Promises of decode():
//   - never throws and never crashes, whatever the bytes;
//   - allocates in proportion to the limits below, never to a length the message declares: a
//     10-byte message that declares a 4-billion-element array is rejected before anything is
//     allocated (see Note [Decode memory bound] in wire.cc);
//   - rejects wrong magic, unsupported versions (naming the versions it speaks), unknown types,
//     missing fields, wrong field types and out-of-range values, with a reason that names the
//     field path: "HotReport.entries[3].signature.args[1].sizes[0]: expected integer, got string".
// Forward compatibility: a body or nested record of a supported version may carry extra trailing
// elements; they are ignored, so a newer peer can append fields without a version bump. Fields
// are never removed or reordered within a version; anything else needs kWireVersion + 1.
//
//   std::string bytes = wire::encode(wire::Goodbye{getpid(), "interpreter exit"});
//   StatusOr<wire::WireMessage> m = wire::decode(bytes);
//   if (!m.ok()) { log_once("dropped message: " + m.status().message()); return; }
//   if (auto* report = std::get_if<wire::HotReport>(&*m)) scheduler.add(*report);
//
// encode() never fails and does not check the limits; senders keep within them (the hook splits
// a report at kMaxReportEntries), and the receiver's decode() enforces them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "runtime/environment.h"
#include "runtime/op_signature.h"
#include "runtime/status.h"

namespace kforge::wire {

// ---- envelope -------------------------------------------------------------------------------
inline constexpr std::string_view kWireMagic = "kforge";
inline constexpr uint16_t kWireVersion = 1;      // what encode() writes
inline constexpr uint16_t kMinWireVersion = 1;   // the oldest version decode() accepts

// Values are part of the protocol: never renumber, append only.
enum class MessageType : uint8_t {
  kHello = 1,
  kHotReport = 2,
  kCapturedInputs = 3,
  kGoodbye = 4,
  kKernelReady = 5,
  kRevoke = 6,
};
std::string_view message_type_name(MessageType t) noexcept;   // "HotReport"

// ---- limits enforced by decode() --------------------------------------------------------------
inline constexpr size_t kMaxMessageBytes = 4u << 20;          // every type but CapturedInputs
inline constexpr size_t kMaxCapturedInputsBytes = 64u << 20;  // CapturedInputs, tensors included
inline constexpr size_t kMaxReportEntries = 4096;             // HotReport.entries
inline constexpr size_t kMaxStatsPerEntry = 64;               // HotEntry.input_stats
inline constexpr size_t kMaxDevices = 64;                     // Hello.devices, HotReport.gpus_in_use
inline constexpr size_t kMaxCapturedTensors = 64;             // CapturedInputs.tensors
inline constexpr size_t kMaxStringBytes = 4096;               // every string field but paths
inline constexpr size_t kMaxPathBytes = 4096;                 // Hello.cache_dir (PATH_MAX)
inline constexpr size_t kMaxEntryKeyChars = 128;              // KernelReady/Revoke.entry_key
inline constexpr uint32_t kMaxArgIndex = 255;                 // arg_index fields
inline constexpr int32_t kMaxDeviceIndex = 65535;             // DeviceInfo.index
// A GPU UUID (DeviceInfo.uuid, HotReport.gpus_in_use): at most this many letters, digits and '-'
// ("GPU-5e2a910c-d34f-8b17-a0ff-00017e80c93b", runtime/cuda_driver.h gpu_uuid_string).
inline constexpr size_t kMaxGpuUuidChars = 64;

// ---- hook -> daemon -----------------------------------------------------------------------------

// One device the serving process can run kernels on (the CPU counts as one, index 0).
// Encoded as [index, backend, arch, model, total_memory_bytes, uuid]
// (uuid appended later: a device of 5 fields, from an older hook, has uuid "").
struct DeviceInfo {
  int32_t index = 0;                // CUDA ordinal in this process; 0 for the CPU; 0..65535
  Backend backend = Backend::kCpu;  // encoded as its enum value
  std::string arch;                 // "sm_90", "x86_64-avx2": as in OpSignature's Target
  std::string model;                // "NVIDIA H200"; the CPU model name for the CPU
  uint64_t total_memory_bytes = 0;  // device memory; host RAM for the CPU
  // The GPU's UUID, "GPU-..." (kMaxGpuUuidChars): how processes with different ordinals name the
  // same GPU. "" for the CPU (required), and for a GPU whose driver could not say.
  std::string uuid;
  friend bool operator==(const DeviceInfo&, const DeviceInfo&) = default;
};

// First message of a serving process, sent when the hook's client thread connects.
// Encoded as [pid, kforge_version, torch_version, process_name, cache_dir, devices].
struct Hello {
  static constexpr MessageType kType = MessageType::kHello;
  int32_t pid = 0;                  // the serving process; 1..INT32_MAX
  std::string kforge_version;       // the hook's KFORGE_VERSION_STRING, "0.1.0"
  std::string torch_version;        // torch's version string, "2.9.0+cu130"
  std::string process_name;         // basename of argv[0], "python3.12"
  std::string cache_dir;            // the cache directory this process reads (at most kMaxPathBytes)
  std::vector<DeviceInfo> devices;  // at most kMaxDevices
  friend bool operator==(const Hello&, const Hello&) = default;
};

// Statistics of one tensor argument's values over the sampled calls, so the worker can draw
// verification inputs like the real ones. Encoded as
// [arg_index, min, max, mean, stddev, nan_count, inf_count, zero_fraction].
struct InputStats {
  uint32_t arg_index = 0;      // position in the entry's signature.args (checked against it)
  double min = 0;              // over finite elements; any double, NaN included, is accepted
  double max = 0;
  double mean = 0;
  double stddev = 0;
  uint64_t nan_count = 0;      // elements that were NaN, over all sampled calls
  uint64_t inf_count = 0;      // elements that were +-Inf
  double zero_fraction = 0;    // fraction of elements equal to zero, in [0, 1]
  // Bitwise on the doubles (NaN == NaN, -0.0 != 0.0): equal values are equal encodings.
  friend bool operator==(const InputStats&, const InputStats&) noexcept;
};

// One hot signature. Counters are cumulative since the process started, so a lost report loses
// no counts; the daemon takes differences. Encoded as
// [signature, calls, sampled_calls, sampled_total_ns, input_stats].
// What the process does with the cache entry it loaded for a signature (the hook's swapper): how
// the daemon and its GUI know which kernels run where, confirmed or not, and the time they save.
// Encoded as [entry_key, state, active_calls, pytorch_median_ns, entry_median_ns].
struct EntryInProcess {
  std::string entry_key;            // 1..kMaxEntryKeyChars lowercase hex digits
  std::string state;                // shadow | active | no_win | disabled (1..kMaxStateChars of
                                    // lowercase letters and '_')
  uint64_t active_calls = 0;        // calls the entry served (cumulative)
  // Note [In-process win]: the medians of the trial's timed calls in this process once it ended
  // (0: not yet, or no timing phase).
  uint64_t pytorch_median_ns = 0;
  uint64_t entry_median_ns = 0;
  friend bool operator==(const EntryInProcess&, const EntryInProcess&) = default;
};
inline constexpr size_t kMaxStateChars = 16;

// Encoded as [signature, calls, sampled_calls, sampled_total_ns, input_stats, in_process]; the
// sixth, an array of zero or one EntryInProcess, was appended later (an entry of 5, from an older
// hook, has none).
struct HotEntry {
  OpSignature signature;              // in OpSignature's canonical nested form
  uint64_t calls = 0;                 // intercepted calls
  uint64_t sampled_calls = 0;         // calls that were timed; at most `calls`
  uint64_t sampled_total_ns = 0;      // total device time of the timed calls
  std::vector<InputStats> input_stats;  // at most kMaxStatsPerEntry
  std::vector<EntryInProcess> in_process{};   // zero or one: the entry loaded for this signature
  friend bool operator==(const HotEntry&, const HotEntry&) = default;
};

// Periodic report from the hook's background thread. Encoded as
// [pid, sequence, reports_dropped, entries, gpus_in_use]
// (gpus_in_use appended later: a report of 4 fields, from an older hook, has none).
struct HotReport {
  static constexpr MessageType kType = MessageType::kHotReport;
  int32_t pid = 0;                 // 1..INT32_MAX
  uint64_t sequence = 0;           // 1 for the first report built, +1 for each report built,
                                   // sent or not: a gap the daemon sees is a dropped report
  uint64_t reports_dropped = 0;    // reports built but not sent since the process started
  std::vector<HotEntry> entries;   // at most kMaxReportEntries
  // UUIDs (DeviceInfo::uuid form, none empty) of the GPUs on which this process has an active
  // primary context, i.e. that torch has initialized, as of this report: the whole current set,
  // not a change. At most kMaxDevices. The daemon flags timings on these GPUs.
  std::vector<std::string> gpus_in_use;
  friend bool operator==(const HotReport&, const HotReport&) = default;
};

// One captured input tensor. Encoded as [arg_index, dtype, sizes, strides, bytes].
struct CapturedTensor {
  uint32_t arg_index = 0;          // position in the signature's args; 0..kMaxArgIndex
  DType dtype = DType::kFloat32;   // encoded as its enum value
  std::vector<int64_t> sizes;      // rank at most kMaxTensorRank, each 0..2^62
  std::vector<int64_t> strides;    // as the tensor had them (in elements); same rank as sizes
  // The elements in row-major order (made contiguous by the hook): exactly
  // numel * dtype size bytes. Encoded as msgpack bin.
  std::string bytes;
  friend bool operator==(const CapturedTensor&, const CapturedTensor&) = default;
};

// Real inputs of one signature, sent only when the user enabled capture, for verification.
// Encoded as [pid, signature_id, tensors].
struct CapturedInputs {
  static constexpr MessageType kType = MessageType::kCapturedInputs;
  int32_t pid = 0;                       // 1..INT32_MAX
  SignatureId signature_id;              // bin of 16 bytes, hi then lo, big-endian
  std::vector<CapturedTensor> tensors;   // at most kMaxCapturedTensors
  friend bool operator==(const CapturedInputs&, const CapturedInputs&) = default;
};

// Last message of a serving process. Encoded as [pid, reason].
struct Goodbye {
  static constexpr MessageType kType = MessageType::kGoodbye;
  int32_t pid = 0;          // 1..INT32_MAX
  std::string reason;       // "interpreter exit", "kforge disabled: <why>"
  friend bool operator==(const Goodbye&, const Goodbye&) = default;
};

// ---- daemon -> hooks ----------------------------------------------------------------------------

// A verified kernel was published to the cache. Encoded as
// [signature_id, environment_key, entry_key, speedup].
struct KernelReady {
  static constexpr MessageType kType = MessageType::kKernelReady;
  SignatureId signature_id;         // bin of 16 bytes, hi then lo, big-endian
  EnvironmentKey environment_key;   // the entry's Environment::key(); hooks of other
                                    // environments ignore the message. Same form as signature_id.
  std::string entry_key;            // the cache entry, 1..kMaxEntryKeyChars lowercase hex digits
  double speedup = 1.0;             // measured over PyTorch's kernel; finite and > 0
  friend bool operator==(const KernelReady&, const KernelReady&) = default;
};

// A published entry must no longer be used (quarantined, removed, disabled). Encoded as
// [signature_id, entry_key, reason].
struct Revoke {
  static constexpr MessageType kType = MessageType::kRevoke;
  SignatureId signature_id;   // bin of 16 bytes, hi then lo, big-endian
  std::string entry_key;      // 1..kMaxEntryKeyChars lowercase hex digits
  std::string reason;         // "shadow mismatch in pid 4242: max abs err 3.1e-2"
  friend bool operator==(const Revoke&, const Revoke&) = default;
};

// Alternative i is the struct whose kType is i + 1 (checked below).
using WireMessage = std::variant<Hello, HotReport, CapturedInputs, Goodbye, KernelReady, Revoke>;

MessageType message_type(const WireMessage& m) noexcept;

// The envelope bytes of `m`. Canonical: equal messages give identical bytes.
std::string encode(const WireMessage& m);
// One message from `bytes` (exactly: trailing bytes are an error), within the limits above.
StatusOr<WireMessage> decode(std::string_view bytes);

// ---- what crosses the wire, checked at compile time --------------------------------------------
// Enum values and field types are protocol; a change here must come with a new kWireVersion.
static_assert(sizeof(MessageType) == 1 && sizeof(Backend) == 1 && sizeof(DType) == 1);
static_assert(static_cast<uint8_t>(Backend::kCpu) == 0 && static_cast<uint8_t>(Backend::kCuda) == 1);
static_assert(static_cast<uint8_t>(DType::kFloat8E5M2) == 13 && kDTypeCount == 14);
static_assert(std::is_same_v<decltype(SignatureId::hi), uint64_t> &&
              std::is_same_v<decltype(SignatureId::lo), uint64_t>);
static_assert(std::is_same_v<EnvironmentKey, SignatureId>);
static_assert(std::is_same_v<decltype(Hello::pid), int32_t> &&
              std::is_same_v<decltype(HotReport::pid), int32_t> &&
              std::is_same_v<decltype(CapturedInputs::pid), int32_t> &&
              std::is_same_v<decltype(Goodbye::pid), int32_t>);
static_assert(std::is_same_v<decltype(HotEntry::calls), uint64_t> &&
              std::is_same_v<decltype(HotEntry::sampled_total_ns), uint64_t> &&
              std::is_same_v<decltype(HotReport::reports_dropped), uint64_t>);
static_assert(std::is_same_v<decltype(KernelReady::speedup), double> &&
              std::is_same_v<decltype(InputStats::zero_fraction), double>);
static_assert(std::variant_size_v<WireMessage> == 6);
namespace detail {
template <size_t... I>
constexpr bool variant_matches_types(std::index_sequence<I...>) {
  return ((static_cast<size_t>(std::variant_alternative_t<I, WireMessage>::kType) == I + 1) && ...);
}
}  // namespace detail
static_assert(detail::variant_matches_types(std::make_index_sequence<std::variant_size_v<WireMessage>>()),
              "WireMessage alternative i must be MessageType i + 1");

}  // namespace kforge::wire
