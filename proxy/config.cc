#include "proxy/config.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/args.h"
#include "core/config.h"
#include "core/net.h"
#include "core/paths.h"
#include "core/text.h"

namespace fy::proxy {

std::string usage() {
  return R"(fy-proxy — foldyard's egress proxy (decrypting forward proxy, allowlist, Network Log)

usage: fy-proxy [options]

  --listen ADDR:PORT        where clients connect (default 127.0.0.1:8088; port 0 picks one)
  --admin ADDR:PORT|off     health and metrics endpoint (default 127.0.0.1:0)
  --state-dir DIR           CA, default policy and logs (default $XDG_STATE_HOME/foldyard/egress,
                            else ~/.local/state/foldyard/egress; made, 0700, when missing)
  --print-state-dir         print the state directory the other flags and the environment
                            name, and exit (scripts/serve prints what fy-proxy will use)
  --policy FILE             the live policy (default <state>/policy.toml, created in learn
                            mode on first start; an explicit file that is missing fails closed)
  --netlog FILE             the Network Log (default <state>/logs/egress.jsonl)
  --netlog-max-bytes N      rotate past N bytes (default 5242880)
  --netlog-backups N        dated backups kept (default 5)
  --port-file FILE          write the bound port here once listening
  --upstream-ca FILE        extra PEM roots trusted for origins (system roots always apply)
  --system-roots FILE       the system roots (default /etc/ssl/certs/ca-certificates.crt)
  --stamp-key FILE          the forwarder's stamp key (64 hex chars, mode 0600): verify stamps
  --resolve HOST=IP         answer HOST with IP instead of DNS (repeatable)
  --connect-to H:P=IP:P     connect to IP:P whenever H:P is dialled (repeatable)
  --host-env FILE           the host env file: FY_INJECT_<SWITCH>=<secret> lines
  --build-tokens FILE       hashed build secrets: {"tokens": {"<sha256>": "<expiry>"}}
  --learn-window SECONDS    learn window of a first-start policy (default 3600, max 28800)
  --max-connections N       clients at once; more are answered 503 (default 16384;
                            lowered to what the open-file limit holds)
  --max-head-bytes N        request head limit, 431 beyond (default 65536)
  --max-headers N           header count limit, 431 beyond (default 100)
  --head-timeout S          a started request head must arrive within S (408; default 10);
                            also bounds a connection's first head, a CONNECT's ClientHello,
                            the client's TLS handshake and a blind tunnel's first bytes
  --idle-timeout S          keep-alive wait for the next request (default 60)
  --connect-timeout S       upstream connect and TLS (504; default 10)
  --io-timeout S            silence during an exchange (504; default 300)
  --tunnel-idle-timeout S   silence in a tunnel (default 3600)
  --drain-timeout S         on SIGTERM, how long open work may finish (default 10)
  --minter-timeout S        a credential minter that has not answered is killed (default 30)
  --cert-cache N            minted leaf certificates kept (default 1024)
  --log-level LEVEL         debug, info, warn, error (default info)
  --config FILE             read these settings from a TOML file (keys as the flags,
                            with '_' for '-'; flags given after --config win)
  --help, --version

Signals: SIGHUP reloads the policy; SIGTERM/SIGINT drain and exit.
Exit codes: 0 clean exit, 1 runtime failure, 2 bad flags or config, 3 cannot listen.
Reference: docs/fy-proxy.md
)";
}

