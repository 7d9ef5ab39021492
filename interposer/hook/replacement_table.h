// ReplacementTable: the kernels the fast path runs instead of PyTorch's, by SignatureId. Immutable
// once built; a new table is published through one atomic pointer (read-copy-update) and the old
// one is never freed, so a thread still probing it is never left with a dangling pointer (tables
// are small and replaced rarely). The fast path reads it with one acquire load, takes no lock and
// allocates nothing.
//
//   const ReplacementTable* t = ReplacementTable::current();
//   if (const Replacement* r = t->find(id)) { ... }   // observe mode: the table is empty
//   ReplacementTable::publish(ReplacementTable::build({{id, replacement}}));   // Swapper only
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <cuda.h>   // CUcontext only: no CUDA library is linked (runtime/cuda_driver.h)

#include "interposer/hook/hook_work.h"
#include "runtime/op_catalog.h"
#include "runtime/op_signature.h"

namespace kforge {
struct KernelSpec;
struct ResolvedLaunchPlan;
class CpuModule;
class CudaDriver;
class CudaKernel;
}  // namespace kforge

namespace kforge::hook {

class Swapper;

// Where an entry is in its life in this process (Note [Swap states] in swapper.h). kTiming: the
// end of a CPU entry's trial, calls served alternately by PyTorch's kernel and the entry (Note
// [Timing phase]); the stats still say "shadow" (on trial).
enum class SwapState : uint8_t { kShadow = 0, kActive = 1, kTiming = 2 };

// Counters of one loaded entry, shared by every Replacement made for it (shadow, then active).
// Bumped by calling threads with relaxed read-modify-writes: only hits pay for them.
struct SwapCounters {
  std::atomic<uint64_t> shadow_calls{0};
  std::atomic<uint64_t> active_calls{0};
  std::atomic<uint64_t> fallbacks{0};        // active calls that fell back to PyTorch's kernel
  std::atomic<uint32_t> clean_shadow_calls{0};
  // CUDA only. Calls on a device the entry is not loaded on: PyTorch's kernel ran (not a failure).
  std::atomic<uint64_t> unloaded_device_calls{0};
  // CUDA only. Shadow-state calls while the stream was capturing a CUDA graph: PyTorch's kernel
  // only, no comparison (it would synchronize), not counted in shadow_calls (Note [Swap states]).
  std::atomic<uint64_t> capture_shadow_skips{0};
  std::atomic<uint64_t> memory_shadow_skips{0};   // Note [Out of memory in a shadow call]
  // The trial's timings (Note [In-process win] in swapper.h): PyTorch's kernel and the entry on
  // the same inputs, one pair per clean shadow call, in a ring of the last kTimedPairs. A calling
  // thread takes a slot with timed_pairs, stores both times, then counts its clean call with an
  // acq_rel increment of clean_shadow_calls, so the thread whose call ends the trial sees every
  // earlier pair.
  // With a timing phase (Note [Timing phase] in swapper.h) the shadow calls leave the ring alone
  // and the phase's pair p writes slot p (p < the phase's pairs <= kTimedPairs): a calling thread
  // takes its call's number with timing_calls, stores its time in its pair's slot, then counts it
  // with an acq_rel increment of timing_done (the call that completes the phase judges it).
  static constexpr uint32_t kTimedPairs = 256;
  std::atomic<uint32_t> timed_pairs{0};
  std::atomic<uint64_t> pytorch_ns[kTimedPairs] = {};
  std::atomic<uint64_t> entry_ns[kTimedPairs] = {};
  std::atomic<uint64_t> timing_calls{0};   // calls taken in the timing phase (either kernel)
  std::atomic<uint32_t> timing_done{0};    // of those, calls whose time is stored
};

// A CUDA entry's module on one device, loaded in that device's primary context (the context torch
// uses there), which the loader retained for the life of the process.
struct CudaDeviceModule {
  const CudaKernel* kernel = nullptr;
  CUcontext context = nullptr;
};

// A CUDA entry's modules, by device ordinal (torch's device index). Shared by every Replacement
// made for the entry (shadow, then active). The loader (reporter thread) fills a slot once, from
// null to its final value with a release store, when it has loaded the entry on that device; a
// slot is never cleared, and nothing it points at is ever freed or unloaded (a captured CUDA graph
// may launch the kernels until the process ends). Calling threads read a slot with one acquire
// load; a null slot means "not loaded on this device": that call runs PyTorch's kernel.
struct CudaModules {
  static constexpr int kMaxDevices = 64;   // as TargetArch::kMaxCudaDevices

