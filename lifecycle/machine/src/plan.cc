#include "plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <nlohmann/json.hpp>

#include "core/text.h"

namespace fy::machine {

namespace {

using nlohmann::json;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> lines(std::string_view text) {
  std::vector<std::string_view> out;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    out.push_back(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return out;
}

std::string unquote(std::string_view v) {
  v = trim(v);
  if (v.size() >= 2 && ((v.front() == '"' && v.back() == '"') || (v.front() == '\'' && v.back() == '\'')))
    v = v.substr(1, v.size() - 2);
  return std::string(v);
}

std::vector<std::string_view> words(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
    size_t j = i;
    while (j < s.size() && s[j] != ' ' && s[j] != '\t') ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

}  // namespace

int64_t memory_mib(std::string_view configured) {
  std::string_view s = trim(configured);
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  // int(): the whole string must be an integer (Python's int() refuses "3.5").
  if (ec != std::errc() || p != s.data() + s.size() || s.empty() || v <= 0) return 8192;
  return v;
}

std::vector<Mount> isolation_mounts(const std::string& repo, const std::string& wt_root) {
  return {{repo, repo}, {wt_root, wt_root}};
}

std::string json_quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out.push_back(static_cast<char>(c));
    }
  }
  out.push_back('"');
  return out;
}

std::string shell_quote(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out.push_back(c);
  }
  out += "'";
  return out;
}

std::string lima_set_expr(const Resources& r, const std::vector<Mount>& mounts,
                          const std::optional<std::string>& vm_type) {
  std::string m;
  for (const auto& mt : mounts) {
    if (!m.empty()) m += ", ";
    m += fmt::format("{{\"location\": {}, \"mountPoint\": {}, \"writable\": true}}",
                     json_quote(mt.location), json_quote(mt.mount_point));
  }
  std::string expr = fmt::format(".cpus = {} | .memory = \"{}MiB\" | .disk = \"{}GiB\" | .mounts = [{}]",
                                 r.cpus, memory_mib(r.memory), r.disk_gib, m);
  if (vm_type) expr += fmt::format(" | .vmType = {}", json_quote(*vm_type));
  return expr;
}

std::vector<std::string> lima_create_argv(const std::string& limactl, const std::string& name,
                                          const std::string& set_expr) {
  return {limactl, "create", "--tty=false", "--name", name, "template://podman", "--set", set_expr};
}

std::optional<std::string> resolve_vm_type(const std::optional<std::string>& configured,
                                           std::string_view limactl_info_json) {
  if (configured && !configured->empty()) return configured;
  json j = json::parse(limactl_info_json, nullptr, false);
  if (!j.is_object() || !j.contains("vmTypes") || !j["vmTypes"].is_array()) return std::nullopt;
  for (const char* want : {"vz", "qemu"}) {
    for (const auto& t : j["vmTypes"])
      if (t.is_string() && t.get<std::string>() == want) return std::string(want);
  }
  return std::nullopt;
}

std::vector<LimaInstance> parse_lima_list(std::string_view json_lines) {
  std::vector<LimaInstance> out;
  for (auto l : lines(json_lines)) {
    l = trim(l);
    if (l.empty()) continue;
    json j = json::parse(l, nullptr, false);
    if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) continue;
    LimaInstance li;
    li.name = j["name"].get<std::string>();
    // A name lima would not give an instance ("", "x y") is not one: no
    // command of ours may be aimed at it.
    if (!valid_machine_name(li.name)) continue;
    if (j.contains("status") && j["status"].is_string()) li.status = j["status"].get<std::string>();
    if (j.contains("dir") && j["dir"].is_string()) li.dir = j["dir"].get<std::string>();
    if (j.contains("sshLocalPort") && j["sshLocalPort"].is_number_integer()) {
      int64_t p = j["sshLocalPort"].get<int64_t>();
      li.ssh_port = p >= 1 && p <= 65535 ? p : 0;  // not a port: unknown
    }
    out.push_back(std::move(li));
  }
  return out;
}

std::string provision_set_expr(std::string_view script, std::string_view marker) {
  return fmt::format(
      ".provision = ([ (.provision // [])[] | select((.script // \"\") | test({}) | not) ] + "
      "[{{\"mode\": \"system\", \"script\": {}}}])",
      json_quote(marker), json_quote(script));
}