namespace {

Result<uint64_t> parse_seconds(std::string_view flag, std::string_view v) {
  auto n = parse_u64(v);
  if (!n || *n > 7 * 86400)
    return make_error(Errc::invalid_argument, "{} {}: expected whole seconds (0..604800)", flag, v);
  return *n * 1000;
}

Result<uint64_t> parse_count(std::string_view flag, std::string_view v, uint64_t min, uint64_t max) {
  auto n = parse_u64(v);
  if (!n || *n < min || *n > max)
    return make_error(Errc::invalid_argument, "{} {}: expected a number in {}..{}", flag, v, min,
                      max);
  return *n;
}

Result<void> check_endpoint(std::string_view flag, const std::string& v) {
  auto hp = parse_authority(v, 0);
  if (!hp || !(is_ipv4_literal(hp->host) || is_ipv6_literal(hp->host))) {
    // Port 0 is allowed: parse_authority refuses it, so check by hand.
    std::string s = v;
    size_t colon = s.rfind(':');
    if (colon != std::string::npos && s.substr(colon + 1) == "0") {
      std::string host = s.substr(0, colon);
      if (!host.empty() && host.front() == '[' && host.back() == ']')
        host = host.substr(1, host.size() - 2);
      if (is_ipv4_literal(host) || is_ipv6_literal(host)) return {};
    }
    return make_error(Errc::invalid_argument,
                      "{} {}: expected an IP address and port, e.g. 127.0.0.1:8088 or [::1]:0",
                      flag, v);
  }
  return {};
}

// Applies one setting; `flag` is the flag spelling for messages.
Result<void> apply(Config& c, std::string_view key, const std::string& v, std::string_view flag) {
  if (key == "listen") {
    FY_TRY(check_endpoint(flag, v));
    c.listen = v;
  } else if (key == "admin") {
    if (v != "off") FY_TRY(check_endpoint(flag, v));
    c.admin = v;
  } else if (key == "state-dir") {
    c.state_dir = v;
  } else if (key == "policy") {
    c.policy_file = v;
    c.policy_explicit = true;
  } else if (key == "netlog") {
    c.netlog_file = v;
  } else if (key == "netlog-max-bytes") {
    auto n = parse_count(flag, v, 4096, uint64_t{1} << 40);
    if (!n) return std::move(n).take_error();
    c.netlog_max_bytes = *n;
  } else if (key == "netlog-backups") {
    auto n = parse_count(flag, v, 0, 1000);
    if (!n) return std::move(n).take_error();
    c.netlog_backups = static_cast<int>(*n);
  } else if (key == "port-file") {
    c.port_file = v;
  } else if (key == "upstream-ca") {
    c.upstream_ca = v;
  } else if (key == "system-roots") {
    c.system_roots = v;
  } else if (key == "stamp-key") {
    c.stamp_key_file = v;
  } else if (key == "resolve") {
    size_t eq = v.find('=');
    if (eq == std::string::npos)
      return make_error(Errc::invalid_argument, "{} {}: expected HOST=IP", flag, v);
    auto host = normalize_host(std::string_view(v).substr(0, eq));
    std::string ip = v.substr(eq + 1);
    if (!host || !(is_ipv4_literal(ip) || is_ipv6_literal(ip)))
      return make_error(Errc::invalid_argument, "{} {}: expected HOST=IP with an IP literal", flag,
                        v);
    c.resolve.emplace_back(*host, ip);
  } else if (key == "connect-to") {
    size_t eq = v.find('=');
    auto from = eq == std::string::npos ? Result<HostPort>(Error{}) : parse_authority(v.substr(0, eq), 0);
    auto to = eq == std::string::npos ? Result<HostPort>(Error{}) : parse_authority(v.substr(eq + 1), 0);
    if (!from || !to || !(is_ipv4_literal(to->host) || is_ipv6_literal(to->host)))
      return make_error(Errc::invalid_argument, "{} {}: expected HOST:PORT=IP:PORT", flag, v);
    c.connect_to.emplace_back(from->authority(), to->authority());
  } else if (key == "host-env") {
    c.host_env_file = v;
  } else if (key == "build-tokens") {
    c.build_tokens_file = v;
  } else if (key == "learn-window") {
    auto n = parse_seconds(flag, v);
    if (!n) return std::move(n).take_error();
    if (*n == 0 || *n > 8 * 3600 * 1000)
      return make_error(Errc::invalid_argument, "{} {}: a learn window lasts 1..28800 s", flag, v);
    c.learn_window_ms = *n;
  } else if (key == "max-connections") {
    auto n = parse_count(flag, v, 1, 1'000'000);
    if (!n) return std::move(n).take_error();
    c.limits.max_connections = static_cast<uint32_t>(*n);
  } else if (key == "max-head-bytes") {
    auto n = parse_count(flag, v, 1024, 1 << 20);
    if (!n) return std::move(n).take_error();
    c.limits.max_head_bytes = *n;
  } else if (key == "max-headers") {
    auto n = parse_count(flag, v, 8, 10000);
    if (!n) return std::move(n).take_error();
    c.limits.max_headers = *n;
  } else if (key == "cert-cache") {
    auto n = parse_count(flag, v, 1, 1'000'000);
    if (!n) return std::move(n).take_error();
    c.cert_cache = *n;
  } else if (key == "log-level") {
    auto l = log::parse_level(v);
    if (!l)
      return make_error(Errc::invalid_argument, "{} {}: use debug, info, warn or error", flag, v);
    c.log_level = *l;
  } else {
    uint64_t* target = nullptr;
    if (key == "head-timeout") target = &c.limits.head_timeout_ms;
    else if (key == "idle-timeout") target = &c.limits.idle_timeout_ms;
    else if (key == "connect-timeout") target = &c.limits.connect_timeout_ms;
    else if (key == "io-timeout") target = &c.limits.io_timeout_ms;
    else if (key == "tunnel-idle-timeout") target = &c.limits.tunnel_idle_timeout_ms;
    else if (key == "drain-timeout") target = &c.limits.drain_timeout_ms;
    else if (key == "minter-timeout") target = &c.limits.minter_timeout_ms;
    if (!target)
      return make_error(Errc::invalid_argument, "unknown option {}: see fy-proxy --help", flag);
    auto n = parse_seconds(flag, v);
    if (!n) return std::move(n).take_error();
    if (*n == 0 && key != "drain-timeout")
      return make_error(Errc::invalid_argument, "{} must be at least 1 second", flag);
    *target = *n;
  }
  return {};
}

Result<void> apply_file(Config& c, const std::string& path) {
  auto doc = cfg::Doc::load_file(path);
  if (!doc) return std::move(doc).take_error();
  cfg::Table root = doc->root();
  // Every key is optional and mirrors a flag; integers and strings are both
  // accepted for numbers so the file reads naturally.
  static const char* kKeys[] = {
      "listen", "admin", "state_dir", "policy", "netlog", "netlog_max_bytes", "netlog_backups",
      "port_file", "upstream_ca", "system_roots", "stamp_key", "learn_window", "max_connections",
      "max_head_bytes", "max_headers", "head_timeout", "idle_timeout", "connect_timeout",
      "io_timeout", "tunnel_idle_timeout", "drain_timeout", "cert_cache", "log_level",
      "host_env", "build_tokens", "minter_timeout"};
  for (const char* k : kKeys) {
    std::string type = root.type_of(k);
    if (type.empty()) continue;
    std::string value;
    if (type == "string") {
      value = *root.string(k);
    } else if (type == "integer") {
      value = std::to_string(*root.integer(k, 0, INT64_MAX));
    } else {
      root.error(k, "expected a string or an integer, found " + type);
      continue;
    }
    std::string flag_key = k;
    for (char& ch : flag_key)
      if (ch == '_') ch = '-';
    auto r = apply(c, flag_key, value, root.where(k) + ": " + k);
    if (!r) root.error(k, r.error().message);
  }
  if (auto ct = root.string_map("connect_to")) {
    for (auto& [from, to] : *ct) {
      auto r = apply(c, "connect-to", from + "=" + to, root.where("connect_to") + ": connect_to");
      if (!r) root.error("connect_to", r.error().message);
    }
  }
  if (auto res = root.string_map("resolve")) {
    for (auto& [h, ip] : *res) {
      auto r = apply(c, "resolve", h + "=" + ip, root.where("resolve") + ": resolve");
      if (!r) root.error("resolve", r.error().message);
    }
  }
  root.finish();
  return doc->result();
}

}  // namespace

