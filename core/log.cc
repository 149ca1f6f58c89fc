#include "core/log.h"

#include <unistd.h>

#include <atomic>
#include <string>

#include "core/clock.h"

namespace fy::log {
namespace {

std::atomic<int> g_level{static_cast<int>(Level::info)};
std::string g_program = "fy";

}  // namespace

void init(std::string_view program, Level l) {
  g_program = std::string(program);
  g_level.store(static_cast<int>(l));
}

Level level() { return static_cast<Level>(g_level.load(std::memory_order_relaxed)); }

std::optional<Level> parse_level(std::string_view name) {
  if (name == "debug") return Level::debug;
  if (name == "info") return Level::info;
  if (name == "warn" || name == "warning") return Level::warn;
  if (name == "error") return Level::error;
  if (name == "off") return Level::off;
  return std::nullopt;
}

const char* level_name(Level l) {
  switch (l) {
    case Level::debug: return "debug";
    case Level::info: return "info";
    case Level::warn: return "warn";
    case Level::error: return "error";
    case Level::off: return "off";
  }
  return "?";
}

void write(Level l, std::string_view msg) {
  std::string line;
  line.reserve(msg.size() + 64);
  line += iso8601_utc(wall_ms(), /*millis=*/true, /*z_suffix=*/true);
  line += ' ';
  line += g_program;
  line += ' ';
  line += level_name(l);
  line += ' ';
  for (char c : msg) line += (c == '\n' || c == '\r') ? ' ' : c;
  line += '\n';
  // One write so lines from several threads never interleave mid-line.
  ssize_t off = 0;
  while (off < static_cast<ssize_t>(line.size())) {
    ssize_t n = ::write(STDERR_FILENO, line.data() + off, line.size() - off);
    if (n <= 0) break;
    off += n;
  }
}

bool RateLimit::allow(uint64_t now_ms, uint64_t* suppressed) {
  if (now_ms - window_start_ >= interval_ms_) {
    window_start_ = now_ms;
    used_ = 0;
  }
  if (used_ < burst_) {
    ++used_;
    if (suppressed) *suppressed = dropped_;
    dropped_ = 0;
    return true;
  }
  ++dropped_;
  return false;
}

std::string suppressed_suffix(uint64_t n) {
  return n ? fmt::format(" ({} similar lines suppressed)", n) : std::string();
}

bool allow_noting(RateLimit& limit, std::string_view what) {
  uint64_t suppressed = 0;
  bool ok = limit.allow(mono_ms(), &suppressed);
  if (ok && suppressed) info("{} {}", suppressed, what);
  return ok;
}

}  // namespace fy::log
