#include "forwarder/ingress.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>

#include <cstring>

namespace fy::fwd {
namespace {

// The peer as (family, 16 bytes); false for anything but IPv4 / IPv6.
bool peer_bytes(const sockaddr* peer, int* family, std::array<uint8_t, 16>* out) {
  out->fill(0);
  if (peer->sa_family == AF_INET) {
    *family = AF_INET;
    std::memcpy(out->data(), &reinterpret_cast<const sockaddr_in*>(peer)->sin_addr, 4);
    return true;
  }
  if (peer->sa_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(peer)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a)) {
      *family = AF_INET;
      std::memcpy(out->data(), &a.s6_addr[12], 4);
    } else {
      *family = AF_INET6;
      std::memcpy(out->data(), &a, 16);
    }
    return true;
  }
  return false;
}

bool same_prefix(const std::array<uint8_t, 16>& a, const std::array<uint8_t, 16>& b, unsigned len) {
  const unsigned full = len / 8;
  if (std::memcmp(a.data(), b.data(), full) != 0) return false;
  const unsigned rest = len % 8;
  if (!rest) return true;
  const uint8_t mask = static_cast<uint8_t>(0xff << (8 - rest));
  return (a[full] & mask) == (b[full] & mask);
}

std::string text(int family, const std::array<uint8_t, 16>& a) {
  char buf[INET6_ADDRSTRLEN] = "";
  inet_ntop(family, a.data(), buf, sizeof buf);
  return buf;
}

}  // namespace

IngressVerdict judge_ingress(int ifindex, const IfLink* link, const sockaddr* peer) {
  if (ifindex <= 0) return IngressVerdict::no_ifindex;
  if (!link) return IngressVerdict::unknown_link;
  int family = 0;
  std::array<uint8_t, 16> src;
  if (!peer_bytes(peer, &family, &src)) return IngressVerdict::outside_prefix;
  const unsigned max = family == AF_INET ? 32 : 128;
  bool inside = false;
  for (const IfPrefix& p : link->prefixes) {
    if (p.family != family) continue;
    // The namespace's own address: a process in the bridge namespace itself
    // (its connection is reported on the link holding the address it
    // dialled or bound), never a container.
    if (p.local == src) return IngressVerdict::own_address;
    if (same_prefix(p.net, src, p.len > max ? max : p.len)) inside = true;
  }
  return inside ? IngressVerdict::ok : IngressVerdict::outside_prefix;
}

std::string describe_prefixes(const IfLink& link) {
  std::string s;
  for (const IfPrefix& p : link.prefixes)
    s += fmt::format("{}{}/{}", s.empty() ? "" : ", ", text(p.family, p.local), p.len);
  return s.empty() ? "no addresses" : s;
}

std::string ingress_refusal(IngressVerdict v, int ifindex, const IfLink* link,
                            const std::string& src) {
  switch (v) {
    case IngressVerdict::ok:
      return "";
    case IngressVerdict::no_ifindex:
      return "the kernel did not say which interface this connection arrived on, so its "
             "network cannot be stamped";
    case IngressVerdict::unknown_link:
      return fmt::format(
          "it arrived on interface {} of the bridge namespace, which is gone or unknown, so "
          "its network cannot be stamped",
          ifindex);
    case IngressVerdict::outside_prefix:
      return fmt::format(
          "it arrived on {} ({}), whose networks do not hold its source address {}; a "
          "connection is stamped only with the network it came from. Connect from the "
          "container's own address on that network",
          link->name, describe_prefixes(*link), src);
    case IngressVerdict::own_address:
      return fmt::format(
          "its source address {} is the bridge namespace's own address on {}, not a "
          "container's; only containers on the bridges are stamped",
          src, link->name);
  }
  return "";
}

}  // namespace fy::fwd
