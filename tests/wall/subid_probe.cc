// core/subid's read() run alone, for tests/wall/test_subid.py's parity test
// against shadow's newuidmap and newgidmap:
//
//   subid_probe uid|gid USER FILE     prints the ranges "A-B,C", or "" for none
//
// Exit 0 with the ranges, 3 with read()'s refusal on stderr.
#include <cstdio>
#include <string>

#include "core/subid.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: subid_probe uid|gid USER FILE\n");
    return 2;
  }
  using namespace fy::subid;
  const Kind kind = std::string(argv[1]) == "gid" ? Kind::gid : Kind::uid;
  auto who = find_owner(argv[2]);
  if (!who) {
    std::fprintf(stderr, "%s\n", who.error().message.c_str());
    return 3;
  }
  auto r = read(kind, *who, argv[3]);
  if (!r) {
    std::fprintf(stderr, "%s\n", r.error().message.c_str());
    return 3;
  }
  std::string out;
  for (const Range& x : r->ranges) out += (out.empty() ? "" : ",") + format_range(x);
  std::printf("%s\n", out.c_str());
  return 0;
}
