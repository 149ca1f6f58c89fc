#include "core/text.h"

namespace fy {

std::string to_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = ascii_lower(c);
  return out;
}

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split_list(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  while (true) {
    size_t p = s.find(sep);
    std::string_view item = trim_ows(s.substr(0, p));
    if (!item.empty()) out.push_back(item);
    if (p == std::string_view::npos) break;
    s.remove_prefix(p + 1);
  }
  return out;
}

std::optional<uint64_t> parse_u64(std::string_view s) {
  if (s.empty() || s.size() > 20) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

bool parse_long_in(std::string_view s, long lo, long hi, long* out) {
  auto v = parse_u64(s);
  if (!v || *v < static_cast<uint64_t>(lo) || *v > static_cast<uint64_t>(hi)) return false;
  *out = static_cast<long>(*v);
  return true;
}

bool list_has_token(std::string_view list, std::string_view token) {
  for (std::string_view item : split_list(list))
    if (iequals(item, token)) return true;
  return false;
}

}  // namespace fy
