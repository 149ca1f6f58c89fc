// The C++ stamp implementation on the command line, for the tests that check
// it against docs/stamp.md and the independent Python implementation.
//
//   fyf-stamp-tool verify <key hex> <value>         -> JSON fields, exit 0; or the reason, exit 1
//   fyf-stamp-tool format <key hex> <src> <net> <who|-> <seq> <boot>  -> the value
//   fyf-stamp-tool serve <key hex>   one stamp value per stdin line; answers each
//       with "valid <json>", "replayed <json>" or "invalid <why>": verify() and
//       one ReplayGuard, as a proxy uses them (the recording proxy's verifier)
//   fyf-stamp-tool guard   "<boot> <seq>" per stdin line; answers each with
//       "accept" or "refuse" from one ReplayGuard (no key, no verify)
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>

#include "core/crypto.h"
#include "core/json.h"
#include "core/stamp.h"
#include "core/text.h"

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help") {
    puts(
        "usage: fyf-stamp-tool verify <key hex> <value>\n"
        "       fyf-stamp-tool format <key hex> <src> <net> <who|-> <seq> <boot>\n"
        "       fyf-stamp-tool serve <key hex>\n"
        "       fyf-stamp-tool guard");
    return argc < 2 ? 2 : 0;
  }
  std::string cmd = argv[1];
  if (cmd == "guard" && argc == 2) {
    fy::stamp::ReplayGuard guard;
    std::string line;
    while (std::getline(std::cin, line)) {
      size_t sp = line.find(' ');
      auto seq = sp == std::string::npos ? std::nullopt : fy::parse_u64(line.substr(sp + 1));
      if (!seq) {
        fprintf(stderr, "expected \"<boot> <seq>\", got: %s\n", line.c_str());
        return 2;
      }
      std::cout << (guard.accept(line.substr(0, sp), *seq) ? "accept\n" : "refuse\n");
    }
    std::cout.flush();
    return 0;
  }
  auto key = argc > 2 ? fy::unhex(argv[2]) : std::nullopt;
  if (!key || key->size() != 32) {
    fprintf(stderr, "the key must be 64 hex characters\n");
    return 2;
  }
  if (cmd == "verify" && argc == 4) {
    auto f = fy::stamp::verify(argv[3], *key);
    if (!f) {
      printf("%s\n", f.error().message.c_str());
      return 1;
    }
    std::string out;
    fy::JsonObject(out)
        .str("src", f->src)
        .str("net", f->net)
        .str("who", f->who)
        .unum("seq", f->seq)
        .str("boot", f->boot)
        .close();
    printf("%s\n", out.c_str());
    return 0;
  }
  if (cmd == "serve" && argc == 3) {
    fy::stamp::ReplayGuard guard;
    std::string line;
    while (std::getline(std::cin, line)) {
      auto f = fy::stamp::verify(line, *key);
      if (!f) {
        std::cout << "invalid " << f.error().message << std::endl;
        continue;
      }
      std::string out;
      fy::JsonObject(out)
          .str("src", f->src)
          .str("net", f->net)
          .str("who", f->who)
          .unum("seq", f->seq)
          .str("boot", f->boot)
          .close();
      std::cout << (guard.accept(f->boot, f->seq) ? "valid " : "replayed ") << out << std::endl;
    }
    return 0;
  }
  if (cmd == "format" && argc == 8) {
    fy::stamp::Fields f;
    f.src = argv[3];
    f.net = argv[4];
    f.who = std::string(argv[5]) == "-" ? "" : argv[5];
    f.seq = strtoull(argv[6], nullptr, 10);
    f.boot = argv[7];
    printf("%s\n", fy::stamp::format(f, *key).c_str());
    return 0;
  }
  fprintf(stderr, "bad arguments; see --help\n");
  return 2;
}