  explicit CudaModules(const CudaDriver* d) : driver(d) {}
  CudaModules(const CudaModules&) = delete;
  CudaModules& operator=(const CudaModules&) = delete;

  const CudaDeviceModule* on_device(int ordinal) const noexcept {
    if (ordinal < 0 || ordinal >= kMaxDevices) return nullptr;
    return by_device[ordinal].load(std::memory_order_acquire);
  }

  const CudaDriver* const driver;   // the process-wide CudaDriver::load(); never null
  std::atomic<const CudaDeviceModule*> by_device[kMaxDevices] = {};
};

// What a hit runs: a loaded entry, its plan resolved for this signature. Immutable once published
// (only the counters and CudaModules' slots change); never freed, like the tables that point at it.
// A Replacement is retired, never freed, when a better entry takes its signature (Note [Daemon
// notices] in swapper.h): a thread may still be running it from an older table.
struct Replacement {
  SignatureId id;                     // the signature
  SignatureId key;                    // the cache entry (EntryKey)
  SwapState state = SwapState::kShadow;
  Backend backend = Backend::kCpu;    // the signature's target backend, and the entry's
  uint32_t shadow_target = 20;        // clean shadow calls that end the trial
  bool activate_after_shadow = true;  // KFORGE_MODE=active; shadow mode keeps shadowing
  bool confirm_win = true;            // KFORGE_CONFIRM_WIN: the trial must show a win here too
  uint32_t timing_pairs = 0;          // KFORGE_TIMING_PAIRS where a timing phase applies, else 0
  const KernelSpec* spec = nullptr;
  const ResolvedLaunchPlan* plan = nullptr;
  const CpuModule* module = nullptr;  // Backend::kCpu
  CudaModules* cuda = nullptr;        // Backend::kCuda
  SwapCounters* counters = nullptr;
  Swapper* owner = nullptr;
};

// A set of ObserveSlots slots.
class ObserveMask {
 public:
  static constexpr size_t kWords = kObserveSlots / 64;
  static ObserveMask none() noexcept { return ObserveMask(); }
  static ObserveMask all() noexcept {
    ObserveMask m;
    for (uint64_t& w : m.words_) w = ~uint64_t{0};
    return m;
  }
  void set(uint32_t slot) noexcept {
    if (slot < kObserveSlots) words_[slot / 64] |= uint64_t{1} << (slot % 64);
  }
  [[gnu::always_inline]] bool has(uint32_t slot) const noexcept {
    return slot >= kObserveSlots || ((words_[slot / 64] >> (slot % 64)) & 1) != 0;
  }
  bool empty() const noexcept {
    for (uint64_t w : words_) {
      if (w != 0) return false;
    }
    return true;
  }
  ObserveMask& operator|=(const ObserveMask& o) noexcept {
    for (size_t i = 0; i < kWords; ++i) words_[i] |= o.words_[i];
    return *this;
  }
  uint64_t word(size_t i) const noexcept { return words_[i]; }
  friend bool operator==(const ObserveMask&, const ObserveMask&) = default;

 private:
  uint64_t words_[kWords] = {};
};

class ObserveSlots {
 public:
  static ObserveSlots& instance() {
    static auto* s = new ObserveSlots();   // never destroyed: read until the process ends
    return *s;
  }
  // A new slot for (op, overload, backend), or kObserveSlots when none is left.
  uint32_t assign(std::string_view op, std::string_view overload, Backend backend) {
    std::lock_guard<std::mutex> lock(mu_);
    if (keys_.size() >= kObserveSlots) return kObserveSlots;
    keys_.push_back(key(op, overload, backend));
    return static_cast<uint32_t>(keys_.size() - 1);
  }
  // Every slot assigned to (op, overload, backend); every slot when there is none (an operator not
  // known here is then observed on every call, never skipped wrongly).
  ObserveMask mask(std::string_view op, std::string_view overload, Backend backend) const {
    const std::string k = key(op, overload, backend);
    std::lock_guard<std::mutex> lock(mu_);
    ObserveMask m;
    for (size_t i = 0; i < keys_.size(); ++i) {
      if (keys_[i] == k) m.set(static_cast<uint32_t>(i));
    }
    return m.empty() ? ObserveMask::all() : m;
  }