std::string parse_provision_id(std::string_view lima_yaml, std::string_view marker) {
  std::string_view m = trim(marker);  // the marker as it appears stripped
  for (auto l : lines(lima_yaml)) {
    l = trim(l);
    if (l.substr(0, m.size()) == m && (l.size() == m.size() || l[m.size()] == ' ')) {
      return std::string(trim(l.substr(m.size())));
    }
  }
  return "";
}

std::vector<std::string> parse_lima_mounts(std::string_view lima_yaml) {
  std::vector<std::string> out;
  for (auto l : lines(lima_yaml)) {
    l = trim(l);
    if (!l.empty() && l.front() == '-') l = trim(l.substr(1));
    for (std::string_view key : {"mountPoint:", "location:"}) {
      if (l.substr(0, key.size()) == key) {
        std::string v = unquote(l.substr(key.size()));
        if (!v.empty() && v != "null") out.push_back(v);
      }
    }
  }
  return out;
}

std::optional<SshConfig> parse_ssh_config(std::string_view text) {
  SshConfig c;
  bool in_host = false, seen_host = false;
  for (auto l : lines(text)) {
    l = trim(l);
    if (l.empty() || l.front() == '#') continue;
    auto w = words(l);
    if (w.empty()) continue;
    std::string key = to_lower(w[0]);
    std::string_view rest = trim(l.substr(w[0].size()));
    if (!rest.empty() && rest.front() == '=') rest = trim(rest.substr(1));
    if (key == "host") {
      if (seen_host) break;  // the first block only
      seen_host = in_host = true;
      c.host = w.size() > 1 ? std::string(w[1]) : "";
      continue;
    }
    if (!in_host && seen_host) continue;
    if (key == "hostname" && !rest.empty()) c.hostname = unquote(rest);
    else if (key == "port" && c.port == 0) {
      auto v = parse_u64(unquote(rest));
      if (v && *v > 0 && *v < 65536) c.port = static_cast<int64_t>(*v);
    } else if (key == "user" && c.user.empty()) c.user = unquote(rest);
    else if (key == "identityfile" && c.identity.empty()) c.identity = unquote(rest);
  }
  if (c.port == 0 || c.user.empty()) return std::nullopt;
  // fy-machine writes these back into the pinned config: a value that would
  // not read back as itself (a quote, a space in a host or user, a control
  // byte) could change what ssh does, so such a config is refused.
  auto bad = [](const std::string& v, std::string_view extra) {
    return std::any_of(v.begin(), v.end(), [&](char ch) {
      return static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f || ch == '"' ||
             extra.find(ch) != std::string_view::npos;
    });
  };
  if (bad(c.hostname, " '#=") || bad(c.user, " '#=") || bad(c.identity, "") ||
      c.hostname.empty() || (!c.identity.empty() && c.identity.back() == ' '))
    return std::nullopt;
  return c;
}

std::vector<HostKey> parse_host_keys(std::string_view text) {
  std::vector<HostKey> out;
  for (auto l : lines(text)) {
    l = trim(l);
    if (l.empty() || l.front() == '#') continue;
    auto w = words(l);
    if (w.size() < 3) continue;
    std::string_view type = w[1], blob = w[2];
    bool ok_type = type.substr(0, 4) == "ssh-" || type.substr(0, 6) == "ecdsa-" ||
                   type.substr(0, 3) == "sk-";
    bool ok_blob = !blob.empty() && std::all_of(blob.begin(), blob.end(), [](char ch) {
      return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
             ch == '+' || ch == '/' || ch == '=';
    });
    if (!ok_type || !ok_blob) continue;
    HostKey k{std::string(type), std::string(blob)};
    if (std::find(out.begin(), out.end(), k) == out.end()) out.push_back(std::move(k));
  }
  return out;
}

PinVerdict judge_host_keys(const std::vector<HostKey>& pinned, const std::vector<HostKey>& seen) {
  if (seen.empty()) return PinVerdict::no_keys;
  if (pinned.empty()) return PinVerdict::first_contact;
  for (const auto& k : seen)
    if (std::find(pinned.begin(), pinned.end(), k) == pinned.end()) return PinVerdict::changed;
  return PinVerdict::match;
}

std::string render_pinned_ssh_config(const std::string& alias, const SshConfig& c,
                                     const std::string& known_hosts) {
  std::string out = fmt::format(
      "# written by fy-machine: lima's user, port and key, with the guest's host key pinned\n"
      "Host {}\n"
      "  HostName {}\n"
      "  Port {}\n"
      "  User {}\n",
      alias, c.hostname, c.port, c.user);
  if (!c.identity.empty()) out += fmt::format("  IdentityFile \"{}\"\n", c.identity);
  out += fmt::format(
      "  IdentitiesOnly yes\n"
      "  BatchMode yes\n"
      "  StrictHostKeyChecking yes\n"
      "  UserKnownHostsFile \"{}\"\n"
      "  GlobalKnownHostsFile /dev/null\n"
      "  HostKeyAlias {}\n"
      "  CheckHostIP no\n"
      "  UpdateHostKeys no\n",
      known_hosts, alias);
  return out;
}

