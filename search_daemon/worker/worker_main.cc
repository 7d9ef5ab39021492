// kforge_worker_main: the evaluation worker's loop, inside the python3 that kforge-worker started
// (worker_launcher.cc): connect to the supervisor's PAIR socket, say WorkerReady, then one EvalJob
// at a time to its EvalResult (job_runner.h), announcing each phase for the watchdog.
//
// Exit status: 0 when the supervisor goes away, 3 when the worker cannot start (the reason on
// stderr, which the supervisor's log shows), 4 after reporting a fault that lost the CUDA context
// (nothing more can run in this process; the supervisor starts a new worker).
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <fcntl.h>
#include <unistd.h>
#include <zmq.hpp>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "runtime/nvrtc.h"
#include "search_daemon/evaluator/eval_protocol.h"
#include "search_daemon/evaluator/worker_process.h"
#include "search_daemon/worker/builder.h"
#include "search_daemon/worker/eval_device.h"
#include "search_daemon/worker/job_runner.h"
#include "search_daemon/worker/worker_config.h"

namespace kforge::eval {
namespace {

struct Args {
  std::string endpoint;
  std::string device = "cpu";
  std::string build_cache;
  std::string torch_version;
  int alive_fd = -1;
};

int fail(const std::string& why) {
  std::fprintf(stderr, "kforge-worker: %s\n", why.c_str());
  std::fflush(stderr);
  return 3;
}

bool parse(int argc, char** argv, Args& a, std::string& why) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) {
      why = "option " + k + " needs a value";
      return false;
    }
    const std::string v = argv[++i];
    if (k == "--endpoint") a.endpoint = v;
    else if (k == "--device") a.device = v;
    else if (k == "--build-cache") a.build_cache = v;
    else if (k == "--torch-version") a.torch_version = v;
    else if (k == "--alive-fd") a.alive_fd = std::atoi(v.c_str());
    else {
      why = "unknown option " + k;
      return false;
    }
  }
  if (a.endpoint.empty()) why = "no --endpoint";
  else if (a.build_cache.empty()) why = "no --build-cache";
  return why.empty();
}

// The ZeroMQ side: one PAIR socket connected to the supervisor.
class Channel {
 public:
  Status open(const std::string& endpoint) {
    try {
      socket_.set(zmq::sockopt::linger, 0);
      socket_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(kMaxEvalMessageBytes));
      socket_.connect(endpoint);
    } catch (const zmq::error_t& e) {
      return unavailable("cannot connect to " + endpoint + ": " + e.what());
    }
    return Status();
  }
  bool send(const EvalMessage& m) {
    const std::string bytes = encode(m);
    try {
      return socket_.send(zmq::buffer(bytes.data(), bytes.size()), zmq::send_flags::none).has_value();
    } catch (const zmq::error_t&) {
      return false;
    }
  }
  // Blocks for the next message; false when the socket is gone.
  bool receive(std::string& out) {
    zmq::message_t msg;
    for (;;) {
      try {
        if (!socket_.recv(msg, zmq::recv_flags::none)) return false;
        out = msg.to_string();
        return true;
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) return false;
      }
    }
  }

 private:
  zmq::context_t context_;
  zmq::socket_t socket_{context_, zmq::socket_type::pair};
};

