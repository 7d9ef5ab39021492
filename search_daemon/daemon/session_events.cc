#include "search_daemon/daemon/session_events.h"

namespace kforge::daemon {

std::string_view session_state_name(SessionState s) noexcept {
  switch (s) {
    case SessionState::kStarting: return "starting";
    case SessionState::kSearching: return "searching";
    case SessionState::kStopped: return "stopped";
    case SessionState::kDone: return "done";
    case SessionState::kFailed: return "failed";
  }
  return "?";
}

}  // namespace kforge::daemon
