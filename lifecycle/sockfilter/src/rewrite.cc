#include "src/rewrite.h"

#include <unordered_set>
#include <vector>

#include "src/route.h"

namespace fy::sockfilter {
namespace {

enum class Mode { none, libpod_top, compat_top, hostconfig, annotations };

class Scanner {
 public:
  Scanner(std::string_view in, Family f) : in_(in), family_(f) {}

  Rewrite run() {
    Rewrite r;
    if (in_.empty()) {  // Content-Length: 0: the engine reads no body either
      r.ok = true;
      return r;
    }
    skip_ws();
    if (pos_ >= in_.size() || in_[pos_] != '{') {
      r.error = "the create body is not a JSON object";
      return r;
    }
    std::string out;
    out.append(in_.substr(0, pos_));
    if (!value(1, family_ == Family::libpod ? Mode::libpod_top : Mode::compat_top, &out)) {
      r.error = err_;
      return r;
    }
    size_t end = pos_;
    skip_ws();
    if (pos_ != in_.size()) {
      r.error = "the create body has data after its JSON value (at byte " + std::to_string(end) +
                "); the engine would ignore it, the filter refuses it";
      return r;
    }
    out.append(in_.substr(end));
    r.ok = true;
    r.body = std::move(out);
    r.stripped = stripped_;
    for (int i = 0; i < kStrippedKinds; ++i) r.by_kind[i] = by_kind_[i];
    return r;
  }

 private:
  bool fail(std::string what) {
    if (err_.empty()) err_ = what + " at byte " + std::to_string(pos_);
    return false;
  }
  void skip_ws() {
    while (pos_ < in_.size() &&
           (in_[pos_] == ' ' || in_[pos_] == '\t' || in_[pos_] == '\n' || in_[pos_] == '\r')) {
      ++pos_;
    }
  }
  static void put_utf8(std::string* o, uint32_t cp) {
    if (cp < 0x80) {
      o->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      o->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      o->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      o->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      o->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      o->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      o->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      o->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      o->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      o->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  bool hex4(uint32_t* v) {
    if (pos_ + 4 > in_.size()) return fail("a truncated \\u escape");
    uint32_t x = 0;
    for (int i = 0; i < 4; ++i) {
      char c = in_[pos_ + i];
      x <<= 4;
      if (c >= '0' && c <= '9') x |= c - '0';
      else if (c >= 'a' && c <= 'f') x |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') x |= c - 'A' + 10;
      else return fail("an invalid \\u escape");
    }
    pos_ += 4;
    *v = x;
    return true;
  }
  // A string at pos_ (the opening quote). Appends its decoded text to
  // `decoded` when not null. Validates UTF-8 and escapes.
  bool string(std::string* decoded) {
    ++pos_;
    while (true) {
      if (pos_ >= in_.size()) return fail("an unterminated string");
      unsigned char c = static_cast<unsigned char>(in_[pos_]);
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (c < 0x20) return fail("a control character in a string");
      if (c == '\\') {
        ++pos_;
        if (pos_ >= in_.size()) return fail("an unterminated string");
        char e = in_[pos_++];
        char lit = 0;
        switch (e) {
          case '"': lit = '"'; break;
          case '\\': lit = '\\'; break;
          case '/': lit = '/'; break;
          case 'b': lit = '\b'; break;
          case 'f': lit = '\f'; break;
          case 'n': lit = '\n'; break;
          case 'r': lit = '\r'; break;
          case 't': lit = '\t'; break;
          case 'u': {
            uint32_t cp;
            if (!hex4(&cp)) return false;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
              uint32_t lo;
              if (pos_ + 2 > in_.size() || in_[pos_] != '\\' || in_[pos_ + 1] != 'u') {
                return fail("a lone \\u surrogate");
              }
              pos_ += 2;
              if (!hex4(&lo)) return false;
              if (lo < 0xDC00 || lo > 0xDFFF) return fail("a lone \\u surrogate");
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
              return fail("a lone \\u surrogate");
            }
            if (decoded) put_utf8(decoded, cp);
            continue;
          }
          default:
            return fail("an invalid escape in a string");
        }
        if (decoded) decoded->push_back(lit);
        continue;
      }
      // UTF-8: exact lengths, no overlongs, no surrogates, at most U+10FFFF.
      size_t n = 0;
      uint32_t cp = 0;
      if (c < 0x80) { n = 1; cp = c; }
      else if (c >= 0xC2 && c <= 0xDF) { n = 2; cp = c & 0x1F; }
      else if (c >= 0xE0 && c <= 0xEF) { n = 3; cp = c & 0x0F; }
      else if (c >= 0xF0 && c <= 0xF4) { n = 4; cp = c & 0x07; }
      else return fail("invalid UTF-8 in a string");
      if (pos_ + n > in_.size()) return fail("invalid UTF-8 in a string");
      for (size_t i = 1; i < n; ++i) {
        unsigned char d = static_cast<unsigned char>(in_[pos_ + i]);
        if ((d & 0xC0) != 0x80) return fail("invalid UTF-8 in a string");
        cp = (cp << 6) | (d & 0x3F);
      }
      if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
          (n == 4 && (cp < 0x10000 || cp > 0x10FFFF))) {
        return fail("invalid UTF-8 in a string");
      }
      if (decoded) decoded->append(in_.substr(pos_, n));
      pos_ += n;
    }
  }
  bool number() {
    size_t s = pos_;
    if (pos_ < in_.size() && in_[pos_] == '-') ++pos_;
    auto digit = [&] { return pos_ < in_.size() && in_[pos_] >= '0' && in_[pos_] <= '9'; };
    if (!digit()) return fail("an invalid number");
    if (in_[pos_] == '0') {
      ++pos_;
    } else {
      while (digit()) ++pos_;
    }
    if (pos_ < in_.size() && in_[pos_] == '.') {
      ++pos_;
      if (!digit()) return fail("an invalid number");
      while (digit()) ++pos_;
    }
    if (pos_ < in_.size() && (in_[pos_] == 'e' || in_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < in_.size() && (in_[pos_] == '+' || in_[pos_] == '-')) ++pos_;
      if (!digit()) return fail("an invalid number");
      while (digit()) ++pos_;
    }
    return pos_ > s;
  }
  bool literal(std::string_view word) {
    if (in_.substr(pos_, word.size()) != word) return fail("an invalid literal");
    pos_ += word.size();
    return true;
  }