 private:
  static std::string key(std::string_view op, std::string_view overload, Backend backend) {
    return std::string(op) + "." + std::string(overload) + (backend == Backend::kCuda ? "@cuda" : "@cpu");
  }
  mutable std::mutex mu_;
  std::vector<std::string> keys_;
};

class ReplacementTable {
 public:
  // Open addressing over a power-of-two array at most half full: a miss is usually one probe.
  // `observe_mask`: the ObserveSlots bits of the operators the entries are for.
  static const ReplacementTable* build(std::vector<std::pair<SignatureId, const Replacement*>> entries,
                                       ObserveMask observe_mask = ObserveMask::none()) {
    auto* t = new ReplacementTable();
    t->observe_mask_ = entries.empty() ? ObserveMask::none() : observe_mask;
    if (entries.empty()) return t;
    const size_t cap = std::bit_ceil(entries.size() * 2);
    t->slots_.resize(cap);
    t->mask_ = cap - 1;
    for (auto& [id, r] : entries) {
      size_t i = static_cast<size_t>(id.lo) & t->mask_;
      while (t->slots_[i].replacement != nullptr && !(t->slots_[i].id == id)) i = (i + 1) & t->mask_;
      t->slots_[i] = {id, r};
    }
    return t;
  }

  // The table in force; never null.
  static const ReplacementTable* current() noexcept {
    return published().load(std::memory_order_acquire);
  }
  // Makes `t` the table in force. The previous one is kept alive for the life of the process (a
  // calling thread may still be reading it), on a list that keeps it reachable, so leak checkers
  // see it kept, not lost.
  static void publish(const ReplacementTable* t) noexcept {
    for (size_t i = 0; i < ObserveMask::kWords; ++i) serving_[i].store(t->observe_mask_.word(i), std::memory_order_relaxed);
    retire(published().exchange(t, std::memory_order_acq_rel));
  }

  // serves(slot) of the table in force, from a copy of its mask in the hook's static data: what an
  // unobserved call reads (Note [Interceptor fast path] in interceptor.cc), one load where
  // current()->serves() is a chain of three (the guarded function-local pointer, the atomic, the
  // table). publish() writes the copy just before the table, so a thread may read a bit of the
  // previous table for a moment: that delays, by a call or a few, when every call of an operator
  // starts or stops being observed, and nothing else (a hit is still looked up in current()).
  [[gnu::always_inline]] static bool serving(uint32_t slot) noexcept {
    return slot >= kObserveSlots ||
           ((serving_[slot / 64].load(std::memory_order_relaxed) >> (slot % 64)) & 1) != 0;
  }

  // Whether a call of the operator in ObserveSlots slot `slot` may have a replacement here, so
  // that every such call must be observed. Slots beyond kObserveSlots: always.
  [[gnu::always_inline]] bool serves(uint32_t slot) const noexcept {
    return observe_mask_.has(slot);
  }

  [[gnu::always_inline]] const Replacement* find(const SignatureId& id) const noexcept {
    if (slots_.empty()) return nullptr;
    for (size_t i = static_cast<size_t>(id.lo) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.replacement == nullptr) return nullptr;
      if (s.id == id) return s.replacement;
    }
  }

 private:
  struct Slot {
    SignatureId id;
    const Replacement* replacement = nullptr;
  };
  ReplacementTable() = default;

  static void retire(const ReplacementTable* old) noexcept {
    // Function-local and never destroyed, as published(). Out of memory: the table is simply not
    // listed (it stays alive all the same).
    static auto* mu = new std::mutex();
    static auto* retired = new std::vector<const ReplacementTable*>();
    try {
      std::lock_guard<std::mutex> lock(*mu);
      retired->push_back(old);
    } catch (...) {
    }
  }

  static std::atomic<const ReplacementTable*>& published() noexcept {
    // Function-local and never destroyed: calls may arrive during static destruction at exit.
    static auto* p = new std::atomic<const ReplacementTable*>(new ReplacementTable());
    return *p;
  }

  static inline constinit std::atomic<uint64_t> serving_[ObserveMask::kWords] = {};

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  ObserveMask observe_mask_;
};

}  // namespace kforge::hook
