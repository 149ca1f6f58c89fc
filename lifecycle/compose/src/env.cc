#include "env.h"

#include <array>

namespace fy::compose {
namespace {

constexpr std::array<std::string_view, 8> kPassNames = {
    "TERM", "COLORTERM", "NO_COLOR", "FORCE_COLOR", "LANG", "TZ", "WORKTREE", "WT_OFFSET"};
constexpr std::array<std::string_view, 5> kPassPrefixes = {"LC_", "COMPOSE_", "PODMAN_",
                                                           "BUILDAH_", "FOLDYARD_"};
constexpr std::array<std::string_view, 20> kHostOnly = {
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR",
    "DOCKER_HOST", "CONTAINER_HOST", "CONTAINER_CONNECTION", "DOCKER_CONTEXT",
    "DOCKER_CONFIG", "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY", "CONTAINER_SSHKEY",
    "CONTAINER_PASSPHRASE", "CONTAINERS_STORAGE_CONF", "REGISTRY_AUTH_FILE",
    "PODMAN_COMPOSE_PROVIDER", "TMP", "TEMP"};
constexpr std::array<std::string_view, 3> kHostOnlyPrefixes = {"XDG_", "CONTAINERS_CONF",
                                                               "CONTAINERS_REGISTRIES_CONF"};

bool starts_with_any(std::string_view name, const auto& prefixes) {
  for (auto p : prefixes)
    if (name.starts_with(p)) return true;
  return false;
}

bool valid_name(std::string_view n) {
  if (n.empty() || (n[0] >= '0' && n[0] <= '9')) return false;
  for (char c : n)
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
          c == '_'))
      return false;
  return true;
}

}  // namespace

bool host_only(std::string_view name) {
  for (auto h : kHostOnly)
    if (name == h) return true;
  return starts_with_any(name, kHostOnlyPrefixes);
}

Result<EnvPlan> plan_env(const EnvInput& in) {
  if (!in.guest_socket.starts_with("unix:///"))
    return make_error(Errc::invalid_argument,
                      "the guest-side engine socket '{}' is not a unix:///path URL: pass the "
                      "socket the guest's podman reaches (the filtered one under gVisor)",
                      in.guest_socket);
  EnvPlan plan;
  for (const auto& [k, v] : in.host) {
    bool listed = false;
    for (auto n : kPassNames) listed = listed || k == n;
    listed = listed || starts_with_any(k, kPassPrefixes);
    if (listed && !host_only(k) && !in.host_env_names.contains(k)) plan.env[k] = v;
  }
  std::set<std::string> seen;
  for (const auto& name : in.compose_env) {
    if (!valid_name(name))
      return make_error(Errc::invalid_argument,
                        "compose_env names '{}', which is not an environment variable name",
                        name);
    if (host_only(name))
      return make_error(Errc::invalid_argument,
                        "compose_env names {}, which describes only your computer and is never "
                        "sent to the guest: remove it from [project] compose_env",
                        name);
    if (!seen.insert(name).second) continue;
    auto it = in.host.find(name);
    if (it == in.host.end()) continue;
    plan.env[name] = it->second;
    plan.widenings.push_back(name);
  }
  for (const auto& [k, v] : in.computed) {
    if (!valid_name(k) || host_only(k))
      return make_error(Errc::internal, "the host computed the variable '{}', which is never sent",
                        k);
    plan.env[k] = v;
  }
  plan.env["DOCKER_HOST"] = in.guest_socket;
  plan.env["CONTAINER_HOST"] = in.guest_socket;
  return plan;
}

}  // namespace fy::compose
