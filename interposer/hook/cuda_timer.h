// CudaTimer: device time of sampled CUDA calls, measured with CUDA events, never waited for on the
// calling thread.
//
//   CudaTimer& t = *new CudaTimer();                       // one per process, never freed
//   // calling thread, a sampled CUDA call (Recorder::Call::sample):
//   CudaTimer::Mark m = t.begin(device_index);             // records a start event, or not
//   original(...);
//   t.end(m, signature_id);                                // records the end event, queues the pair
//   // reporter thread, each round (Recorder's before_round):
//   t.collect(extras);                                     // finished pairs -> extras.timed
//
// Promises:
// - begin() records nothing (and end() does nothing) when the device's current stream is
//   capturing a CUDA graph (an event record would become part of the graph), when no driver is
//   loaded, or when an event cannot be had; the call is then simply not timed. Events are
//   recorded on torch's current stream of the tensors' device, with that device current.
// - The calling thread never waits: collect() asks cuEventQuery on the reporter thread and keeps
//   pairs that are not done for a later round (a pair older than kMaxPendingRounds rounds is
//   dropped). Events are recycled per device, never destroyed.
// - Pending pairs are bounded (kMaxPending): beyond that, sampled calls are not timed.
// - Each thread times at most kMaxTimedPerThreadPerSecond calls per second (a window per thread,
//   restarted by the first sampled call a second or more after the window began); beyond that,
//   sampled calls are not timed (skipped_budget). Note [CUDA timing budget] in cuda_timer.cc.
// - Nothing throws.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <mutex>
#include <vector>

#include "interposer/hook/recorder.h"
#include "runtime/op_signature.h"

namespace kforge::hook {

class CudaTimer {
 public:
  static constexpr size_t kMaxPending = 1024;
  static constexpr uint32_t kMaxPendingRounds = 100;
  static constexpr int kMaxDevices = 64;
  static constexpr uint32_t kMaxTimedPerThreadPerSecond = 32;

  struct Mark {
    CUevent start = nullptr;   // null: this call is not timed
    CUstream stream = nullptr;
    int device = -1;
  };

  CudaTimer() = default;
  CudaTimer(const CudaTimer&) = delete;
  CudaTimer& operator=(const CudaTimer&) = delete;

  Mark begin(int device) noexcept;
  void end(const Mark& m, const SignatureId& id) noexcept;
  void collect(RoundExtras& out) noexcept;

  struct Counters {
    uint64_t timed = 0;              // pairs measured and handed to the recorder
    uint64_t skipped_capturing = 0;  // sampled calls during graph capture
    uint64_t skipped_other = 0;      // no driver, no event, queue full, record failed
    uint64_t dropped_stale = 0;      // pairs never done within kMaxPendingRounds
    uint64_t skipped_budget = 0;     // sampled calls beyond the thread's kMaxTimedPerThreadPerSecond
  };
  Counters counters() const;

 private:
  struct Pair {
    SignatureId id;
    CUevent start;
    CUevent end;
    int device;
    uint32_t rounds = 0;
  };
  CUevent take_event(int device) noexcept;   // under mu_ for the pool; creates in device's context
  void give_back(int device, CUevent e);     // under mu_

  mutable std::mutex mu_;
  std::vector<CUevent> free_[kMaxDevices];
  std::vector<Pair> pending_;
  Counters counters_;
};

}  // namespace kforge::hook
