#include "wall/parse.h"

#include <fmt/format.h>

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

#include "core/text.h"

namespace fy::wall {
namespace {

constexpr size_t kMaxListItems = 4096;  // far beyond any real config; bounds the work

// Quotes a value for an error message, keeping it printable and short.
std::string shown(std::string_view s) {
  std::string out = "'";
  size_t n = 0;
  for (char c : s) {
    if (++n > 80) {
      out += "…";
      break;
    }
    unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out += c;
    }
  }
  out += "'";
  return out;
}

Result<uint16_t> parse_port(std::string_view s, std::string_view whole) {
  auto v = parse_u64(s);
  if (!v) {
    return make_error(Errc::invalid_argument,
                      "{} is not a port or a range — write ports like \"41000\" or "
                      "\"41000-41089\", separated by commas",
                      shown(whole));
  }
  if (*v < 1 || *v > 65535) {
    return make_error(Errc::invalid_argument, "port {} in {} is out of range (1..65535)", *v,
                      shown(whole));
  }
  return static_cast<uint16_t>(*v);
}

Result<PortRange> parse_port_item(std::string_view item) {
  size_t dash = item.find('-');
  if (dash == std::string_view::npos) {
    auto p = parse_port(item, item);
    if (!p) return std::move(p).take_error();
    return PortRange{*p, *p};
  }
  auto lo = parse_port(trim_ows(item.substr(0, dash)), item);
  if (!lo) return std::move(lo).take_error();
  auto hi = parse_port(trim_ows(item.substr(dash + 1)), item);
  if (!hi) return std::move(hi).take_error();
  if (*lo > *hi) {
    return make_error(Errc::invalid_argument,
                      "{} runs backwards — write the lower port first ({}-{})", shown(item), *hi,
                      *lo);
  }
  return PortRange{*lo, *hi};
}

Result<std::vector<PortRange>> finish_ports(std::vector<PortRange> out) {
  if (out.empty()) {
    return make_error(Errc::invalid_argument,
                      "no ports given — list the project's daemon port bands, e.g. "
                      "\"41000-41089, 41100-41189\"");
  }
  std::sort(out.begin(), out.end(),
            [](const PortRange& a, const PortRange& b) { return a.lo < b.lo; });
  for (size_t i = 1; i < out.size(); ++i) {
    if (out[i].lo <= out[i - 1].hi) {
      return make_error(Errc::invalid_argument,
                        "ports {} and {} overlap — list each port once (bands must not "
                        "collide)",
                        format_range(out[i - 1]), format_range(out[i]));
    }
  }
  return out;
}

Result<Cidr4> parse_cidr_item(std::string_view s) {
  size_t slash = s.find('/');
  std::string_view addr = s.substr(0, slash);
  auto ip = parse_ipv4(addr);
  if (!ip) {
    return make_error(Errc::invalid_argument,
                      "{} is not an IPv4 prefix — write it like \"10.0.0.0/8\"", shown(s));
  }
  uint8_t prefix = 32;
  if (slash != std::string_view::npos) {
    std::string_view len = s.substr(slash + 1);
    auto v = parse_u64(len);
    if (!v || *v > 32 || len.size() > 2) {
      return make_error(Errc::invalid_argument,
                        "{} has a bad prefix length — write 0..32 after the '/'", shown(s));
    }
    prefix = static_cast<uint8_t>(*v);
  }
  uint32_t mask = prefix == 0 ? 0 : ~uint32_t{0} << (32 - prefix);
  if ((*ip & ~mask) != 0) {
    return make_error(Errc::invalid_argument, "{} has host bits set — write {}/{}", shown(s),
                      format_ipv4(*ip & mask), prefix);
  }
  return Cidr4{*ip, prefix};
}

Result<std::vector<Cidr4>> finish_cidrs(std::vector<Cidr4> out) {
  if (out.empty()) {
    return make_error(Errc::invalid_argument,
                      "no prefixes given — list at least one, e.g. \"10.0.0.0/8\"");
  }
  // nft refuses overlapping elements in one anonymous set; say so here, with
  // the two prefixes, instead of passing on the kernel's terser error.
  for (size_t i = 0; i < out.size(); ++i) {
    for (size_t j = i + 1; j < out.size(); ++j) {
      uint8_t p = std::min(out[i].prefix, out[j].prefix);
      uint32_t mask = p == 0 ? 0 : ~uint32_t{0} << (32 - p);
      if ((out[i].net & mask) == (out[j].net & mask)) {
        return make_error(Errc::invalid_argument,
                          "prefixes {} and {} overlap — list each range once", format_cidr(out[i]),
                          format_cidr(out[j]));
      }
    }
  }
  return out;
}

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-';
}

}  // namespace

