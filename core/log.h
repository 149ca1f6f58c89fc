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
#include <string>
#include <string_view>

#include "core/clock.h"

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

// " (N similar lines suppressed)" when n > 0, else "": the suffix of a line
// that a RateLimit let through after dropping some.
std::string suppressed_suffix(uint64_t n);

// The rate-limited line: written at `l` when `limit` lets it through now,
// with suppressed_suffix() of what it dropped since; returns whether it was.
// (The level is checked first: a line that would not be written does not use
// up the limit.)
template <class... A>
bool limited(RateLimit& limit, Level l, fmt::format_string<A...> f, A&&... a) {
  if (!enabled(l)) return false;
  uint64_t suppressed = 0;
  if (!limit.allow(mono_ms(), &suppressed)) return false;
  write(l, fmt::format(f, std::forward<A>(a)...) + suppressed_suffix(suppressed));
  return true;
}

// For a caller that writes several lines per allowed event: true when `limit`
// lets one more through now; the first one after some were dropped is
// preceded by an info line "<how many> <what>" (fy-forwarder's relay: "12
// peer-caused log lines suppressed (see the counters in the status line)").
bool allow_noting(RateLimit& limit, std::string_view what);

// The connection id that starts every line about one connection: "c42", the
// same spelling in fy-proxy and fy-forwarder (and the Network Log's `conn`).
//   log::info("{} CONNECT {} refused", log::ConnId{id}, dest);
struct ConnId {
  uint64_t id;
};

}  // namespace fy::log

template <>
struct fmt::formatter<fy::log::ConnId> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  template <class Ctx>
  auto format(fy::log::ConnId c, Ctx& ctx) const {
    return fmt::format_to(ctx.out(), "c{}", c.id);
  }
};
