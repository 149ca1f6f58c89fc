// Diagnostic logging for the daemons: one line per event on stderr, written
// with a single write(2), connection id first when there is one:
//
//   2026-11-29T21:30:00.123Z fy-proxy info c42 CONNECT example.com:443 refused
//
// Peer-caused events go through a RateLimit so untrusted input can never flood
// the log; every degraded path also bumps a counter the operator can read.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <string_view>

namespace fy::log {

enum class Level : int { debug = 0, info = 1, warn = 2, error = 3, off = 4 };

void init(std::string_view program, Level level);
Level level();
inline bool enabled(Level l) { return static_cast<int>(l) >= static_cast<int>(level()); }
std::optional<Level> parse_level(std::string_view name);
const char* level_name(Level l);

// Writes one line; `msg` must not contain a newline (they are replaced).
void write(Level l, std::string_view msg);

template <class... A>
void debug(fmt::format_string<A...> f, A&&... a) {
  if (enabled(Level::debug)) write(Level::debug, fmt::format(f, std::forward<A>(a)...));
}
template <class... A>
void info(fmt::format_string<A...> f, A&&... a) {
  if (enabled(Level::info)) write(Level::info, fmt::format(f, std::forward<A>(a)...));
}
template <class... A>
void warn(fmt::format_string<A...> f, A&&... a) {
  if (enabled(Level::warn)) write(Level::warn, fmt::format(f, std::forward<A>(a)...));
}
template <class... A>
void error(fmt::format_string<A...> f, A&&... a) {
  if (enabled(Level::error)) write(Level::error, fmt::format(f, std::forward<A>(a)...));
}

// Lets at most `burst` events through per `interval_ms`; counts the rest so the
// next line that does get through can say how many were suppressed.
class RateLimit {
 public:
  RateLimit(uint32_t burst, uint64_t interval_ms) : burst_(burst), interval_ms_(interval_ms) {}
  // Returns true when this event may be logged. `suppressed` receives the count
  // dropped since the last allowed event.
  bool allow(uint64_t now_ms, uint64_t* suppressed = nullptr);

 private:
  uint32_t burst_;
  uint64_t interval_ms_;
  uint64_t window_start_ = 0;
  uint32_t used_ = 0;
  uint64_t dropped_ = 0;
};

}  // namespace fy::log
