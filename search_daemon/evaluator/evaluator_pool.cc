#include "search_daemon/evaluator/evaluator_pool.h"

#include <sched.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/cuda_driver.h"

namespace kforge::eval {

struct EvaluatorPool::Slot {
  SlotInfo info;
  Backend backend = Backend::kCpu;
  bool waiting = false;   // started and not busy: a candidate for choose_slot
  bool started = false;   // its worker's first start is over, ready or failed (wait_started)
  bool busy = false;
  std::thread thread;
};

std::vector<std::vector<int>> cpu_slot_cores(const std::vector<int>& allowed, uint32_t slots, uint32_t threads,
                                             bool share_host) {
  std::vector<std::vector<int>> out(slots);
  if (allowed.empty() || slots == 0) return out;
  const size_t usable = share_host ? allowed.size() / 2 : allowed.size();
  const size_t n = std::min<size_t>(allowed.size(), threads > 0 ? threads : std::max<size_t>(1, usable / slots));
  for (uint32_t i = 0; i < slots; ++i) {
    for (size_t k = 0; k < n; ++k) out[i].push_back(allowed[(i * n + k) % allowed.size()]);
  }
  return out;
}

std::vector<int> allowed_cpus() {
  std::vector<int> out;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  return out;
}

std::string cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (int c : cpus) out += (out.empty() ? "" : ",") + std::to_string(c);
  return out;
}

size_t choose_slot(const std::vector<SlotCandidate>& idle) {
  size_t best = 0;
  for (size_t i = 1; i < idle.size(); ++i) {
    if (idle[i].serving_processes < idle[best].serving_processes) best = i;
  }
  return idle[best].slot;
}

EvaluatorPool::EvaluatorPool(PoolOptions options) : options_(std::move(options)) {}

EvaluatorPool::~EvaluatorPool() { stop(); }

Status EvaluatorPool::start() {
  std::vector<std::string> devices;
  for (const std::string& d : options_.devices) {
    if (d == "auto") {
      int count = 0;
      StatusOr<const CudaDriver*> cu = CudaDriver::load();
      if (cu.ok() && (*cu)->cuDeviceGetCount(&count) == CUDA_SUCCESS) {
        for (int i = 0; i < count; ++i) devices.push_back("cuda:" + std::to_string(i));
      } else if (options_.log) {
        options_.log("no CUDA devices (" + (cu.ok() ? std::string("cuDeviceGetCount failed") : cu.status().message()) +
                     "): CPU slots only");
      }
      if (options_.cpu_slots > 0) devices.push_back("cpu");
    } else {
      devices.push_back(d);
    }
  }
  // One slot per GPU (timing runs never share a GPU); cpu_slots CPU slots for "cpu".
  std::vector<std::string> slots;
  for (const std::string& d : devices) {
    if (std::find(slots.begin(), slots.end(), d) != slots.end()) continue;
    if (d == "cpu") {
      for (uint32_t i = 0; i < options_.cpu_slots; ++i) slots.push_back("cpu");
    } else {
      int count = 0;
      StatusOr<const CudaDriver*> cu = CudaDriver::load();
      if (!cu.ok()) return unavailable(d + ": no CUDA driver: " + cu.status().message());
      (void)(*cu)->cuDeviceGetCount(&count);
      const int index = std::stoi(d.substr(5));
      if (index >= count) return invalid_argument(d + " does not exist (" + std::to_string(count) + " CUDA devices visible)");
      slots.push_back(d);
    }
  }
  if (slots.empty()) return invalid_argument("no evaluation slots: no GPU and workers.cpu_slots = 0");
  const std::vector<std::vector<int>> cores = cpu_slot_cores(
      allowed_cpus(), static_cast<uint32_t>(std::count(slots.begin(), slots.end(), "cpu")), options_.cpu_threads,
      options_.priority == WorkerPriority::kIdle);
  std::lock_guard<std::mutex> lock(mu_);
  size_t cpu_index = 0;
  for (const std::string& d : slots) {
    auto s = std::make_unique<Slot>();
    s->info.device = d;
    s->info.state = "starting";
    s->backend = d == "cpu" ? Backend::kCpu : Backend::kCuda;
    if (s->backend == Backend::kCpu && cpu_index < cores.size()) s->info.cpus = cores[cpu_index++];
    slots_.push_back(std::move(s));
  }
  for (auto& s : slots_) {
    Slot* raw = s.get();
    raw->thread = std::thread([this, raw] { run_slot(*raw); });
  }
  return Status();
}

