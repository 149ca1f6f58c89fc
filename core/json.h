// A JSON writer for the hot path: one object per Network Log row, appended to
// a std::string with no intermediate tree. Strings are escaped and made valid
// UTF-8 (invalid bytes become U+FFFD), so a row is always one parseable line
// whatever bytes a client sent. Reading JSON is nlohmann::json's job; the
// readers of untrusted lines ask json_nesting_exceeds() first.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace fy {

// True when `s` opens more than `max` objects or arrays inside one another
// (strings and their escapes skipped; nothing else is validated). Readers call
// it before a recursive parser builds a tree for bytes they did not write.
bool json_nesting_exceeds(std::string_view s, int max);

// Appends `s` as a quoted JSON string.
void json_append_string(std::string& out, std::string_view s);

class JsonObject {
 public:
  explicit JsonObject(std::string& out) : out_(out) { out_ += '{'; }
  JsonObject& str(std::string_view key, std::string_view value);
  JsonObject& num(std::string_view key, int64_t value);
  JsonObject& unum(std::string_view key, uint64_t value);
  JsonObject& real(std::string_view key, double value, int decimals = 3);
  JsonObject& boolean(std::string_view key, bool value);
  JsonObject& null(std::string_view key);
  // Appends a pre-rendered JSON value (an object or array the caller built).
  JsonObject& raw(std::string_view key, std::string_view json);
  void close() { out_ += '}'; }

 private:
  void key(std::string_view k);
  std::string& out_;
  bool first_ = true;
};

}  // namespace fy
