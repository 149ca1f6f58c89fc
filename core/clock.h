// Clocks and timestamps. Monotonic milliseconds for timeouts and rate limits;
// wall-clock milliseconds for records; ISO 8601 in UTC for every file we write.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace fy {

uint64_t mono_ms();   // CLOCK_MONOTONIC
uint64_t mono_us();   // CLOCK_MONOTONIC, microseconds
int64_t wall_ms();    // CLOCK_REALTIME, ms since the epoch

// "2026-11-29T21:30:00+00:00" (the reference's format), or with millis
// "2026-11-29T21:30:00.123+00:00"; z_suffix writes "Z" instead of "+00:00".
std::string iso8601_utc(int64_t epoch_ms, bool millis = false, bool z_suffix = false);

// Parses an RFC 3339 / ISO 8601 timestamp with an explicit offset ("Z" or
// "+hh:mm"); a naive timestamp (no offset) is refused, as the reference does.
std::optional<int64_t> parse_iso8601(std::string_view s);

}  // namespace fy