bool EvaluatorPool::matches(const Slot& s, const OpSignature& sig) const {
  if (s.backend != sig.target.backend) return false;
  // A slot whose worker has not reported yet takes its backend's jobs; once it has, only its arch.
  return s.info.arch.empty() || s.info.arch == sig.target.arch;
}

size_t EvaluatorPool::slots_for(const OpSignature& sig) const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& s : slots_) n += matches(*s, sig) ? 1 : 0;
  return n;
}

size_t EvaluatorPool::idle_slots_for(const OpSignature& sig) const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& s : slots_) n += (matches(*s, sig) && !s->busy) ? 1 : 0;
  size_t queued = 0;
  for (const auto& [job, done] : queue_) queued += job.signature.target == sig.target ? 1 : 0;
  return n > queued ? n - queued : 0;
}

namespace {

std::string read_line(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::string s;
  std::getline(in, s);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// sysfs's "48K" / "2048K" / "32M" as "48 KiB", "2 MiB", "32 MiB".
std::string cache_size_text(const std::string& s) {
  if (s.empty()) return {};
  char unit = s.back();
  uint64_t n = 0;
  try {
    n = std::stoull(std::isdigit(static_cast<unsigned char>(unit)) != 0 ? s : s.substr(0, s.size() - 1));
  } catch (...) {
    return s;
  }
  if (std::isdigit(static_cast<unsigned char>(unit)) != 0) unit = 'B';
  if (unit == 'K' && n >= 1024 && n % 1024 == 0) return std::to_string(n / 1024) + " MiB";
  if (unit == 'M' && n >= 1024 && n % 1024 == 0) return std::to_string(n / 1024) + " GiB";
  return std::to_string(n) + (unit == 'K' ? " KiB" : unit == 'M' ? " MiB" : unit == 'G' ? " GiB" : " B");
}

// How many cores a sysfs cpu list ("0-3,8") names.
size_t cpu_list_size(const std::string& list) {
  size_t n = 0;
  std::stringstream ss(list);
  std::string part;
  while (std::getline(ss, part, ',')) {
    try {
      const size_t dash = part.find('-');
      n += dash == std::string::npos ? 1 : std::stoul(part.substr(dash + 1)) - std::stoul(part.substr(0, dash)) + 1;
    } catch (...) {
    }
  }
  return n;
}

}  // namespace

std::string cpu_cache_text(int core, const std::string& root) {
  std::vector<std::string> own, shared;
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::path(root) / ("cpu" + std::to_string(core)) / "cache";
  std::vector<std::filesystem::path> indices;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().filename().string().rfind("index", 0) == 0) indices.push_back(e.path());
  }
  std::sort(indices.begin(), indices.end());
  for (const auto& d : indices) {
    const std::string type = read_line(d / "type"), level = read_line(d / "level"), size = read_line(d / "size");
    if (type == "Instruction" || level.empty() || size.empty()) continue;
    const std::string name = "L" + level + (type == "Data" ? "d" : "") + " " + cache_size_text(size);
    const size_t sharers = cpu_list_size(read_line(d / "shared_cpu_list"));
    if (sharers > 1) {
      shared.push_back(name + " shared by " + std::to_string(sharers) + " cores");
    } else {
      own.push_back(name);
    }
  }
  std::string s;
  for (size_t i = 0; i < own.size(); ++i) s += (i ? ", " : "") + own[i];
  if (!own.empty()) s += " per core";
  for (size_t i = 0; i < shared.size(); ++i) s += (s.empty() ? "" : i ? ", " : "; ") + shared[i];
  return s;
}

std::string EvaluatorPool::device_facts_for(const OpSignature& sig) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& s : slots_) {
    if (!matches(*s, sig) || s->info.device_model.empty()) continue;
    const SlotInfo& i = s->info;
    if (s->backend != Backend::kCpu) return "GPU: " + i.device_model + " (" + i.arch + ").";
    std::string t = "CPU: " + i.device_model + " (" + i.arch + ").";
    if (!i.cpus.empty()) {
      const std::string n = std::to_string(i.cpus.size());
      t += " The worker runs PyTorch's kernel and every candidate with " + n + (i.cpus.size() == 1 ? " thread" : " threads") +
           " pinned to " + n + (i.cpus.size() == 1 ? " core" : " cores") + " (" + cpu_list(i.cpus) +
           "): a launch's blocks are spread over those threads.";
      if (const std::string caches = cpu_cache_text(i.cpus.front()); !caches.empty()) t += " Caches: " + caches + ".";
    }
    return t;
  }
  return {};
}

double EvaluatorPool::bandwidth_for(const OpSignature& sig) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& s : slots_) {
    if (matches(*s, sig) && s->info.bandwidth_bytes_per_s > 0) return s->info.bandwidth_bytes_per_s;
  }
  return 0;
}