  // A key as each of podman's decoders reads it: `simple` for encoding/json
  // (podman 4.3, 5.x), `lower` for json-iterator (podman 6). A key binds to a
  // field named `name` (ASCII, lower case) when either equals it.
  struct Key {
    std::string simple, lower;
    bool is(std::string_view name) const { return simple == name || lower == name; }
  };

  static Mode child_mode(Mode m, const Key& k) {
    switch (m) {
      case Mode::libpod_top:
        return k.is("annotations") ? Mode::annotations : Mode::none;
      case Mode::compat_top:
        return k.is("hostconfig") ? Mode::hostconfig : Mode::none;
      case Mode::hostconfig:
        return k.is("annotations") ? Mode::annotations : Mode::none;
      default:
        return Mode::none;
    }
  }
  static bool drops(Mode m, const Key& k) {
    switch (m) {
      case Mode::libpod_top: return k.is("oci_runtime");
      case Mode::hostconfig: return k.is("runtime");
      case Mode::annotations:
        return is_runtime_annotation(k.simple) || is_runtime_annotation(k.lower);
      default: return false;
    }
  }

  // A value at pos_ (whitespace skipped by the caller). Appends its text, as
  // rewritten, to `out` when not null.
  bool value(int depth, Mode mode, std::string* out) {
    if (depth > kMaxDepth) return fail("nesting deeper than " + std::to_string(kMaxDepth));
    if (pos_ >= in_.size()) return fail("a missing value");
    size_t start = pos_;
    char c = in_[pos_];
    bool ok;
    if (c == '{') {
      if (mode != Mode::none && out) return object(depth, mode, out);
      ok = object(depth, Mode::none, nullptr);
    } else if (mode != Mode::none) {
      // Only null may stand for an object the engine reads; anything else
      // would fail to decode there, and is refused here.
      if (c != 'n') return fail("a field the filter must inspect is neither an object nor null");
      ok = literal("null");
    } else if (c == '[') {
      ok = array(depth);
    } else if (c == '"') {
      ok = string(nullptr);
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      ok = number();
    } else if (c == 't') {
      ok = literal("true");
    } else if (c == 'f') {
      ok = literal("false");
    } else if (c == 'n') {
      ok = literal("null");
    } else {
      return fail("an unexpected character");
    }
    if (ok && out) out->append(in_.substr(start, pos_ - start));
    return ok;
  }

