#include "core/json.h"

#include <fmt/format.h>

namespace fy {
namespace {

// Length of a valid UTF-8 sequence starting at s[i], or 0 when invalid.
size_t utf8_seq_len(std::string_view s, size_t i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  size_t n = s.size() - i;
  auto cont = [&](size_t k) { return k < s.size() && (b(k) & 0xC0) == 0x80; };
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return (n >= 2 && cont(i + 1)) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (n < 3 || !cont(i + 1) || !cont(i + 2)) return 0;
    if (c == 0xE0 && b(i + 1) < 0xA0) return 0;   // overlong
    if (c == 0xED && b(i + 1) >= 0xA0) return 0;  // surrogates
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (n < 4 || !cont(i + 1) || !cont(i + 2) || !cont(i + 3)) return 0;
    if (c == 0xF0 && b(i + 1) < 0x90) return 0;
    if (c == 0xF4 && b(i + 1) >= 0x90) return 0;
    return 4;
  }
  return 0;
}

}  // namespace

void json_append_string(std::string& out, std::string_view s) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
      // Fast path for runs of plain ASCII.
      size_t j = i + 1;
      while (j < s.size()) {
        unsigned char d = static_cast<unsigned char>(s[j]);
        if (d < 0x20 || d >= 0x80 || d == '"' || d == '\\') break;
        ++j;
      }
      out.append(s.data() + i, j - i);
      i = j;
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; ++i; continue;
      case '\\': out += "\\\\"; ++i; continue;
      case '\n': out += "\\n"; ++i; continue;
      case '\r': out += "\\r"; ++i; continue;
      case '\t': out += "\\t"; ++i; continue;
      default: break;
    }
    if (c < 0x20 || c == 0x7F) {
      out += fmt::format("\\u{:04x}", c);
      ++i;
      continue;
    }
    size_t n = utf8_seq_len(s, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      ++i;
    } else {
      out.append(s.data() + i, n);
      i += n;
    }
  }
  out += '"';
}

void JsonObject::key(std::string_view k) {
  if (!first_) out_ += ',';
  first_ = false;
  json_append_string(out_, k);
  out_ += ':';
}

JsonObject& JsonObject::str(std::string_view k, std::string_view v) {
  key(k);
  json_append_string(out_, v);
  return *this;
}
JsonObject& JsonObject::num(std::string_view k, int64_t v) {
  key(k);
  fmt::format_to(std::back_inserter(out_), "{}", v);
  return *this;
}
JsonObject& JsonObject::unum(std::string_view k, uint64_t v) {
  key(k);
  fmt::format_to(std::back_inserter(out_), "{}", v);
  return *this;
}
JsonObject& JsonObject::real(std::string_view k, double v, int decimals) {
  key(k);
  fmt::format_to(std::back_inserter(out_), "{:.{}f}", v, decimals);
  return *this;
}
JsonObject& JsonObject::boolean(std::string_view k, bool v) {
  key(k);
  out_ += v ? "true" : "false";
  return *this;
}
JsonObject& JsonObject::null(std::string_view k) {
  key(k);
  out_ += "null";
  return *this;
}
JsonObject& JsonObject::raw(std::string_view k, std::string_view json) {
  key(k);
  out_ += json;
  return *this;
}

bool json_nesting_exceeds(std::string_view s, int max) {
  int depth = 0;
  bool in_str = false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (in_str) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if (c == '{' || c == '[') {
      if (++depth > max) return true;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return false;
}

}  // namespace fy
