#include "proxy/inject/redact.h"

#include <vector>

namespace fy::inject {
namespace {

constexpr std::string_view kRedacted = "\xE2\x80\xB9redacted\xE2\x80\xBA";  // ‹redacted›

bool token_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '+' || c == '/' || c == '=' || c == '.' || c == '-';
}

int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Splits a target into path and the '&'-separated parameters of its query.
void split_target(std::string_view target, std::string_view* path, std::vector<std::string_view>* params,
                  bool* had_query) {
  size_t q = target.find('?');
  *had_query = q != std::string_view::npos;
  *path = target.substr(0, q);
  if (!*had_query) return;
  std::string_view query = target.substr(q + 1);
  while (true) {
    size_t amp = query.find('&');
    params->push_back(query.substr(0, amp));
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
}

bool names(std::string_view param, std::string_view name) {
  std::string_view key = param.substr(0, param.find('='));
  // '+' in a key is a space in form encoding: it can never equal a name.
  return percent_decode(key) == name;
}

}  // namespace

std::string percent_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      int hi = hexval(s[i + 1]), lo = hexval(s[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out += static_cast<char>(hi << 4 | lo);
        i += 2;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

std::string percent_encode(std::string_view s) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string redact_tokens(std::string_view s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    if (!token_char(s[i])) {
      out += s[i++];
      continue;
    }
    size_t j = i;
    while (j < s.size() && token_char(s[j])) ++j;
    if (j - i >= 20) {
      out += kRedacted;
    } else {
      out.append(s.substr(i, j - i));
    }
    i = j;
  }
  return out;
}

std::string stderr_tail(std::string_view text, size_t lines, size_t max) {
  std::vector<std::string_view> all;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
    if (!line.empty()) all.push_back(line);
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  std::string out;
  size_t from = all.size() > lines ? all.size() - lines : 0;
  for (size_t i = from; i < all.size(); ++i) {
    if (!out.empty()) out += " / ";
    out += redact_tokens(all[i]);
  }
  if (out.size() > max) {
    size_t n = max;
    while (n > 0 && (static_cast<unsigned char>(out[n]) & 0xC0) == 0x80) --n;
    out.resize(n);
  }
  return out;
}

std::string set_query_param(std::string_view target, std::string_view name, std::string_view value) {
  std::string_view path;
  std::vector<std::string_view> params;
  bool had_query;
  split_target(target, &path, &params, &had_query);
  std::string out(path);
  out += '?';
  bool first = true;
  for (std::string_view p : params) {
    if (p.empty() || names(p, name)) continue;
    if (!first) out += '&';
    out.append(p);
    first = false;
  }
  if (!first) out += '&';
  out += percent_encode(name);
  out += '=';
  out += percent_encode(value);
  return out;
}

std::string redact_query_param(std::string_view target, std::string_view name) {
  std::string_view path;
  std::vector<std::string_view> params;
  bool had_query;
  split_target(target, &path, &params, &had_query);
  if (!had_query) return std::string(target);
  std::string out(path);
  out += '?';
  for (size_t i = 0; i < params.size(); ++i) {
    if (i) out += '&';
    std::string_view p = params[i];
    if (names(p, name)) {
      out.append(p.substr(0, p.find('=')));
      out += '=';
      out += kRedacted;
    } else {
      out.append(p);
    }
  }
  return out;
}

}  // namespace fy::inject