std::vector<IdRange> Principal::ranges() const {
  std::vector<IdRange> out{{uid, uid}};
  out.insert(out.end(), subuids.begin(), subuids.end());
  return out;
}

Result<std::vector<PortRange>> parse_ports(std::string_view list) {
  std::vector<PortRange> out;
  for (std::string_view item : split_list(list, ',')) {
    if (out.size() >= kMaxListItems)
      return make_error(Errc::invalid_argument, "too many port entries (over {})", kMaxListItems);
    auto r = parse_port_item(item);
    if (!r) return std::move(r).take_error();
    out.push_back(*r);
  }
  return finish_ports(std::move(out));
}

Result<std::vector<PortRange>> parse_ports(const std::vector<std::string>& items) {
  if (items.size() > kMaxListItems)
    return make_error(Errc::invalid_argument, "too many port entries (over {})", kMaxListItems);
  std::vector<PortRange> out;
  for (const std::string& item : items) {
    std::string_view t = trim_ows(item);
    if (t.find(',') != std::string_view::npos) {
      return make_error(Errc::invalid_argument,
                        "{} holds a comma — write one port or range per array element",
                        shown(item));
    }
    auto r = parse_port_item(t);
    if (!r) return std::move(r).take_error();
    out.push_back(*r);
  }
  return finish_ports(std::move(out));
}

Result<uint32_t> parse_ipv4(std::string_view s) {
  uint32_t v = 0;
  int octets = 0;
  size_t i = 0;
  while (true) {
    size_t start = i;
    uint32_t octet = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9' && i - start < 4) {
      octet = octet * 10 + static_cast<uint32_t>(s[i] - '0');
      ++i;
    }
    size_t len = i - start;
    if (len == 0 || len > 3 || octet > 255 || (len > 1 && s[start] == '0')) break;
    v = (v << 8) | octet;
    ++octets;
    if (octets == 4) {
      if (i == s.size()) return v;
      break;
    }
    if (i >= s.size() || s[i] != '.') break;
    ++i;
  }
  return make_error(Errc::invalid_argument,
                    "{} is not an IPv4 address — write four decimal octets like 192.168.5.2",
                    shown(s));
}

Result<Cidr4> parse_cidr4(std::string_view s) {
  return parse_cidr_item(trim_ows(s));
}

Result<std::vector<Cidr4>> parse_cidrs(std::string_view list) {
  std::vector<Cidr4> out;
  for (std::string_view item : split_list(list, ',')) {
    if (out.size() >= kMaxListItems)
      return make_error(Errc::invalid_argument, "too many prefixes (over {})", kMaxListItems);
    auto c = parse_cidr_item(item);
    if (!c) return std::move(c).take_error();
    out.push_back(*c);
  }
  return finish_cidrs(std::move(out));
}

Result<std::vector<Cidr4>> parse_cidrs(const std::vector<std::string>& items) {
  if (items.size() > kMaxListItems)
    return make_error(Errc::invalid_argument, "too many prefixes (over {})", kMaxListItems);
  std::vector<Cidr4> out;
  for (const std::string& item : items) {
    auto c = parse_cidr_item(trim_ows(item));
    if (!c) return std::move(c).take_error();
    out.push_back(*c);
  }
  return finish_cidrs(std::move(out));
}