const std::vector<int32_t>* EvaluatorPool::serving_on(const Slot& s) const {
  if (s.info.uuid.empty()) return nullptr;
  auto it = serving_.find(s.info.uuid);
  return it == serving_.end() ? nullptr : &it->second;
}

bool EvaluatorPool::chosen_for(const Slot& s, const OpSignature& sig) const {
  std::vector<SlotCandidate> idle;
  size_t self = slots_.size();
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& t = *slots_[i];
    if (!t.waiting || !matches(t, sig)) continue;
    const std::vector<int32_t>* pids = serving_on(t);
    idle.push_back(SlotCandidate{i, pids == nullptr ? 0 : pids->size()});
    if (&t == &s) self = i;
  }
  return self < slots_.size() && choose_slot(idle) == self;
}

void EvaluatorPool::set_serving_gpus(std::map<std::string, std::vector<int32_t>> pids_by_uuid) {
  std::lock_guard<std::mutex> lock(mu_);
  if (pids_by_uuid == serving_) return;
  serving_ = std::move(pids_by_uuid);
  cv_.notify_all();   // the choice of slot may have changed for queued jobs
}

bool EvaluatorPool::wait_started(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] {
    return std::all_of(slots_.begin(), slots_.end(), [](const std::unique_ptr<Slot>& s) { return s->started; });
  });
}

std::vector<SlotInfo> EvaluatorPool::slots() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SlotInfo> out;
  for (const auto& s : slots_) out.push_back(s->info);
  return out;
}

void EvaluatorPool::submit(EvalJob job, Done done) {
  bool stopping = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    bool runnable = false;
    for (const auto& s : slots_) runnable = runnable || matches(*s, job.signature);
    stopping = stopping_;
    if (!stopping && runnable) {
      queue_.emplace_back(std::move(job), std::move(done));
      cv_.notify_all();
      return;
    }
  }
  EvalResult r;
  r.job_id = job.job_id;
  r.status = EvalStatus::kWorkerError;
  r.phase = "start";
  r.message = stopping ? "the daemon is stopping"
                       : "no evaluation slot runs " + std::string(backend_name(job.signature.target.backend)) + " " +
                             job.signature.target.arch + " signatures";
  done(std::move(r), JobPlacement{});
}

