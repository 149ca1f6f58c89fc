// Small ASCII string helpers used on the data path: no locale, no allocation
// unless the name says so.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fy {

inline char ascii_lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c; }

inline bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (ascii_lower(a[i]) != ascii_lower(b[i])) return false;
  return true;
}

inline bool istarts_with(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && iequals(s.substr(0, prefix.size()), prefix);
}

inline bool iends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && iequals(s.substr(s.size() - suffix.size()), suffix);
}

std::string to_lower(std::string_view s);

// Trims spaces and horizontal tabs (HTTP's OWS).
std::string_view trim_ows(std::string_view s);

// Splits on `sep`, trimming OWS from each element and dropping empty ones
// (the list rule of RFC 9110 section 5.6.1).
std::vector<std::string_view> split_list(std::string_view s, char sep = ',');

// Decimal unsigned parse of the whole string; no sign, no spaces.
std::optional<uint64_t> parse_u64(std::string_view s);

// A flag's number: parse_u64's digits-only rule, then lo <= value <= hi
// (0 <= lo). False, with *out untouched, for anything else.
bool parse_long_in(std::string_view s, long lo, long hi, long* out);

// Whether the token list `list` (comma-separated, case-insensitive) contains `token`.
bool list_has_token(std::string_view list, std::string_view token);

}  // namespace fy