std::vector<std::string> dns_allow_push_argv(const SshConfig& t, const std::string& key,
                                             const std::string& known_hosts,
                                             const std::string& alias) {
  return {"ssh", "-F", "/dev/null", "-i", key,
          "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
          "-o", "PasswordAuthentication=no", "-o", "KbdInteractiveAuthentication=no",
          "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
          "-o", "UserKnownHostsFile=" + known_hosts, "-o", "GlobalKnownHostsFile=/dev/null",
          "-o", "HostKeyAlias=" + alias, "-o", "CheckHostIP=no", "-o", "UpdateHostKeys=no",
          "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR",
          "-p", std::to_string(t.port), "root@" + t.hostname, "fy-dnsfwd-install"};
}

std::vector<std::string> dns_allow_render_argv(const std::string& bin, const std::string& policy,
                                               const std::string& out) {
  return {bin, policy, "--out", out};
}

std::string name_sent_file(std::string_view err, std::string_view file) {
  std::string out;
  while (!err.empty()) {
    size_t nl = err.find('\n');
    std::string_view l = err.substr(0, nl);
    err = nl == std::string_view::npos ? std::string_view{} : err.substr(nl + 1);
    size_t at = l.find("stdin:");
    if (at != std::string_view::npos && at + 6 < l.size() &&
        std::isdigit(static_cast<unsigned char>(l[at + 6])))
      out += std::string(l.substr(0, at)) + std::string(file) + ":" + std::string(l.substr(at + 6));
    else
      out += l;
    if (nl != std::string_view::npos) out += "\n";
  }
  return out;
}

bool path_within(const std::string& path, const std::string& dir) {
  if (dir.empty()) return false;
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  if (path == d) return true;
  return path.size() > d.size() && path.compare(0, d.size(), d) == 0 &&
         (d == "/" || path[d.size()] == '/');
}

std::string render_known_hosts(const std::string& alias, const std::vector<HostKey>& keys) {
  std::string out;
  for (const auto& k : keys) out += fmt::format("{} {} {}\n", alias, k.type, k.blob);
  return out;
}

std::string ssh_target_json(const std::string& config, const std::string& alias,
                            const SshConfig& c, const std::string& known_hosts) {
  return fmt::format(
      "{{\"config\": {}, \"host\": {}, \"user\": {}, \"known_hosts\": {}, \"port\": {}, "
      "\"identity\": {}}}",
      json_quote(config), json_quote(alias), json_quote(c.user), json_quote(known_hosts), c.port,
      json_quote(c.identity));
}

std::vector<std::string> podman_init_argv(const std::string& podman, const std::string& name,
                                          const Resources& r, const std::vector<Mount>& mounts) {
  std::vector<std::string> argv = {podman, "machine", "init", name,
                                   "--cpus", std::to_string(r.cpus),
                                   "--memory", std::to_string(memory_mib(r.memory)),
                                   "--disk-size", std::to_string(r.disk_gib)};
  for (const auto& m : mounts) {
    argv.push_back("--volume");
    argv.push_back(m.location + ":" + m.mount_point);
  }
  return argv;
}

std::vector<PodmanListed> parse_podman_list(std::string_view text) {
  std::vector<PodmanListed> out;
  for (auto l : lines(text)) {
    l = trim(l);
    size_t bar = l.rfind('|');
    if (l.empty() || bar == std::string_view::npos) continue;
    std::string_view n = trim(l.substr(0, bar));
    if (!n.empty() && n.back() == '*') n.remove_suffix(1);  // podman's default marker, once
    // Not a name podman accepts ([A-Za-z0-9][A-Za-z0-9._-]*): not a machine line.
    if (!valid_machine_name(n)) continue;
    out.push_back({std::string(n), iequals(trim(l.substr(bar + 1)), "true")});
  }
  return out;
}

std::vector<std::string> parse_podman_mounts(std::string_view machine_json) {
  std::vector<std::string> out;
  json j = json::parse(machine_json, nullptr, false);
  if (!j.is_object() || !j.contains("Mounts") || !j["Mounts"].is_array()) return out;
  for (const auto& m : j["Mounts"])
    if (m.is_object() && m.contains("Target") && m["Target"].is_string())
      out.push_back(m["Target"].get<std::string>());
  return out;
}

