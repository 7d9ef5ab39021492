#include "search_daemon/daemon/prebuilder.h"

#include <sched.h>
#include <sys/resource.h>

#include <map>
#include <optional>
#include <utility>

#include "runtime/cuda_environment.h"
#include "runtime/nvrtc.h"
#include "search_daemon/worker/builder.h"

namespace kforge::daemon {

Prebuilder::Prebuilder(PrebuilderOptions options) : options_(std::move(options)) {
  threads_.reserve(options_.threads);
  for (uint32_t i = 0; i < options_.threads; ++i) threads_.emplace_back([this] { run(); });
}

Prebuilder::~Prebuilder() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  idle_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void Prebuilder::hint(const KernelSpec& spec, const std::string& proposer, const std::string& arch) noexcept {
  if (spec.backend != Backend::kCuda || proposer != "template") return;
  try {
    Item item;
    const bool arch_ok = parse_cuda_arch(arch, item.sm_major, item.sm_minor);
    const std::string id = spec.id().hex() + "/" + arch;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.hinted;
      if (!arch_ok) {
        ++stats_.failed;
        return;
      }
      if (stopping_ || threads_.empty()) return;
      if (seen_.size() >= kMaxRemembered) seen_.clear();
      if (!seen_.insert(id).second) return;
      item.spec = spec;
      queue_.push_back(std::move(item));
      ++stats_.queued;
      if (queue_.size() > kMaxQueued) {
        queue_.pop_front();
        ++stats_.dropped;
      }
    }
    cv_.notify_one();
  } catch (...) {
    // Out of memory copying the spec: the worker builds it, as without a prebuilder.
  }
}

Prebuilder::Stats Prebuilder::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Prebuilder::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return (queue_.empty() && busy_ == 0) || stopping_; });
}

void Prebuilder::run() {
  if (options_.idle_priority) {
    // Note [Builds ahead]: this thread only (Linux applies both to the calling thread).
    const sched_param param{};
    if (::sched_setscheduler(0, SCHED_IDLE, &param) != 0) (void)::setpriority(PRIO_PROCESS, 0, 19);
  }
  // One builder per architecture, on this thread (NVRTC's compile() may run on several threads).
  std::map<std::pair<int, int>, std::optional<CandidateBuilder>> builders;
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      // The newest first: the search's latest expansion is what it evaluates next.
      item = std::move(queue_.back());
      queue_.pop_back();
      ++busy_;
    }
    bool built = false, cached = false;
    double ms = 0;
    try {
      std::optional<CandidateBuilder>& b = builders[{item.sm_major, item.sm_minor}];
      if (!b) {
        StatusOr<const Nvrtc*> nvrtc = Nvrtc::load();
        if (nvrtc.ok()) {
          StatusOr<CandidateBuilder> made =
              CandidateBuilder::for_cuda(options_.cache_dir, *nvrtc, item.sm_major, item.sm_minor);
          if (made.ok()) b.emplace(std::move(*made));
        }
      }
      if (b) {
        StatusOr<BuildOutput> out = b->build(item.spec, options_.compile_budget_ms);
        if (out.ok() && out->compiled) {
          cached = out->cached;
          built = !out->cached;
          ms = out->build_ms;
        }
      }
    } catch (...) {
      // Out of memory: counted as failed; the worker builds it.
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      --busy_;
      if (built) {
        ++stats_.built;
        stats_.build_ms += ms;
      } else if (cached) {
        ++stats_.cached;
      } else {
        ++stats_.failed;
      }
      if (queue_.empty() && busy_ == 0) idle_cv_.notify_all();
    }
  }
}

}  // namespace kforge::daemon
