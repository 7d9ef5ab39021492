#include "search_daemon/worker/cupti_timer.h"

#include <cupti.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace kforge::eval {

// The CUPTI entry points the timer uses, resolved with dlsym (CUPTI is never linked: a worker on a
// host without it times with events).
struct CuptiKernelTimer::Api {
  void* handle = nullptr;
  decltype(&::cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&::cuptiActivityEnable) enable = nullptr;
  decltype(&::cuptiActivityDisable) disable = nullptr;
  decltype(&::cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&::cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&::cuptiActivityGetNumDroppedRecords) dropped_records = nullptr;
  decltype(&::cuptiGetResultString) result_string = nullptr;
};

namespace {

constexpr size_t kBufferBytes = 8u << 20;

// CUPTI calls these from its own threads or inside flush: they only touch this state.
std::mutex g_mu;
const CuptiKernelTimer::Api* g_api = nullptr;
double g_ns = 0;
uint32_t g_activities = 0;
uint64_t g_dropped = 0;
std::atomic<bool> g_instance{false};

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t size, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_api != nullptr && buffer != nullptr) {
    CUpti_Activity* record = nullptr;
    while (g_api->next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
      uint64_t start = 0, end = 0;
      switch (record->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
          const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
          start = k->start;
          end = k->end;
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
          start = m->start;
          end = m->end;
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
          start = m->start;
          end = m->end;
          break;
        }
        default:
          continue;
      }
      if (end > start) {
        g_ns += static_cast<double>(end - start);
        ++g_activities;
      }
    }
    size_t dropped = 0;
    if (g_api->dropped_records != nullptr && g_api->dropped_records(ctx, stream, &dropped) == CUPTI_SUCCESS) {
      g_dropped += dropped;
    }
  }
  (void)size;
  std::free(buffer);
}

template <class F>
bool resolve(void* handle, const char* name, F& out) {
  void* p = ::dlsym(handle, name);
  if (p == nullptr) return false;
  std::memcpy(&out, &p, sizeof out);
  return true;
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMSET,
                                         CUPTI_ACTIVITY_KIND_MEMCPY};

}  // namespace

StatusOr<std::unique_ptr<CuptiKernelTimer>> CuptiKernelTimer::start() {
  if (g_instance.exchange(true)) return unavailable("a CUPTI timer already runs in this process");
  std::unique_ptr<CuptiKernelTimer> t(new CuptiKernelTimer());
  t->api_ = std::make_unique<Api>();
  Api& a = *t->api_;
  // PyTorch's libtorch links libcupti: the process has one already, the one to use.
  for (const char* name : {"libcupti.so.13", "libcupti.so.12", "libcupti.so"}) {
    a.handle = ::dlopen(name, RTLD_NOW | RTLD_NOLOAD);
    if (a.handle != nullptr) {
      t->path_ = name;
      break;
    }
  }
  for (const char* name : {"libcupti.so.13", "libcupti.so.12", "libcupti.so"}) {
    if (a.handle != nullptr) break;
    a.handle = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (a.handle != nullptr) t->path_ = name;
  }
  if (a.handle == nullptr) {
    g_instance.store(false);
    return unavailable("no libcupti in the process or on the loader's path");
  }
  const bool ok = resolve(a.handle, "cuptiActivityRegisterCallbacks", a.register_callbacks) &&
                  resolve(a.handle, "cuptiActivityEnable", a.enable) && resolve(a.handle, "cuptiActivityDisable", a.disable) &&
                  resolve(a.handle, "cuptiActivityFlushAll", a.flush_all) &&
                  resolve(a.handle, "cuptiActivityGetNextRecord", a.next_record) &&
                  resolve(a.handle, "cuptiGetResultString", a.result_string);
  (void)resolve(a.handle, "cuptiActivityGetNumDroppedRecords", a.dropped_records);
  if (!ok) {
    g_instance.store(false);
    return unavailable(t->path_ + " lacks the activity API entry points");
  }
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_api = &a;
  }
  CUptiResult r = a.register_callbacks(&buffer_requested, &buffer_completed);
  for (CUpti_ActivityKind k : kKinds) {
    if (r == CUPTI_SUCCESS) r = a.enable(k);
  }
  if (r != CUPTI_SUCCESS) {
    const char* why = nullptr;
    a.result_string(r, &why);
    std::lock_guard<std::mutex> lock(g_mu);
    g_api = nullptr;
    g_instance.store(false);
    return unavailable(std::string("CUPTI activity tracing unavailable: ") + (why != nullptr ? why : "unknown error"));
  }
  return t;
}

CuptiKernelTimer::~CuptiKernelTimer() {
  if (api_ == nullptr) return;
  for (CUpti_ActivityKind k : kKinds) (void)api_->disable(k);
  (void)api_->flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(g_mu);
  g_api = nullptr;
  g_instance.store(false);
}

void CuptiKernelTimer::reset() {
  (void)api_->flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(g_mu);
  g_ns = 0;
  g_activities = 0;
  g_dropped = 0;
}

CuptiKernelTimer::Sum CuptiKernelTimer::collect() {
  (void)api_->flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(g_mu);
  return Sum{g_ns, g_activities, g_dropped};
}

}  // namespace kforge::eval
