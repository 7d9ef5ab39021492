// SearchJournal: every node of a signature's search tree and every outcome, appended to a file as
// they happen, so a daemon killed at any point (kill -9 included) resumes each search where it
// stood, without repeating an evaluation.
//
//   StatusOr<SearchJournal> j = SearchJournal::open(state_dir, sig, "mcts");   // creates or reopens
//   j->restored();                  // the tree as it was: nodes, outcomes (empty for a new search)
//   j->append_node(tree.node(id));  // each new node, before it is evaluated
//   j->append_outcome(id, outcome); // each result, fsync'ed
//   j->append_done("budget spent");
//
// Note [Journal format]
// <state_dir>/journal/<signature id>.kfj: a sequence of records, each [u32 length][u64 XXH3-64 of
// the payload][payload], little-endian, the payload a msgpack array:
//   ["search", 1, signature (bin: OpSignature::encode()), strategy, created_unix_ms]   (first)
//   ["node", id, parent, proposer, label, prior, spec (bin: KernelSpec::encode()), origin]
//       origin (Move::origin) was appended later: a node of 7 fields, from an older daemon, has none
//   ["submit", id]          the node was handed to a worker (in flight until its outcome)
//   ["outcome", id, status, speedup, noise_band, significant, baseline_ns, candidate_ns,
//    failed_check, message, build_log, shared_gpu_pids, implausible, baseline_spread,
//    candidate_spread, torch_max_abs_error, torch_rel_error, finished_unix_ms]
//       shared_gpu_pids (Outcome::shared_gpu_pids, an array of pids), implausible
//       (Outcome::implausible), the two spreads and PyTorch's two errors were appended later: an outcome of 11, 12 or 13
//       fields, from an older daemon, has none of those after its last; an older daemon ignores
//       the fields it does not know. finished_unix_ms (Outcome::finished_unix_ms) came later still:
//       an outcome of 17 fields has none (0).
//   ["done", reason]
// Only the last record can be torn (a write the kill cut short, or one not yet synced when the power
// went): reading stops there, the file is truncated to the last whole record and appending goes
// on. A bad record with whole records after it is corruption: open() fails naming the file and the
// byte offset, and leaves the file as it is (nothing is lost; the search can be restarted by moving
// the file aside). Node
// records replay in order, so ids come back as they were (SearchTree ids are dense). Every record
// is fdatasync'ed before append_* returns: an evaluation the journal does not show was never
// finished as far as a restarted daemon knows, and is evaluated again at most once.
// The journal holds signatures and kernel sources, never inputs, keys or anything user-secret.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/op_signature.h"
#include "runtime/status.h"
#include "runtime/unique_fd.h"
#include "search_daemon/search/search_tree.h"

namespace kforge::daemon {

class SearchJournal {
 public:
  // Opens (creating the directory 0700 and the file) the journal of `sig`. A journal written for a
  // different signature or with a bad header is an error naming the file (nothing is overwritten).
  static StatusOr<SearchJournal> open(const std::string& state_dir, const OpSignature& sig, const std::string& strategy);
  // Every journal under state_dir (signature ids from their names), for resuming at start-up.
  static std::vector<std::string> list(const std::string& state_dir);
  // Where the journal of the signature with this id is (whether or not it exists).
  static std::string path_for(const std::string& state_dir, const SignatureId& id);
  // Reads one journal without opening it for writing (the CLI, tests).
  struct Contents {
    OpSignature signature;
    std::string strategy;
    uint64_t created_unix_ms = 0;   // the header's: when the search began
    search::SearchTree tree;
    bool done = false;
    std::string done_reason;
    size_t records = 0;
    uint64_t truncated_bytes = 0;   // a torn tail that was cut off
  };
  static StatusOr<Contents> read(const std::string& path);

  const Contents& restored() const noexcept { return contents_; }
  const std::string& path() const noexcept { return path_; }

  Status append_node(const search::Node& node);
  // The node went to a worker: a restored tree marks it in flight (Node::virtual_loss = 1) until
  // its outcome, so a resumed search hands it out first (search_strategy.h).
  Status append_submitted(uint64_t id);
  Status append_outcome(uint64_t id, const search::Outcome& outcome);
  Status append_done(const std::string& reason);

 private:
  SearchJournal() = default;
  Status append(const std::string& payload);

  std::string path_;
  UniqueFd fd_;
  Contents contents_;
};

}  // namespace kforge::daemon
