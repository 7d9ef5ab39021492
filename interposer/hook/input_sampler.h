// InputSampler: what the inputs of hot signatures look like (statistics for every signature) and,
// only when the user asks for it (KFORGE_CAPTURE_INPUTS=1), the inputs themselves, for the worker
// to verify candidates on real data as well as on synthetic inputs (DESIGN.md, Worker).
//
//   InputSampler& s = *new InputSampler(capture);         // one per process, never freed
//   // calling thread, at a thread's first call of a signature (Recorder's slow path):
//   s.sample(id, boxed_args, n);
//   // reporter thread, each round:
//   s.drain(pid, extras);                          // stats per signature, CapturedInputs messages
//
// Promises:
// - sample() runs only on the recorder's slow path (a thread's first call of a signature), before
//   PyTorch's kernel, so the snapshot is of the call's inputs. It copies the tensor arguments
//   (contiguous clones; on CUDA, an asynchronous copy on the caller's current stream, through
//   torch's caching allocator) and queues them; it never synchronizes and never does I/O. It
//   samples nothing while the caller's stream is capturing a CUDA graph (the copy would become part
//   of the graph), when the tensors total more than kMaxSampleBytes, or once a signature has been
//   sampled kMaxSamplesPerSignature times in this process. Never throws.
// - drain() runs on the reporter thread: it waits for each CUDA copy on an event recorded right
//   after it (blocking the reporter only), copies to host memory, and computes per tensor
//   argument: min, max, mean and standard deviation over finite elements, NaN and Inf counts and
//   the fraction of zeros (wire::InputStats), accumulated over the samples of the signature. With
//   capture on, each sample also becomes one wire::CapturedInputs message (row-major bytes, the
//   original sizes and strides). The copies are freed after the round.
// - Captured inputs are user data: they leave the process only as CapturedInputs messages to the
//   daemon endpoint (a private ipc directory, or TCP with CURVE keys), and are never logged or
//   written to disk by the hook.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/core/Stream.h>
#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "interposer/hook/recorder.h"
#include "runtime/op_signature.h"
#include "runtime/wire.h"

namespace kforge::hook {

class InputSampler {
 public:
  static constexpr size_t kMaxSampleBytes = 64u << 20;   // tensors of one call; wire's CapturedInputs limit
  static constexpr uint32_t kMaxSamplesPerSignature = 4;
  static constexpr size_t kMaxPendingSamples = 256;      // queued between two rounds

  explicit InputSampler(bool capture) : capture_(capture) {}
  InputSampler(const InputSampler&) = delete;
  InputSampler& operator=(const InputSampler&) = delete;

  // Calling thread. `args` are the call's n boxed arguments.
  void sample(const SignatureId& id, const c10::IValue* args, uint32_t n) noexcept;

  // Reporter thread (Recorder's before_round): the statistics of signatures sampled since the last
  // round (cumulative) into out.stats, CapturedInputs into out.messages.
  void drain(int32_t pid, RoundExtras& out) noexcept;

  struct Counters {
    uint64_t sampled = 0;             // calls whose inputs were copied
    uint64_t skipped_capturing = 0;   // the stream was capturing a CUDA graph
    uint64_t skipped_too_large = 0;   // over kMaxSampleBytes
    uint64_t skipped_busy = 0;        // kMaxPendingSamples already queued
    uint64_t failed = 0;              // a copy or a statistic failed (torch error, out of memory)
    uint64_t captured = 0;            // CapturedInputs messages made
  };
  Counters counters() const;
  bool capture() const noexcept { return capture_; }

 private:
  // A driver event (Note [Sample events] in input_sampler.cc): destroying it returns an error
  // code where c10::Event's destructor could end the process. Move-only.
  class DoneEvent {
   public:
    DoneEvent() = default;
    explicit DoneEvent(CUevent e) noexcept : e_(e) {}
    DoneEvent(DoneEvent&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
    DoneEvent& operator=(DoneEvent&& o) noexcept {
      if (this != &o) {
        reset();
        e_ = o.e_;
        o.e_ = nullptr;
      }
      return *this;
    }
    DoneEvent(const DoneEvent&) = delete;
    DoneEvent& operator=(const DoneEvent&) = delete;
    ~DoneEvent() { reset(); }
    CUevent get() const noexcept { return e_; }
    void reset() noexcept;

   private:
    CUevent e_ = nullptr;
  };

  struct Pending {
    SignatureId id;
    struct Tensor {
      uint32_t arg_index;
      at::Tensor copy;                    // contiguous
      std::vector<int64_t> strides;       // of the original
      std::optional<c10::Stream> stream;  // CUDA: the caller's current stream, which made the copy
      DoneEvent done{};                   // CUDA: recorded on `stream` after the copy
    };
    std::vector<Tensor> tensors;
  };
  struct Accumulator {
    double min = 0, max = 0, sum = 0, sum_sq = 0;
    uint64_t finite = 0, nan = 0, inf = 0, zeros = 0, elements = 0;
  };

  const bool capture_;
  mutable std::mutex mu_;   // guards everything below; never held while torch runs
  std::vector<Pending> pending_;
  std::map<SignatureId, uint32_t> samples_;                               // per signature, ever
  std::map<SignatureId, std::map<uint32_t, Accumulator>> accumulators_;   // reporter thread only
  Counters counters_;
};

}  // namespace kforge::hook
