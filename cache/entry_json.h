// Cache entries as JSON, for the two places people look at them: `kforge cache ls/show --json`
// (tools/cache_commands.cc) and the web GUI's cache page (search_daemon/daemon/gui_api.h).
//
//   json j = entry_summary_json(entry);
//   j["no_win"] = no_wins_json(no_wins(store, entry.key));
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/store.h"

namespace kforge {

// Ordered as the CLI prints them. Key, signature, op, backend, arch, state and reason, pinned, speedup and both times, last use
// and creation time (unix ms).
nlohmann::ordered_json entry_summary_json(const StoredEntry& e);

// The no-win records of an entry (Note [In-process win] in interposer/hook/swapper.h): processes
// in which it was correct but not faster, so they run PyTorch's kernel. Unreadable: none.
std::vector<Store::NoWinRecord> no_wins(const Store& store, const EntryKey& key);
std::string describe_no_win(const Store::NoWinRecord& r);   // "no win in process 12 (3.1 us vs 2.9 us)"
nlohmann::ordered_json no_wins_json(const std::vector<Store::NoWinRecord>& records);

}  // namespace kforge
