// The forwarder's stamp: which client address (and, on the VM listener, which
// cgroup) made a connection, signed with the project's key so the host proxy
// can believe it. Specification with test vectors: docs/stamp.md.
//
//   Fy-Stamp: v=1;src=10.89.1.2;net=podman1;seq=42;boot=<uuid>;mac=<64 hex>
//
// Fields appear in exactly this order; `who` is optional and sits between net
// and seq. mac = HMAC-SHA256(key, "fy-stamp\n" + every byte before ";mac=").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/result.h"

namespace fy::stamp {

inline constexpr std::string_view kHeader = "Fy-Stamp";
inline constexpr size_t kMaxValue = 512;

struct Fields {
  std::string src;   // client IP as the forwarder saw it
  std::string net;   // network name ([A-Za-z0-9_.-], 1..64), "host" for the VM listener
  std::string who;   // optional: "container:<64 hex>", "build:<scope>", "user"
  uint64_t seq = 0;  // per-boot connection sequence, from 1
  std::string boot;  // the guest's boot id (/proc/sys/kernel/random/boot_id)
};

// True for a header name that is a stamp, in any case.
bool is_stamp_header(std::string_view name);

// The header value, MAC included. `key` is the raw 32-byte key.
std::string format(const Fields& f, std::string_view key);

// Parses a header value and checks its MAC in constant time. Any deviation
// from the canonical form is an error: a stamp is either exactly what a
// forwarder wrote or it is none.
Result<Fields> verify(std::string_view value, std::string_view key);

// Remembers which sequences of each boot were already presented, so a stamp
// copied from one connection onto another is refused. Keeps a window of
// `kWindow` sequences behind the highest seen per boot, and at most
// `kMaxBoots` boots (the least recently used is forgotten).
class ReplayGuard {
 public:
  static constexpr uint64_t kWindow = 1 << 16;
  static constexpr size_t kMaxBoots = 64;
  // True the first time (boot, seq) is seen; false for a repeat or for a
  // sequence older than the window.
  bool accept(const std::string& boot, uint64_t seq);

 private:
  struct Window {
    uint64_t high = 0;
    std::vector<uint64_t> bits = std::vector<uint64_t>(kWindow / 64, 0);
    uint64_t last_use = 0;
  };
  std::unordered_map<std::string, Window> boots_;
  uint64_t tick_ = 0;
};

}  // namespace fy::stamp