Result<UserRef> parse_user(std::string_view s) {
  if (s.empty()) {
    return make_error(Errc::invalid_argument,
                      "the walled user is empty — name the VM user, e.g. \"alice\" or 1000");
  }
  if (auto v = parse_u64(s)) {
    if (*v > 0xfffffffeULL)
      return make_error(Errc::invalid_argument, "uid {} is out of range (0..4294967294)", *v);
    return UserRef{true, static_cast<uint32_t>(*v), {}};
  }
  // POSIX portable login names plus '$' (Samba machine accounts) are what
  // shadow-utils accepts by default; refusing the rest keeps the value safe to
  // show and to compare against /etc/subuid.
  if (s.size() > 256)
    return make_error(Errc::invalid_argument, "the user name is over 256 characters");
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    bool ok = name_char(c) || (c == '$' && i + 1 == s.size());
    if (!ok || (i == 0 && c == '-')) {
      return make_error(Errc::invalid_argument,
                        "{} is neither a login name nor a uid — write the VM user's name or "
                        "its decimal uid",
                        shown(s));
    }
  }
  return UserRef{false, 0, std::string(s)};
}

Result<std::string> parse_vm_name(std::string_view s) {
  if (s.empty() || s.size() > 64) {
    return make_error(Errc::invalid_argument,
                      "the VM name must be 1..64 characters — give the name the VM was "
                      "created with");
  }
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f || c == '"' || c == '\'' || c == '\\') {
      return make_error(Errc::invalid_argument,
                        "the VM name {} holds a space, quote, backslash or non-ASCII byte — "
                        "use letters, digits, '.', '_' and '-'",
                        shown(s));
    }
  }
  return std::string(s);
}

std::string host_table_name(std::string_view vm) {
  std::string out = "fy_host_wall_";
  for (char c : vm) {
    bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '_' || c == '.' || c == '/';
    out += keep ? c : '_';
  }
  return out;
}

Result<std::string> parse_cgroup_path(std::string_view s) {
  while (!s.empty() && s.front() == '/') s.remove_prefix(1);
  while (!s.empty() && s.back() == '/') s.remove_suffix(1);
  if (s.empty()) {
    return make_error(Errc::invalid_argument,
                      "the cgroup is empty or the root — give the VM's slice relative to the "
                      "cgroup2 root, e.g. \"user.slice/…/fy-machine-dev.slice\"");
  }
  if (s.size() > 4000) return make_error(Errc::invalid_argument, "the cgroup path is too long");
  std::string_view rest = s;
  while (!rest.empty()) {
    size_t p = rest.find('/');
    std::string_view comp = rest.substr(0, p);
    rest.remove_prefix(p == std::string_view::npos ? rest.size() : p + 1);
    if (comp.empty() || comp == "." || comp == "..") {
      return make_error(Errc::invalid_argument,
                        "the cgroup {} has an empty, '.' or '..' component — write the plain "
                        "path below the cgroup2 root",
                        shown(s));
    }
    for (char c : comp) {
      bool ok = name_char(c) || c == '@' || c == ':' || c == '+' || c == '=' || c == ',';
      if (!ok) {
        return make_error(Errc::invalid_argument,
                          "the cgroup {} holds {} — nft cannot match it safely; use the "
                          "unescaped unit names systemd shows under /sys/fs/cgroup",
                          shown(s), shown(std::string_view(&c, 1)));
      }
    }
  }
  return std::string(s);
}

int cgroup_level(std::string_view normalized) {
  return 1 + static_cast<int>(std::count(normalized.begin(), normalized.end(), '/'));
}

std::string format_range(const PortRange& r) {
  return r.lo == r.hi ? fmt::format("{}", r.lo) : fmt::format("{}-{}", r.lo, r.hi);
}

std::string format_id_range(const IdRange& r) {
  return r.lo == r.hi ? fmt::format("{}", r.lo) : fmt::format("{}-{}", r.lo, r.hi);
}

std::string format_ipv4(uint32_t v) {
  return fmt::format("{}.{}.{}.{}", v >> 24, (v >> 16) & 0xff, (v >> 8) & 0xff, v & 0xff);
}

std::string format_cidr(const Cidr4& c) {
  if (c.prefix == 32) return format_ipv4(c.net);
  return fmt::format("{}/{}", format_ipv4(c.net), c.prefix);
}

std::string format_ports(const std::vector<PortRange>& ports) {
  std::string out;
  for (const PortRange& r : ports) {
    if (!out.empty()) out += ", ";
    out += format_range(r);
  }
  return out;
}

std::string format_ids(const std::vector<IdRange>& ids) {
  std::string out;
  for (const IdRange& r : ids) {
    if (!out.empty()) out += ", ";
    out += format_id_range(r);
  }
  return out;
}

