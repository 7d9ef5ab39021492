// One-line diagnostics of the hook on stderr, each "kforge: <message>\n" written with a single
// write(2) so lines from several threads never interleave. Never throws, never allocates more than
// the line itself; safe from any thread, and after fork.
#pragma once

#include <string_view>

namespace kforge::hook {

void log_line(std::string_view message) noexcept;

}  // namespace kforge::hook