int worker_main(int argc, char** argv) {
  Args args;
  std::string why;
  if (!parse(argc, argv, args, why)) return fail(why);
  // The life pipe is for the supervisor to see this process end; the compilers the builder starts
  // must not hold it open after we die.
  if (args.alive_fd >= 0) ::fcntl(args.alive_fd, F_SETFD, FD_CLOEXEC);

  // The worker computes, never trains: no autograd bookkeeping around the reference kernels.
  c10::InferenceMode inference;

  // Every variable the worker reads, once (worker_config.h). cpu_threads: torch's intra-op threads
  // for CPU work (PyTorch's kernels and the CPU candidates alike, both on torch's pool). The daemon
  // sets it with the cores it pins the worker to (Note [Pinned CPU workers]): an OpenMP region
  // waits for its slowest thread, and a thread that loses its core for a time slice makes a
  // timing worthless.
  StatusOr<WorkerConfig> config = WorkerConfig::from_env([](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    return v != nullptr ? std::optional<std::string>(v) : std::nullopt;
  });
  if (!config.ok()) return fail(config.status().message());
  if (config->cpu_threads > 0) at::set_num_threads(static_cast<int>(config->cpu_threads));
  StatusOr<std::unique_ptr<EvalDevice>> device = EvalDevice::open(args.device, args.torch_version, config->cupti);
  if (!device.ok()) return fail("cannot use " + args.device + ": " + device.status().message());
  EvalDevice& dev = **device;

  std::string compiler_identity;
  std::string note;
  StatusOr<CandidateBuilder> builder = invalid_argument("no builder");
  if (dev.is_cuda()) {
    StatusOr<const Nvrtc*> nvrtc = Nvrtc::load();
    if (!nvrtc.ok()) return fail("no NVRTC: " + nvrtc.status().message());
    builder = CandidateBuilder::for_cuda(args.build_cache, *nvrtc, dev.sm_major(), dev.sm_minor());
    note = "NVRTC " + std::to_string((*nvrtc)->version().major) + "." + std::to_string((*nvrtc)->version().minor) +
           " from " + (*nvrtc)->library_path() + "; timing: " + dev.clock_name() +
           (dev.cupti_note().empty() ? "" : " (" + dev.cupti_note() + ")") +
           (dev.uuid().empty() ? "; no GPU UUID (" + dev.uuid_note() + "): serving processes on it go unnoticed" : "");
  } else {
    StatusOr<CpuCompiler> cxx = CpuCompiler::detect(config->cxx);
    if (!cxx.ok()) return fail("no C++ compiler for CPU candidates: " + cxx.status().message());
    compiler_identity = cxx->identity;
    note = "CPU candidates compiled by " + cxx->command + " (" + cxx->identity + "); " +
           std::to_string(at::get_num_threads()) + " torch threads" +
           (!config->cpus.empty() ? " pinned to cores " + config->cpus : std::string(", not pinned"));
    builder = CandidateBuilder::for_cpu(args.build_cache, *cxx);
  }
  if (!builder.ok()) return fail("cannot use the build cache " + args.build_cache + ": " + builder.status().message());
  char floor[64];
  std::snprintf(floor, sizeof floor, "; smallest call %.0f ns", dev.call_floor_ns());
  note += floor;
  // What the supervisor set before exec (Note [Idle workers] in evaluator/worker_process.h): the
  // daemon's log says whether a worker got SCHED_IDLE, the nice 19 fallback, or normal.
  note += "; scheduling " + scheduling_of(0);

  Channel channel;
  if (Status s = channel.open(args.endpoint); !s.ok()) return fail(s.message());
  WorkerReady ready;
  ready.pid = static_cast<int32_t>(::getpid());
  ready.device = args.device;
  ready.environment = dev.environment();
  if (!dev.is_cuda()) ready.environment.compiler = compiler_identity;
  ready.bandwidth_ceiling_bytes_per_s = dev.bandwidth_ceiling();
  ready.max_shared_mem_bytes = dev.max_shared_mem_bytes();
  ready.note = note;
  ready.device_uuid = dev.uuid();
  if (!channel.send(EvalMessage(ready))) return fail("cannot send WorkerReady");

  JobRunner runner(dev, *builder, compiler_identity, [&](const JobPhase& p) { (void)channel.send(EvalMessage(p)); });
  runner.set_verify_profile(config->profile);
  std::string bytes;
  while (channel.receive(bytes)) {
    StatusOr<EvalMessage> m = decode_eval_message(bytes);
    if (!m.ok()) {
      std::fprintf(stderr, "kforge-worker: ignoring a malformed message: %s\n", m.status().message().c_str());
      continue;
    }
    const auto* job = std::get_if<EvalJob>(&*m);
    if (job == nullptr) {
      std::fprintf(stderr, "kforge-worker: ignoring a message that is not an EvalJob\n");
      continue;
    }
    EvalResult result = runner.run(*job);
    result.worker_pid = ready.pid;
    if (!channel.send(EvalMessage(result))) return fail("cannot send a result");
    if (result.status == EvalStatus::kFault && dev.context_lost()) return 4;
  }
  return 0;
}

}  // namespace
}  // namespace kforge::eval

// Called by the launcher's python bootstrap through ctypes; never throws into it.
extern "C" __attribute__((visibility("default"))) int kforge_worker_main(int argc, char** argv) {
  try {
    return kforge::eval::worker_main(argc, argv);
  } catch (const std::exception& e) {
    return kforge::eval::fail(std::string("internal error: ") + e.what());
  } catch (...) {
    return kforge::eval::fail("internal error");
  }
}
