#include "proxy/policy/principals.h"

#include <fmt/format.h>

namespace fy::policy {

namespace {

bool is_hex64(std::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// The stamp's `who` and `net` character set (docs/stamp.md), plus the '/'
// that separates a net selector's address.
bool stamp_chars(std::string_view s) {
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == ':' || c == '@' || c == '-';
    if (!ok) return false;
  }
  return true;
}

bool starts(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

}  // namespace

std::optional<std::string> selector_error(std::string_view sel) {
  if (sel == "box" || sel == "user" || sel == "build") return std::nullopt;
  if (starts(sel, "build:")) {
    if (sel.size() > 6 && stamp_chars(sel.substr(6))) return std::nullopt;
    return fmt::format("'{}': a build principal is \"build\" or \"build:<scope>\" as the stamp "
                       "writes it", sel);
  }
  if (starts(sel, "container:")) {
    if (is_hex64(sel.substr(10))) return std::nullopt;
    return fmt::format("'{}': a container is named by its full 64-hex id (container:<id>), as the "
                       "stamp carries it; a name is the engine's claim (the box's own engine writes "
                       "it), so it names no one for a credential", sel);
  }
  if (starts(sel, "uid:")) {
    std::string_view n = sel.substr(4);
    bool digits = !n.empty() && n.size() <= 10;
    for (char c : n) digits = digits && c >= '0' && c <= '9';
    if (digits) return std::nullopt;
    return fmt::format("'{}': a uid principal is uid:<number>", sel);
  }
  if (starts(sel, "net:")) {
    std::string_view rest = sel.substr(4);
    size_t slash = rest.find('/');
    std::string_view net = rest.substr(0, slash);
    std::string_view addr = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
    if (!net.empty() && stamp_chars(net) &&
        (slash == std::string_view::npos || (!addr.empty() && stamp_chars(addr))))
      return std::nullopt;
    return fmt::format("'{}': a network principal is net:<name> or net:<name>/<address>", sel);
  }
  if (starts(sel, "service:"))
    return fmt::format("'{}': a compose service is the engine's claim (the box's own engine "
                       "writes it), so it names no one for a credential; name the container "
                       "by id (container:<id>), its network (net:<name>) or its address "
                       "(net:<name>/<address>)", sel);
  return fmt::format("'{}' is not a principal: use \"box\", \"user\", \"build\", "
                     "\"build:<scope>\", \"container:<id>\", \"uid:<n>\", \"net:<name>\" or "
                     "\"net:<name>/<address>\"", sel);
}

bool selector_names(std::string_view sel, const Asker& a) {
  if (sel == "build" && a.build) return true;
  if (a.state != Asker::State::attributed) return false;
  if (sel == "user") return a.who == "user";
  if (sel == "build") return starts(a.who, "build:");
  if (starts(sel, "build:") || starts(sel, "container:") || starts(sel, "uid:"))
    return a.who == sel;
  if (starts(sel, "net:")) {
    std::string_view rest = sel.substr(4);
    size_t slash = rest.find('/');
    if (slash == std::string_view::npos) return a.net == rest;
    return a.net == rest.substr(0, slash) && a.src == rest.substr(slash + 1);
  }
  return false;
}

std::string asker_text(const Asker& a) {
  switch (a.state) {
    case Asker::State::unknown: return "unknown";
    case Asker::State::unattributed: return "unattributed";
    case Asker::State::attributed: break;
  }
  if (!a.who.empty()) return std::string(a.who);
  return fmt::format("net:{}/{}", a.net, a.src);
}

}  // namespace fy::policy
