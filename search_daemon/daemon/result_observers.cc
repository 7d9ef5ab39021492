#include "search_daemon/daemon/result_observers.h"

#include <unistd.h>

#include <chrono>

#include "runtime/version.h"
#include "search_daemon/daemon/hot_signatures.h"

namespace kforge::daemon {

namespace {

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "";
  return buf;
}

int64_t now_unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Status WinnerPublisher::on_result(const EvaluatedNode& n) {
  const search::Outcome& o = n.outcome;
  if (!o.improves() || !(o.speedup > best_)) return Status();
  CacheEntry entry;
  entry.signature = n.signature;
  entry.environment = n.result.environment;
  entry.spec = n.node.move.spec;
  entry.blobs.push_back(BlobData{n.result.artifact_name, n.result.artifact});
  // Note [LLM provenance] (llm_proposer.cc): the conversation that wrote the kernel.
  if (!n.node.move.origin.empty()) entry.blobs.push_back(BlobData{std::string(kLlmProvenanceBlob), n.node.move.origin});
  entry.verification = n.result.verification_report();
  entry.timings = n.result.timings();
  entry.provenance.proposer = n.node.move.proposer + ":" + n.node.move.label;
  entry.provenance.search_id = n.signature.id().hex();
  entry.provenance.kforge_version = KFORGE_VERSION_STRING;
  entry.provenance.created_unix_ms = now_unix_ms();
  entry.provenance.host = host_name();
  StatusOr<EntryKey> key = store_.publish(entry);
  if (!key.ok()) {
    if (log_) log_("cannot publish the winner " + n.node.move.label + ": " + key.status().message());
    return Status();
  }
  best_ = o.speedup;
  best_label_ = n.node.move.label;
  entry_key_ = key->hex();
  if (log_) {
    log_("published " + key->hex() + ": " + n.node.move.label + " at " + std::to_string(o.speedup) + "x" +
         (o.shared_gpu_pids.empty()
              ? std::string()
              : " (timed on " + n.where.device + ", " + n.where.uuid + ", while serving pid(s) " +
                    pid_list(o.shared_gpu_pids) + " used that GPU: the speedup may be noisier)"));
  }
  SessionEvent e;
  e.kind = SessionEvent::Kind::kPublished;
  e.signature = n.signature.id();
  e.node = n.id;
  e.speedup = o.speedup;
  e.entry_key = key->hex();
  e.environment_key = n.result.environment.key();
  e.label = n.node.move.label;
  e.shared_gpu_pids = o.shared_gpu_pids;
  if (emit_) emit_(e);
  return Status();
}

Status ResultEvents::on_result(const EvaluatedNode& n) {
  SessionEvent e;
  e.kind = SessionEvent::Kind::kResult;
  e.signature = n.signature.id();
  e.node = n.id;
  e.parent = n.node.parent;
  e.status = n.result.status;
  e.speedup = n.outcome.speedup;
  e.message = n.result.message;
  e.label = n.node.move.label;
  e.proposer = n.node.move.proposer;
  e.device = n.where.device;
  e.uuid = n.where.uuid;
  e.shared_gpu_pids = n.outcome.shared_gpu_pids;
  e.implausible = n.outcome.implausible;
  e.build_cached = n.result.build_cached;
  e.build_ms = n.result.build_ms;
  if (emit_) emit_(e);
  return Status();
}

}  // namespace kforge::daemon
