// kforge-test-scripted-worker: a stand-in for kforge-worker that speaks the evaluation protocol
// (search_daemon/evaluator/eval_protocol.h) and evaluates nothing, so the evaluator pool's own rules
// (which slot takes a job, where it ran) are testable without torch or a GPU
// (tests/daemon/evaluator_pool_test.cc).
//
// Takes kforge-worker's options (--endpoint, --device, --build-cache, --alive-fd; others ignored).
// Environment:
//   KFORGE_SCRIPTED_UUIDS  comma-separated GPU UUIDs; each worker started claims the next one for
//   KFORGE_SCRIPTED_DIR    its WorkerReady.device_uuid (a file <dir>/uuid-<i>, created O_EXCL, per
//                          claim), so the slots of one pool get distinct ones in start order
//   KFORGE_SCRIPTED_GATE   a FIFO: before answering a job the worker opens it and reads one byte,
//                          so a test knows the job is running (its open for writing returns) and
//                          decides when it ends (its write)
// Every job gets a kMeasured result with 30 timed runs and speedup 1.
#include <fcntl.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/environment.h"
#include "search_daemon/evaluator/eval_protocol.h"

using namespace kforge;
using namespace kforge::eval;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

std::string claim_uuid() {
  std::vector<std::string> uuids;
  std::string list = env("KFORGE_SCRIPTED_UUIDS");
  const std::string dir = env("KFORGE_SCRIPTED_DIR");
  if (list.empty() || dir.empty()) return "";
  for (size_t start = 0; start <= list.size();) {
    const size_t comma = list.find(',', start);
    uuids.push_back(list.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  for (size_t i = 0; i < uuids.size(); ++i) {
    const std::string claim = dir + "/uuid-" + std::to_string(i);
    const int fd = ::open(claim.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
    if (fd >= 0) {
      ::close(fd);
      return uuids[i];
    }
  }
  return "";
}

bool receive(void* socket, std::string& out) {
  zmq_msg_t msg;
  zmq_msg_init(&msg);
  int got;
  do {
    got = zmq_msg_recv(&msg, socket, 0);
  } while (got < 0 && zmq_errno() == EINTR);
  if (got >= 0) out.assign(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
  zmq_msg_close(&msg);
  return got >= 0;
}

bool send(void* socket, const EvalMessage& m) {
  const std::string bytes = encode(m);
  return zmq_send(socket, bytes.data(), bytes.size(), 0) >= 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string endpoint;
  std::string device = "cpu";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--endpoint") endpoint = argv[i + 1];
    if (k == "--device") device = argv[i + 1];
  }
  if (endpoint.empty()) {
    std::fprintf(stderr, "kforge-test-scripted-worker: no --endpoint\n");
    return 3;
  }
  void* ctx = zmq_ctx_new();
  void* socket = zmq_socket(ctx, ZMQ_PAIR);
  const int linger = 0;
  zmq_setsockopt(socket, ZMQ_LINGER, &linger, sizeof linger);
  if (zmq_connect(socket, endpoint.c_str()) != 0) return 3;

  WorkerReady ready;
  ready.pid = static_cast<int32_t>(::getpid());
  ready.device = device;
  ready.environment = cpu_host_environment("scripted");
  ready.bandwidth_ceiling_bytes_per_s = 1e10;
  ready.max_shared_mem_bytes = 1 << 16;
  ready.note = "scripted worker";
  ready.device_uuid = claim_uuid();
  if (!send(socket, EvalMessage(ready))) return 3;

  const std::string gate = env("KFORGE_SCRIPTED_GATE");
  std::string bytes;
  while (receive(socket, bytes)) {
    StatusOr<EvalMessage> m = decode_eval_message(bytes);
    const EvalJob* job = m.ok() ? std::get_if<EvalJob>(&*m) : nullptr;
    if (job == nullptr) continue;
    if (!gate.empty()) {
      const int fd = ::open(gate.c_str(), O_RDONLY | O_CLOEXEC);
      char c = 0;
      if (fd >= 0) {
        while (::read(fd, &c, 1) < 0 && errno == EINTR) {
        }
        ::close(fd);
      }
    }
    EvalResult r;
    r.job_id = job->job_id;
    r.status = EvalStatus::kMeasured;
    r.timing.clock = "scripted";
    r.timing.runs = 30;
    r.timing.speedup = 1.0;
    r.environment = ready.environment;
    r.worker_pid = ready.pid;
    r.phase = "done";
    if (!send(socket, EvalMessage(r))) break;
  }
  zmq_close(socket);
  zmq_ctx_term(ctx);
  return 0;
}