void EvaluatorPool::run_slot(Slot& s) {
  WorkerOptions wo;
  wo.program = options_.program.empty() ? WorkerOptions::default_program() : options_.program;
  wo.device = s.info.device;
  wo.build_cache_dir = options_.build_cache_dir;
  wo.priority = options_.priority;
  if (!options_.python.empty()) wo.env.emplace_back("KFORGE_PYTHON", options_.python);
  // Note [Idle workers]: a bounded number of threads, told to torch and to the OpenMP and MKL
  // runtimes alike (torch's pool follows at::set_num_threads; a library that starts its own pool
  // reads the variables).
  std::string threads;
  if (s.backend == Backend::kCpu && !s.info.cpus.empty()) {   // Note [Pinned CPU workers]
    threads = std::to_string(s.info.cpus.size());
    wo.env.emplace_back("KFORGE_WORKER_CPUS", cpu_list(s.info.cpus));
    wo.env.emplace_back("OMP_PROC_BIND", "close");
    wo.env.emplace_back("OMP_PLACES", "threads");
  } else if (s.backend == Backend::kCuda) {
    threads = std::to_string(options_.cpu_threads > 0 ? options_.cpu_threads : 1);
  }
  if (!threads.empty()) {
    wo.env.emplace_back("KFORGE_WORKER_CPU_THREADS", threads);
    wo.env.emplace_back("OMP_NUM_THREADS", threads);
    wo.env.emplace_back("MKL_NUM_THREADS", threads);
  }
  // Never the hook inside a worker: its reference is PyTorch's own kernel.
  wo.env.emplace_back("KFORGE_DISABLE", "1");
  WorkerProcess worker(wo);
  auto refresh = [&](const char* state) {
    std::lock_guard<std::mutex> lock(mu_);
    s.info.state = state;
    s.info.restarts = worker.starts() > 0 ? worker.starts() - 1 : 0;
    if (const auto& r = worker.ready()) {
      s.info.arch = r->environment.arch;
      s.info.device_model = r->environment.device_model;
      s.info.uuid = r->device_uuid;
      s.info.bandwidth_bytes_per_s = r->bandwidth_ceiling_bytes_per_s;
    }
  };
  // From here the slot is idle, a candidate for choose_slot (before it waits for a job, so that
  // once its start is logged no job goes elsewhere in its stead).
  if (Status st = worker.start(); !st.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      s.info.state = "failed: " + st.message();
      s.waiting = true;
      s.started = true;
      cv_.notify_all();
    }
    if (options_.log) options_.log("worker on " + s.info.device + " did not start: " + st.message());
  } else {
    refresh("idle");
    {
      std::lock_guard<std::mutex> lock(mu_);
      s.waiting = true;
      s.started = true;
      cv_.notify_all();
    }
    if (options_.log) {
      const auto& r = *worker.ready();
      options_.log("worker pid " + std::to_string(r.pid) + " on " + s.info.device + " (" + r.environment.device_model +
                   ", " + r.environment.arch + (r.device_uuid.empty() ? "" : ", " + r.device_uuid) + ") ready; " +
                   r.note);
    }
  }
  // Who uses this slot's GPU now, merged into `pids` (sorted, unique). Under mu_.
  auto add_serving = [&](std::vector<int32_t>& pids) {
    if (const std::vector<int32_t>* now = serving_on(s)) {
      std::vector<int32_t> merged;
      std::set_union(pids.begin(), pids.end(), now->begin(), now->end(), std::back_inserter(merged));
      pids = std::move(merged);
    }
  };
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    auto it = queue_.end();
    cv_.wait(lock, [&] {
      if (stopping_) return true;
      // The first queued job this slot can run and is the chosen idle slot for (see choose_slot).
      it = std::find_if(queue_.begin(), queue_.end(),
                        [&](const auto& q) { return matches(s, q.first.signature) && chosen_for(s, q.first.signature); });
      return it != queue_.end();
    });
    if (stopping_) break;
    std::pair<EvalJob, Done> item = std::move(*it);
    queue_.erase(it);
    s.waiting = false;
    s.busy = true;
    s.info.state = "busy";
    JobPlacement where;
    where.device = s.info.device;
    where.uuid = s.info.uuid;
    add_serving(where.serving_pids);
    cv_.notify_all();   // this slot left the idle ones: other queued jobs may be another slot's now
    lock.unlock();
    const pid_t pid_before = worker.pid();
    const uint64_t starts_before = worker.starts();
    EvalResult r = worker.evaluate(item.first);
    refresh("idle");
    // A worker's death and its replacement are the operator's business: say both.
    if (options_.log) {
      if (worker.starts() > starts_before && worker.ready()) {
        options_.log("worker on " + s.info.device + " restarted (restart " + std::to_string(worker.starts() - 1) +
                     "): pid " + std::to_string(worker.ready()->pid));
      }
      if (!worker.running() && worker.starts() == starts_before && pid_before <= 0) {
        options_.log("worker on " + s.info.device + " could not start for job " + std::to_string(item.first.job_id) +
                     ": " + r.message.substr(0, 300));
      } else if (!worker.running()) {
        const pid_t gone = worker.starts() > starts_before || pid_before <= 0 ? r.worker_pid : pid_before;
        options_.log("worker" + (gone > 0 ? " pid " + std::to_string(gone) : std::string()) + " on " + s.info.device +
                     " is gone after job " + std::to_string(item.first.job_id) + " (" +
                     std::string(eval_status_name(r.status)) + " in " + r.phase + ": " + r.message.substr(0, 300) +
                     "); the next job starts a new one");
      }
    }
    lock.lock();
    where.uuid = s.info.uuid;   // a restarted worker reports the same GPU; the first report may come late
    add_serving(where.serving_pids);
    // Idle before the callback: a search submits its next job from there, and that job must see
    // this slot free (else a slot on a GPU a serving process uses would take it in its stead).
    s.busy = false;
    s.waiting = true;
    ++s.info.jobs;
    lock.unlock();
    item.second(std::move(r), std::move(where));
    lock.lock();
  }
  s.waiting = false;
}

void EvaluatorPool::stop() {
  std::deque<std::pair<EvalJob, Done>> orphans;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && slots_.empty()) return;
    stopping_ = true;
    orphans.swap(queue_);
    cv_.notify_all();
  }
  for (auto& [job, done] : orphans) {
    EvalResult r;
    r.job_id = job.job_id;
    r.status = EvalStatus::kWorkerError;
    r.phase = "start";
    r.message = "the daemon is stopping";
    done(std::move(r), JobPlacement{});
  }
  // A slot in the middle of an evaluation finishes it (bounded by the worker's watchdog).
  for (auto& s : slots_) {
    if (s->thread.joinable()) s->thread.join();
  }
  std::lock_guard<std::mutex> lock(mu_);
  slots_.clear();
}

}  // namespace kforge::eval
