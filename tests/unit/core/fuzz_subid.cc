// libFuzzer target: core/subid's reader of /etc/subuid and /etc/subgid, a file
// a user may influence (usermod, an admin's copy). Beside the sanitizers it
// holds a property: for the ids that matter (each grant's edges and their
// neighbours, 0, the largest id), the reader grants an id exactly when an
// oracle grants it. The oracle walks the text as shadow 4.13's commonio and
// subordinate_parse do, with libc's strtoul for getulong and find_range's
// unsigned long arithmetic, one line and one id at a time.
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "core/subid.h"

using namespace fy::subid;

namespace {

std::optional<uint32_t> lookup(const std::string& login) {
  if (login == "alice" || login == "alias") return 1000u;
  if (login == "bob") return 1001u;
  return std::nullopt;
}

bool getulong(const char* s, unsigned long* out) {
  errno = 0;
  char* end = nullptr;
  unsigned long v = strtoul(s, &end, 0);
  if (*s == '\0' || *end != '\0' || errno == ERANGE) return false;
  *out = v;
  return true;
}

struct Line {
  std::string owner;
  unsigned long start, count;
};

// commonio_open + subordinate_parse, for a text without NUL bytes.
std::vector<Line> oracle_lines(std::string_view text) {
  std::vector<Line> out;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string line(text.substr(0, nl));
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    if (line[0] == '+' || line[0] == '-') continue;  // name_is_nis (line[0] is '\0' if empty)
    char buf[1024];
    if (line.size() >= sizeof buf) continue;
    strcpy(buf, line.c_str());
    char* fields[3];
    int i = 0;
    for (char* cp = buf; i < 3 && cp; i++) {
      fields[i] = cp;
      while (*cp && *cp != ':') cp++;
      if (*cp)
        *cp++ = '\0';
      else
        cp = nullptr;
    }
    if (i != 3 || !*fields[0] || !*fields[1] || !*fields[2]) continue;
    Line l{fields[0], 0, 0};
    if (!getulong(fields[1], &l.start) || !getulong(fields[2], &l.count)) continue;
    out.push_back(l);
  }
  return out;
}

// find_range(db, "alice", val) != NULL, both passes.
bool oracle_has(const std::vector<Line>& lines, unsigned long val) {
  for (const Line& l : lines) {
    unsigned long first = l.start, last = first + l.count - 1;
    if (val < first || val > last) continue;
    if (l.owner == "alice" || l.owner == "1000") return true;
    auto u = lookup(l.owner);
    if (u && *u == 1000) return true;
  }
  return false;
}

bool reader_has(const std::vector<Range>& ranges, uint64_t v) {
  for (const Range& r : ranges)
    if (r.lo <= v && v <= r.hi) return true;
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)parse_nsswitch(text);
  auto r = parse(text, Owner{"alice", 1000}, lookup, "fuzz");
  if (text.find('\0') != std::string_view::npos) {
    if (r.ok()) abort();  // a NUL byte is always refused
    return 0;
  }
  auto lines = oracle_lines(text);
  std::vector<unsigned long> ids = {0, 1, 999, 1000, 1001, kMaxId - 1, kMaxId};
  for (const Line& l : lines) {
    for (unsigned long d : {0UL, 1UL}) {
      ids.push_back(l.start - d);
      ids.push_back(l.start + d);
      ids.push_back(l.start + l.count - 1 - d);
      ids.push_back(l.start + l.count - 1 + d);
    }
  }
  if (!r.ok()) {
    // Refused: the oracle must grant id 0, or more than kMaxRanges ranges.
    if (!oracle_has(lines, 0) && r.error().message.find("merge them") == std::string::npos) abort();
    return 0;
  }
  for (unsigned long v : ids) {
    if (v > kMaxId) continue;  // no id: the kernel maps none past it
    if (oracle_has(lines, v) != reader_has(r->ranges, v)) abort();
  }
  for (size_t i = 0; i < r->ranges.size(); ++i) {
    const Range& x = r->ranges[i];
    if (x.lo > x.hi || x.lo == 0 || x.hi > kMaxId) abort();
    if (i > 0 && static_cast<uint64_t>(r->ranges[i - 1].hi) + 1 >= x.lo) abort();
  }
  return 0;
}
