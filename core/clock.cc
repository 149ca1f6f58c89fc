#include "core/clock.h"

#include <fmt/format.h>
#include <time.h>

#include <cctype>

namespace fy {

uint64_t mono_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000u + static_cast<uint64_t>(ts.tv_nsec) / 1000000u;
}

uint64_t mono_us() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000u + static_cast<uint64_t>(ts.tv_nsec) / 1000u;
}

int64_t wall_ms() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

std::string iso8601_utc(int64_t epoch_ms, bool millis, bool z_suffix) {
  time_t secs = static_cast<time_t>(epoch_ms / 1000);
  int ms = static_cast<int>(epoch_ms % 1000);
  if (ms < 0) {
    ms += 1000;
    --secs;
  }
  tm t{};
  gmtime_r(&secs, &t);
  std::string out = fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}", t.tm_year + 1900,
                                t.tm_mon + 1, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec);
  if (millis) out += fmt::format(".{:03}", ms);
  out += z_suffix ? "Z" : "+00:00";
  return out;
}

namespace {

bool digits(std::string_view s, size_t pos, size_t n, int* out) {
  if (pos + n > s.size()) return false;
  int v = 0;
  for (size_t i = 0; i < n; ++i) {
    char c = s[pos + i];
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
  // Howard Hinnant's algorithm: days since 1970-01-01 for a proleptic Gregorian date.
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

}  // namespace

std::optional<int64_t> parse_iso8601(std::string_view s) {
  int Y, M, D, h, m, sec;
  if (!digits(s, 0, 4, &Y) || s.size() < 19 || s[4] != '-' || !digits(s, 5, 2, &M) ||
      s[7] != '-' || !digits(s, 8, 2, &D) || (s[10] != 'T' && s[10] != 't' && s[10] != ' ') ||
      !digits(s, 11, 2, &h) || s[13] != ':' || !digits(s, 14, 2, &m) || s[16] != ':' ||
      !digits(s, 17, 2, &sec))
    return std::nullopt;
  if (M < 1 || M > 12 || D < 1 || D > 31 || h > 23 || m > 59 || sec > 60) return std::nullopt;
  size_t pos = 19;
  int frac_ms = 0;
  if (pos < s.size() && s[pos] == '.') {
    ++pos;
    int scale = 100;
    size_t start = pos;
    while (pos < s.size() && std::isdigit(static_cast<unsigned char>(s[pos]))) {
      if (scale > 0) frac_ms += (s[pos] - '0') * scale;
      scale /= 10;
      ++pos;
    }
    if (pos == start) return std::nullopt;
  }
  if (pos >= s.size()) return std::nullopt;  // naive timestamps are refused
  int offset_min = 0;
  if (s[pos] == 'Z' || s[pos] == 'z') {
    ++pos;
  } else if (s[pos] == '+' || s[pos] == '-') {
    int oh, om;
    if (!digits(s, pos + 1, 2, &oh) || pos + 3 >= s.size() || s[pos + 3] != ':' ||
        !digits(s, pos + 4, 2, &om))
      return std::nullopt;
    offset_min = (oh * 60 + om) * (s[pos] == '-' ? -1 : 1);
    pos += 6;
  } else {
    return std::nullopt;
  }
  if (pos != s.size()) return std::nullopt;
  int64_t days = days_from_civil(Y, static_cast<unsigned>(M), static_cast<unsigned>(D));
  int64_t secs = days * 86400 + h * 3600 + m * 60 + sec - offset_min * 60;
  return secs * 1000 + frac_ms;
}

}  // namespace fy
