// Fuzzes the policy loader: TOML parsing, validation, patterns, bundles; and
// judging with what it accepted.
#include <cstddef>
#include <cstdint>
#include <string>

#include "proxy/policy/policy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  const int64_t now = 1764450000000;
  auto p = fy::policy::Policy::parse(text, "fuzz.toml", now);
  if (!p) return 0;
  const auto& pol = **p;
  for (const char* host : {"a.example.test", "example.test", "1.2.3.4", "::1", "x.y.z"}) {
    for (uint16_t port : {80, 443, 8443}) {
      for (auto kind : {fy::policy::Kind::connect, fy::policy::Kind::https,
                        fy::policy::Kind::cleartext}) {
        (void)pol.judge({host, port, kind, port == 8443}, now);
        (void)pol.tunnel(host, port == 80 ? "" : "a.example.test", false);
      }
    }
  }
  (void)pol.summary(now);
  (void)pol.next_change_ms(now);
  return 0;
}