  bool array(int depth) {
    ++pos_;
    skip_ws();
    if (pos_ < in_.size() && in_[pos_] == ']') {
      ++pos_;
      return true;
    }
    while (true) {
      skip_ws();
      if (!value(depth + 1, Mode::none, nullptr)) return false;
      skip_ws();
      if (pos_ >= in_.size()) return fail("an unterminated array");
      if (in_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (in_[pos_] == ']') {
        ++pos_;
        return true;
      }
      return fail("an array missing a ',' or ']'");
    }
  }

  // An object. With `out`, it is rewritten: dropped members go, the others
  // keep their bytes and the separators before them.
  bool object(int depth, Mode mode, std::string* out) {
    size_t open = pos_;
    ++pos_;
    // Keys as each decoder folds them: two keys that one decoder binds alike
    // would be merged by it.
    std::unordered_set<std::string> seen_simple, seen_lower;
    struct Member {
      size_t sep_begin, key_begin;  // separator text: [sep_begin, key_begin)
      std::string text;             // key .. value, rewritten
      bool keep;
    };
    std::vector<Member> members;
    size_t sep_begin = pos_;
    skip_ws();
    if (pos_ < in_.size() && in_[pos_] == '}') {
      ++pos_;
      if (out) out->append(in_.substr(open, pos_ - open));
      return true;
    }
    size_t tail_begin = 0;
    while (true) {
      skip_ws();
      if (pos_ >= in_.size() || in_[pos_] != '"') return fail("an object key that is not a string");
      size_t key_begin = pos_;
      std::string key;
      if (!string(&key)) return false;
      Key k{fold(key), fold_lower(key)};
      // Both inserts run: a key must enter both sets.
      bool fresh = seen_simple.insert(k.simple).second;
      fresh = seen_lower.insert(k.lower).second && fresh;
      if (!fresh) {
        return fail("the key \"" + key.substr(0, 64) +
                    "\" repeats another key of its object (exactly or in another letter case); "
                    "the engine would merge them");
      }
      skip_ws();
      if (pos_ >= in_.size() || in_[pos_] != ':') return fail("a key without ':'");
      ++pos_;
      skip_ws();
      Member m{sep_begin, key_begin, {}, true};
      std::string* mo = out ? &m.text : nullptr;
      if (mo) mo->append(in_.substr(key_begin, pos_ - key_begin));
      Mode cm = out ? child_mode(mode, k) : Mode::none;
      if (!value(depth + 1, cm, mo)) return false;
      if (out && drops(mode, k)) {
        m.keep = false;
        ++stripped_;
        bool gvisor = k.simple.rfind("dev.gvisor.", 0) == 0 || k.lower.rfind("dev.gvisor.", 0) == 0;
        Stripped kind = mode == Mode::libpod_top   ? Stripped::oci_runtime
                        : mode == Mode::hostconfig ? Stripped::hostconfig_runtime
                        : gvisor                   ? Stripped::gvisor_annotation
                                                   : Stripped::sandbox_annotation;
        ++by_kind_[static_cast<int>(kind)];
      }
      if (out) members.push_back(std::move(m));
      size_t after_value = pos_;
      skip_ws();
      if (pos_ >= in_.size()) return fail("an unterminated object");
      if (in_[pos_] == ',') {
        sep_begin = after_value;
        ++pos_;
        continue;
      }
      if (in_[pos_] == '}') {
        tail_begin = after_value;
        ++pos_;
        break;
      }
      return fail("an object missing a ',' or '}'");
    }
    if (!out) return true;
    out->push_back('{');
    bool first = true;
    for (const Member& m : members) {
      if (!m.keep) continue;
      if (first) {
        // The whitespace after '{' (the first member's separator has no ',').
        out->append(in_.substr(members[0].sep_begin, members[0].key_begin - members[0].sep_begin));
        first = false;
      } else {
        out->append(in_.substr(m.sep_begin, m.key_begin - m.sep_begin));
      }
      out->append(m.text);
    }
    out->append(in_.substr(tail_begin, pos_ - tail_begin));
    return true;
  }

  std::string_view in_;
  Family family_;
  size_t pos_ = 0;
  std::string err_;
  int stripped_ = 0;
  int by_kind_[kStrippedKinds] = {};
};

}  // namespace

std::string_view stripped_name(Stripped s) {
  switch (s) {
    case Stripped::oci_runtime: return "oci_runtime";
    case Stripped::hostconfig_runtime: return "HostConfig.Runtime";
    case Stripped::gvisor_annotation: return "annotation:dev.gvisor.*";
    case Stripped::sandbox_annotation: return "annotation:cri-sandbox";
  }
  return "?";
}

bool is_runtime_annotation(std::string_view k) {
  return k.rfind("dev.gvisor.", 0) == 0 || k == "io.kubernetes.cri.sandbox-id" ||
         k == "io.kubernetes.cri.container-type" || k == "io.kubernetes.cri-o.sandboxid" ||
         k == "io.kubernetes.cri-o.containertype";
}

Rewrite rewrite_create(std::string_view body, Family family) {
  return Scanner(body, family).run();
}

}  // namespace fy::sockfilter
