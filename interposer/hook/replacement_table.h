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

#include <atomic>
#include <bit>
#include <cstdint>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "runtime/op_signature.h"

namespace kforge::hook {

}  // namespace kforge::hook

namespace kforge {
struct KernelSpec;
struct ResolvedLaunchPlan;
class CpuModule;
}  // namespace kforge

namespace kforge::hook {

class Swapper;

// Where an entry is in its life in this process (Note [Swap states] in swapper.h).
enum class SwapState : uint8_t { kShadow = 0, kActive = 1 };

// Counters of one loaded entry, shared by every Replacement made for it (shadow, then active).
// Bumped by calling threads with relaxed read-modify-writes: only hits pay for them.
struct SwapCounters {
  std::atomic<uint64_t> shadow_calls{0};
  std::atomic<uint64_t> active_calls{0};
  std::atomic<uint64_t> fallbacks{0};        // active calls that fell back to PyTorch's kernel
  std::atomic<uint32_t> clean_shadow_calls{0};
};

// What a hit runs: a loaded CPU entry, its plan resolved for this signature. Immutable once
// published (only the counters change); never freed, like the tables that point at it.
struct Replacement {
  SignatureId id;                     // the signature
  SignatureId key;                    // the cache entry (EntryKey)
  SwapState state = SwapState::kShadow;
  uint32_t shadow_target = 20;        // clean shadow calls that end the trial
  bool activate_after_shadow = true;  // KFORGE_MODE=active; shadow mode keeps shadowing
  const KernelSpec* spec = nullptr;
  const ResolvedLaunchPlan* plan = nullptr;
  const CpuModule* module = nullptr;
  SwapCounters* counters = nullptr;
  Swapper* owner = nullptr;
};

class ReplacementTable {
 public:
  // Open addressing over a power-of-two array at most half full: a miss is usually one probe.
  static const ReplacementTable* build(std::vector<std::pair<SignatureId, const Replacement*>> entries) {
    auto* t = new ReplacementTable();
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
  // Makes `t` the table in force. The previous one is kept alive for the life of the process.
  static void publish(const ReplacementTable* t) noexcept {
    published().store(t, std::memory_order_release);
  }

  const Replacement* find(const SignatureId& id) const noexcept {
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

  static std::atomic<const ReplacementTable*>& published() noexcept {
    // Function-local and never destroyed: calls may arrive during static destruction at exit.
    static auto* p = new std::atomic<const ReplacementTable*>(new ReplacementTable());
    return *p;
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

}  // namespace kforge::hook
