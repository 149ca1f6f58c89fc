// libFuzzer target: the ssh bytes fy-machine trusts least — a backend's
// ssh.config, ssh-keyscan's answer, the pinned known_hosts. Input: a split
// byte, then the config text and the key text. Traps when what fy-machine
// writes back does not read back as what it parsed (the pinned config's host,
// port, user and key; the known_hosts keys), or when the pin verdict is not
// the set relation it claims.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "plan.h"

using namespace fy::machine;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  size_t split = size > 1 ? data[0] % size : 0;
  std::string_view all(reinterpret_cast<const char*>(data + 1), size - 1);
  split = std::min(split, all.size());
  std::string_view cfg = all.substr(0, split), keys = all.substr(split);

  if (auto c = parse_ssh_config(cfg)) {
    if (c->port <= 0 || c->port > 65535 || c->user.empty()) abort();
    auto back = parse_ssh_config(render_pinned_ssh_config("fy-x", *c, "/k"));
    if (!back || back->hostname != c->hostname || back->port != c->port ||
        back->user != c->user || back->identity != c->identity)
      abort();
  }
  auto seen = parse_host_keys(keys);
  auto again = parse_host_keys(render_known_hosts("fy-x", seen));
  if (again != seen) abort();
  auto pinned = parse_host_keys(cfg);
  PinVerdict v = judge_host_keys(pinned, seen);
  if (seen.empty() != (v == PinVerdict::no_keys)) abort();
  if (v == PinVerdict::match)
    for (const auto& k : seen)
      if (std::find(pinned.begin(), pinned.end(), k) == pinned.end()) abort();
  return 0;
}
