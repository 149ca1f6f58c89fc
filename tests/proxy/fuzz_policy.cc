// Fuzzes the policy loader: TOML parsing, validation, patterns, bundles, the
// [[inject]] / [[held]] / [[overlap]] rules; and judging and matching with what
// it accepted. The hosts and paths matched come from the parsed rules
// themselves (and near misses of them), so rule_for / held_for / overlap_for
// reach their match paths instead of failing on the host compare.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "proxy/policy/policy.h"

namespace {

// Paths around a prefix: itself, longer, shorter by one byte, and the roots.
void paths_around(const std::string& prefix, std::vector<std::string>* out) {
  out->push_back(prefix);
  out->push_back(prefix + "x/y?token=1");
  if (!prefix.empty()) out->push_back(prefix.substr(0, prefix.size() - 1));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  const int64_t now = 1764450000000;
  auto p = fy::policy::Policy::parse(text, "fuzz.toml", now);
  if (!p) return 0;
  const auto& pol = **p;
  const fy::inject::Rules& rules = pol.rules();

  std::vector<std::string> hosts = {"a.example.test", "example.test", "1.2.3.4", "::1", "x.y.z"};
  std::vector<std::string> paths = {"/", "", "*", "/v1/", "/v1/x?token=a&%74oken=b"};
  for (const auto& r : rules.inject) {
    hosts.push_back(r.host);
    paths_around(r.path_prefix, &paths);
    (void)r.secret_name();
    (void)r.spec();
    if (rules.by_id(r.id) == nullptr) __builtin_trap();  // every parsed rule is found by its id
  }
  for (const auto& h : rules.held) {
    hosts.push_back(h.host);
    paths_around(h.path_prefix, &paths);
  }
  for (const auto& o : rules.overlaps) {
    hosts.push_back(o.host);
    paths_around(o.path_prefix, &paths);
  }
  // Bound the work per input: a file with many rules still runs quickly.
  if (hosts.size() > 24) hosts.resize(24);
  if (paths.size() > 48) paths.resize(48);

  for (const std::string& host : hosts) {
    for (const std::string& path : paths) {
      const fy::inject::Rule* rule = rules.rule_for(host, path);
      if (rule && !rule->matches(host, path)) __builtin_trap();
      const fy::inject::Held* held = rules.held_for(host, path);
      if (held && !held->matches(host, path)) __builtin_trap();
      const fy::inject::Overlap* ov = rules.overlap_for(host, path);
      if (ov && !ov->matches(host, path)) __builtin_trap();
    }
    // An injector or answer host is always decrypted, whatever passthrough says.
    bool acts = rules.is_injector_host(host) || rules.is_answer_host(host);
    if (acts && pol.tunnel(host, host, false)) __builtin_trap();
    for (uint16_t port : {80, 443, 8443}) {
      for (auto kind : {fy::policy::Kind::connect, fy::policy::Kind::https,
                        fy::policy::Kind::cleartext}) {
        (void)pol.judge({host, port, kind, port == 8443}, now);
        (void)pol.judge({host, port, kind, false}, now, /*implicit=*/false);
        (void)pol.tunnel(host, port == 80 ? "" : "a.example.test", false);
      }
    }
  }
  (void)pol.summary(now);
  (void)pol.next_change_ms(now);
  return 0;
}