Selection select_backend(const std::optional<std::string>& env,
                         const std::optional<std::string>& config) {
  Selection s;
  std::string raw;
  if (env && !trim(*env).empty()) {
    raw = std::string(trim(*env));
    s.from = "MACHINE_BACKEND";
  } else if (config && !trim(*config).empty()) {
    raw = std::string(trim(*config));
    s.from = "[machine].backend";
  } else {
    s.name = "lima";
    s.from = "default";
    return s;
  }
  s.explicit_ = true;
  s.named = to_lower(raw);
  if (s.named == "lima" || s.named == "podman" || s.named == "qemu") {
    s.name = s.named;
  } else if (s.named == "native") {
    s.name = "podman";
    s.warnings.push_back(fmt::format(
        "⚠ {} = 'native' is RETIRED (ADR-0027): foldyard always has a VM, and 'native' targeted "
        "this host's own podman socket with no VM boundary — falling back to the podman (podman "
        "machine) backend.\n  Pick a VM backend and adopt it: [machine] backend = \"lima\" (the "
        "default) or \"podman\". A backend switch is a new VM: its box, volumes and caches are not "
        "carried over.",
        s.from == "MACHINE_BACKEND" ? "MACHINE_BACKEND" : "[machine].backend"));
  } else {
    s.name = "podman";
    s.warnings.push_back(fmt::format(
        "⚠ unknown {} '{}' — falling back to podman (the known backends: lima, podman, qemu).",
        s.from == "MACHINE_BACKEND" ? "MACHINE_BACKEND" : "[machine].backend", raw));
  }
  return s;
}

CliInfo cli_info(std::string_view backend) {
  if (backend == "lima") return {"limactl", "https://lima-vm.io — `brew install lima` on macOS"};
  if (backend == "qemu")
    return {"qemu-system-x86_64", "Debian's qemu-system-x86 (with qemu-utils, debootstrap, socat)"};
  return {"podman", "https://podman.io — `brew install podman` on macOS, `apt-get install podman`"};
}

std::string missing_cli_message(const Selection& s) {
  CliInfo ci = cli_info(s.name);
  if (s.explicit_) {
    return fmt::format(
        "✗ [machine].backend = '{}' but '{}' isn't installed.\n"
        "  Install it ({}) or name a different [machine].backend.",
        s.name, ci.cli, ci.hint);
  }
  return fmt::format(
      "✗ `{}` isn't installed, and '{}' is foldyard's DEFAULT [machine].backend — so there is no "
      "VM to target. Refusing to fall back to this host's own podman socket: foldyard always has a "
      "VM (ADR-0027).\n"
      "  Either install it ({}),\n"
      "  or name the other VM backend in foldyard.toml: [machine] backend = \"podman\" (podman "
      "machine).",
      ci.cli, s.name, ci.hint);
}

std::string one_vm_refusal(std::string_view other) {
  return fmt::format(
      "✗ podman machine '{0}' is already running, and macOS runs only ONE podman VM at a time "
      "(podman#26281).\n"
      "  Stop it first: podman machine stop {0}\n"
      "  or run one VM per project: [machine] backend = \"lima\".",
      other);
}

bool valid_machine_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  auto alnum = [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
  };
  if (!alnum(name[0])) return false;
  return std::all_of(name.begin(), name.end(),
                     [&](char c) { return alnum(c) || c == '.' || c == '_' || c == '-'; });
}

std::string wall_ports(int64_t b) {
  return fmt::format("{}-{}, {}-{}", b, b + 89, b + 100, b + 189);
}

bool cmdline_names_machine(std::string_view cmdline, std::string_view name) {
  if (name.empty()) return false;
  auto alnum = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  };
  size_t start = 0;
  while (start <= cmdline.size()) {
    size_t end = cmdline.find('\0', start);
    if (end == std::string_view::npos) end = cmdline.size();
    std::string_view arg = cmdline.substr(start, end - start);
    for (size_t at = arg.find(name); at != std::string_view::npos; at = arg.find(name, at + 1)) {
      bool left = at == 0 || !alnum(arg[at - 1]);
      size_t after = at + name.size();
      bool right = after == arg.size() || !alnum(arg[after]);
      if (left && right) return true;
    }
    start = end + 1;
  }
  return false;
}

}  // namespace fy::machine