std::string format_cidrs(const std::vector<Cidr4>& cidrs) {
  std::string out;
  for (const Cidr4& c : cidrs) {
    if (!out.empty()) out += ", ";
    out += format_cidr(c);
  }
  return out;
}

std::string format_mark(uint16_t proxy_port_base) {
  return fmt::format("{:#010x}", (uint32_t{0xF4} << 24) | proxy_port_base);
}

std::string format_local_mark(uint16_t proxy_port_base) {
  return fmt::format("{:#010x}", (uint32_t{0xF4} << 24) | (uint32_t{1} << 16) | proxy_port_base);
}

std::vector<std::string> parse_resolv_conf(std::string_view text) {
  std::vector<std::string> out;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    auto word = [&line]() {
      size_t b = line.find_first_not_of(" \t\r");
      if (b == std::string_view::npos) return std::string_view{};
      size_t e = line.find_first_of(" \t\r", b);
      std::string_view w = line.substr(b, e == std::string_view::npos ? line.size() - b : e - b);
      line = e == std::string_view::npos ? std::string_view{} : line.substr(e);
      return w;
    };
    if (word() != "nameserver") continue;
    std::string addr(word());
    if (addr.size() > 45) continue;
    unsigned char buf[16];
    char txt[INET6_ADDRSTRLEN];
    int fam = addr.find(':') == std::string::npos ? AF_INET : AF_INET6;
    if (inet_pton(fam, addr.c_str(), buf) != 1) continue;
    if (!inet_ntop(fam, buf, txt, sizeof txt)) continue;
    if (std::find(out.begin(), out.end(), txt) == out.end()) out.emplace_back(txt);
  }
  return out;
}

std::vector<Listener> parse_proc_net_listeners(std::string_view text, std::string_view proto,
                                               bool v6) {
  // "  sl  local_address rem_address   st tx_queue:rx_queue tr:tm->when retrnsmt   uid ..."
  // local_address is the address as the kernel stores it (each 32-bit word in
  // host order, printed %08X), ':', the port %04X.
  std::vector<Listener> out;
  const std::string_view want = proto == "tcp" ? "0A" : "07";
  bool header = true;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    if (header) {
      header = false;
      continue;
    }
    std::vector<std::string_view> f;
    for (size_t at = 0; at < line.size() && f.size() < 8;) {
      size_t b = line.find_first_not_of(' ', at);
      if (b == std::string_view::npos) break;
      size_t e = line.find(' ', b);
      if (e == std::string_view::npos) e = line.size();
      f.push_back(line.substr(b, e - b));
      at = e;
    }
    if (f.size() < 8 || f[3] != want) continue;
    std::string_view local = f[1];
    size_t colon = local.find(':');
    const size_t hexlen = v6 ? 32 : 8;
    if (colon != hexlen || local.size() != hexlen + 5) continue;
    unsigned char raw[16];
    bool bad = false;
    for (size_t w = 0; w < hexlen / 8 && !bad; ++w) {
      uint32_t word = 0;
      for (size_t k = 0; k < 8; ++k) {
        char c = local[w * 8 + k];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (v < 0) bad = true;
        word = (word << 4) | static_cast<uint32_t>(v < 0 ? 0 : v);
      }
      std::memcpy(raw + w * 4, &word, 4);  // host order, as the kernel printed it
    }
    uint32_t port = 0, uid = 0;
    for (char c : local.substr(colon + 1)) {
      int v = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (v < 0) bad = true;
      port = (port << 4) | static_cast<uint32_t>(v < 0 ? 0 : v);
    }
    if (f[7].empty() || f[7].size() > 10) bad = true;
    for (char c : f[7]) {
      if (c < '0' || c > '9') bad = true;
      uid = uid * 10 + static_cast<uint32_t>(c - '0');
    }
    if (bad) continue;
    char txt[INET6_ADDRSTRLEN];
    if (!inet_ntop(v6 ? AF_INET6 : AF_INET, raw, txt, sizeof txt)) continue;
    out.push_back(Listener{std::string(proto), txt, static_cast<uint16_t>(port), uid});
  }
  return out;
}

}  // namespace fy::wall