ConnectionBudget connection_budget(uint64_t nofile, uint32_t configured) {
  constexpr uint64_t kFixed = 32;      // stdio, epoll, signals, listeners, logs, watches, DNS
  constexpr uint64_t kPoolShare = 16;  // 1/16 of the limit for pooled origins, admin, minters
  // One descriptor a client: idle clients (most of any large count) hold no
  // origin, and a dial that finds none left is answered 503 (Connection::
  // connect_next), so descriptors never run out at accept.
  constexpr uint64_t kPerConnection = 1;
  auto reserve_for = [](uint64_t n) { return kFixed + n / kPoolShare; };
  auto fits = [&](uint64_t n) {
    uint64_t r = reserve_for(n);
    return n > r ? (n - r) / kPerConnection : 0;
  };
  ConnectionBudget b;
  nofile = std::min<uint64_t>(nofile, uint64_t{1} << 32);  // RLIM_INFINITY and friends
  b.reserve = reserve_for(nofile);
  b.max_connections = static_cast<uint32_t>(std::min<uint64_t>(fits(nofile), configured));
  b.lowered = b.max_connections < configured;
  // The smallest limit that admits `configured`: solve, then settle the rounding.
  uint64_t n = (kPerConnection * configured + kFixed) * kPoolShare / (kPoolShare - 1);
  while (fits(n) < configured) ++n;
  while (n > 1 && fits(n - 1) >= configured) --n;
  b.nofile_needed = n;
  return b;
}

Result<Config> parse_args(int argc, char** argv) {
  Config c;
  bool print_state_dir = false;
  // Every --key VALUE is a config key (apply()); --config reads a file in
  // place, so a flag after it overrides the file and one before it does not.
  ArgParser p;
  p.stop("--help,-h").stop("--version").flag("--print-state-dir", &print_state_dir);
  p.reject_positionals().any_long(
      [&c](std::string_view key, const std::string& value) -> ArgParser::Refusal {
        auto r = key == "config" ? apply_file(c, value)
                                 : apply(c, std::string(key), value, "--" + std::string(key));
        if (!r) return r.error().message;
        return std::nullopt;
      });
  ParsedArgs a = p.parse(argc, argv);
  if (a.stopped_at == "--help") return Error{Errc::closed, usage()};
  if (a.stopped_at == "--version") return Error{Errc::closed, "fy-proxy 0.1.0\n"};
  if (a.problem) {
    const ArgProblem& e = *a.problem;
    switch (e.kind) {
      case ArgProblem::Kind::needs_value:
        return make_error(Errc::invalid_argument, "{} needs a value: see fy-proxy --help",
                          e.option);
      case ArgProblem::Kind::bad_value:
        return make_error(Errc::invalid_argument, "{}", e.message);
      case ArgProblem::Kind::no_value:
      case ArgProblem::Kind::unknown:
        return make_error(Errc::invalid_argument, "unexpected argument '{}': see fy-proxy --help",
                          e.option);
    }
  }
  if (c.state_dir.empty()) c.state_dir = default_proxy_state_dir();
  if (c.policy_file.empty()) c.policy_file = c.state_dir + "/policy.toml";
  if (c.netlog_file.empty()) c.netlog_file = c.state_dir + "/logs/egress.jsonl";
  if (print_state_dir) return Error{Errc::closed, c.state_dir + "\n"};
  return c;
}

}  // namespace fy::proxy
