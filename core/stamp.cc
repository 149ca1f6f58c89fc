#include "core/stamp.h"

#include <arpa/inet.h>

#include <cstring>

#include "core/crypto.h"
#include "core/net.h"
#include "core/text.h"

namespace fy::stamp {
namespace {

constexpr std::string_view kDomain = "fy-stamp\n";

bool valid_net(std::string_view s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
          c == '.' || c == '-'))
      return false;
  return true;
}

bool valid_who(std::string_view s) {
  if (s.empty() || s.size() > 160) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
          c == '.' || c == '-' || c == ':' || c == '@'))
      return false;
  return true;
}

bool valid_boot(std::string_view s) {
  if (s.size() != 36) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? c != '-' : !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// An IP literal exactly as inet_ntop writes it (dotted quad without leading
// zeros; RFC 5952 IPv6), so a stamp has one spelling only.
bool is_canonical_ip(std::string_view s) {
  if (s.empty() || s.size() >= INET6_ADDRSTRLEN) return false;
  char in[INET6_ADDRSTRLEN];
  std::memcpy(in, s.data(), s.size());
  in[s.size()] = '\0';
  unsigned char bin[sizeof(in6_addr)];
  char out[INET6_ADDRSTRLEN];
  int af = s.find(':') == std::string_view::npos ? AF_INET : AF_INET6;
  if (inet_pton(af, in, bin) != 1) return false;
  if (!inet_ntop(af, bin, out, sizeof out)) return false;
  return s == out;
}

// Splits "name=value" off the front of `rest` (fields end at ';').
bool take_field(std::string_view* rest, std::string_view name, std::string_view* value) {
  if (rest->size() <= name.size() || rest->substr(0, name.size()) != name ||
      (*rest)[name.size()] != '=')
    return false;
  rest->remove_prefix(name.size() + 1);
  size_t semi = rest->find(';');
  *value = rest->substr(0, semi);
  rest->remove_prefix(semi == std::string_view::npos ? rest->size() : semi + 1);
  return true;
}

Error bad(std::string_view why) {
  return Error{Errc::parse, "stamp refused: " + std::string(why)};
}

}  // namespace

bool is_stamp_header(std::string_view name) {
  return iequals(name, kHeader);
}

// Everything before ";mac=": the bytes the MAC covers.
std::string signed_of(const Fields& f) {
  std::string v = "v=1;src=" + f.src + ";net=" + f.net;
  if (!f.who.empty()) v += ";who=" + f.who;
  v += ";seq=" + std::to_string(f.seq) + ";boot=" + f.boot;
  return v;
}

std::string format(const Fields& f, std::string_view key) {
  std::string v = signed_of(f);
  std::string msg(kDomain);
  msg += v;
  v += ";mac=" + hex(hmac_sha256(key, msg));
  return v;
}

Result<Fields> verify(std::string_view value, std::string_view key) {
  if (value.size() > kMaxValue) return bad("too long");
  size_t mac_at = value.rfind(";mac=");
  if (mac_at == std::string_view::npos) return bad("no mac");
  std::string_view signed_part = value.substr(0, mac_at);
  std::string_view mac = value.substr(mac_at + 5);
  if (mac.size() != 64) return bad("mac is not 64 hex characters");
  for (char c : mac)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return bad("mac is not lowercase hex");

  // Check the MAC before trusting any field.
  std::string msg(kDomain);
  msg += signed_part;
  if (!ct_equal(hex(hmac_sha256(key, msg)), mac)) return bad("mac does not match");

  Fields f;
  std::string_view rest = signed_part, v;
  if (!take_field(&rest, "v", &v) || v != "1") return bad("unknown version");
  if (!take_field(&rest, "src", &v) || !is_canonical_ip(v))
    return bad("src is not an IP address in canonical form");
  f.src = v;
  if (!take_field(&rest, "net", &v) || !valid_net(v)) return bad("net is not a network name");
  f.net = v;
  if (rest.substr(0, 4) == "who=") {
    take_field(&rest, "who", &v);
    if (!valid_who(v)) return bad("who is malformed");
    f.who = v;
  }
  if (!take_field(&rest, "seq", &v)) return bad("no seq");
  auto seq = parse_u64(v);
  if (!seq || *seq == 0 || (v.size() > 1 && v[0] == '0'))
    return bad("seq is not a positive integer");
  f.seq = *seq;
  if (!take_field(&rest, "boot", &v) || !valid_boot(v)) return bad("boot is not a boot id");
  f.boot = v;
  if (!rest.empty()) return bad("unexpected fields");
  // One spelling only: whatever the field checks let through (a trailing ';',
  // say) must still re-format to the very bytes that were signed.
  if (signed_of(f) != signed_part) return bad("not in canonical form");
  return f;
}

bool ReplayGuard::accept(const std::string& boot, uint64_t seq) {
  auto it = boots_.find(boot);
  if (it == boots_.end()) {
    if (boots_.size() >= kMaxBoots) {
      auto lru = boots_.begin();
      for (auto i = boots_.begin(); i != boots_.end(); ++i)
        if (i->second.last_use < lru->second.last_use) lru = i;
      boots_.erase(lru);
    }
    it = boots_.emplace(boot, Window{}).first;
  }
  Window& w = it->second;
  w.last_use = ++tick_;
  auto bit = [&](uint64_t s) -> uint64_t& { return w.bits[(s % kWindow) / 64]; };
  auto mask = [](uint64_t s) { return uint64_t{1} << (s % 64); };
  if (seq > w.high) {
    // Clear the slots the window slides over.
    uint64_t from = w.high + 1;
    if (seq - w.high >= kWindow) {
      std::fill(w.bits.begin(), w.bits.end(), 0);
    } else {
      // Inclusive of seq, and written so that seq == UINT64_MAX ends it.
      for (uint64_t s = from;; ++s) {
        bit(s) &= ~mask(s);
        if (s == seq) break;
      }
    }
    w.high = seq;
    bit(seq) |= mask(seq);
    return true;
  }
  if (w.high - seq >= kWindow) return false;  // too old to tell: refuse
  if (bit(seq) & mask(seq)) return false;
  bit(seq) |= mask(seq);
  return true;
}

}  // namespace fy::stamp
