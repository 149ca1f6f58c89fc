#include "proxy/inject/rules.h"

#include <fmt/format.h>

#include "core/config.h"
#include "core/net.h"
#include "core/text.h"
#include "proxy/policy/principals.h"

namespace fy::inject {

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::static_secret: return "static";
    case Kind::command: return "command";
    case Kind::github_app: return "github-app";
  }
  return "?";
}

std::string Rule::secret_name() const {
  std::string out = "FY_INJECT_";
  for (char c : id) {
    char u = (c >= 'a' && c <= 'z') ? static_cast<char>(c - 32) : c;
    out += ((u >= 'A' && u <= 'Z') || (u >= '0' && u <= '9')) ? u : '_';
  }
  return out;
}

std::string Rule::spec() const {
  std::string s = fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|", id, kind_name(kind), host,
                              path_prefix, header, query_param, value_prefix, replay_on_401,
                              ttl_s, app_id);
  s += fmt::format("{}|", installation_id);
  for (const auto& a : command) s += a + "\x1f";
  s += "|";
  for (const auto& e : env) s += e + "\x1f";
  s += "|";
  for (const auto& r : repositories) s += r + "\x1f";
  return s;
}

namespace {
bool prefix_ok(std::string_view path, std::string_view prefix) {
  return prefix.empty() || path.substr(0, prefix.size()) == prefix;
}
// Prefixes nest when one starts with the other ("" nests with everything).
bool nests(std::string_view a, std::string_view b) {
  return a.substr(0, std::min(a.size(), b.size())) == b.substr(0, std::min(a.size(), b.size()));
}
}  // namespace

bool Rule::matches(std::string_view h, std::string_view path) const {
  return h == host && prefix_ok(path, path_prefix);
}
bool Held::matches(std::string_view h, std::string_view path) const {
  return h == host && prefix_ok(path, path_prefix);
}
bool Overlap::matches(std::string_view h, std::string_view path) const {
  return h == host && prefix_ok(path, path_prefix);
}

const Rule* Rules::rule_for(std::string_view host, std::string_view path) const {
  for (const Rule& r : inject)
    if (r.matches(host, path)) return &r;
  return nullptr;
}
const Rule* Rules::by_id(std::string_view id) const {
  for (const Rule& r : inject)
    if (r.id == id) return &r;
  return nullptr;
}
const Held* Rules::held_for(std::string_view host, std::string_view path) const {
  for (const Held& h : held)
    if (h.matches(host, path)) return &h;
  return nullptr;
}
const Overlap* Rules::overlap_for(std::string_view host, std::string_view path) const {
  for (const Overlap& o : overlaps)
    if (o.matches(host, path)) return &o;
  return nullptr;
}
bool Rules::is_injector_host(std::string_view host) const {
  for (const Rule& r : inject)
    if (r.host == host) return true;
  return false;
}
bool Rules::is_answer_host(std::string_view host) const {
  for (const Held& h : held)
    if (h.host == host) return true;
  for (const Overlap& o : overlaps)
    if (o.host == host) return true;
  return false;
}

namespace {

std::optional<std::string> host_of(cfg::Table& t) {
  auto host = t.string("host");
  if (!host) {
    if (!t.has("host")) t.error("", "needs host = \"<host name>\"");
    return std::nullopt;
  }
  auto n = normalize_host(*host);
  if (!n || host->find(':') != std::string::npos || host->find('*') != std::string::npos) {
    t.error("host", fmt::format("'{}' is not a host name (no port, no wildcard: injection is "
                                "HTTPS to port 443 of exactly this host)",
                                *host));
    return std::nullopt;
  }
  return *n;
}

std::string path_prefix_of(cfg::Table& t) {
  auto p = t.string("path_prefix");
  if (!p) return "";
  if (p->empty() || (*p)[0] != '/') {
    t.error("path_prefix", "must start with '/'");
    return "";
  }
  return *p;
}

bool valid_token(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
          c == '-' || c == '_' || c == '.'))
      return false;
  return true;
}

}  // namespace

void parse_rules(cfg::Table& root, Rules* out) {
  for (cfg::Table t : root.tables("inject")) {
    Rule r;
    r.where = t.where();
    auto sw = t.string("switch");
    if (!sw || !valid_token(*sw)) {
      t.error(sw ? "switch" : "", "needs switch = \"<name>\" (letters, digits, '-', '_', '.')");
    } else {
      r.id = *sw;
    }
    if (auto k = t.string("kind")) {
      if (*k == "static") r.kind = Kind::static_secret;
      else if (*k == "command") r.kind = Kind::command;
      else if (*k == "github-app") r.kind = Kind::github_app;
      else t.error("kind", fmt::format("'{}' is not a kind: use \"static\", \"command\" or "
                                       "\"github-app\"", *k));
    }
    if (auto h = host_of(t)) r.host = *h;
    r.path_prefix = path_prefix_of(t);
    auto header = t.string("header");
    auto qp = t.string("query_param");
    if (header && qp) {
      t.error("query_param", "give header or query_param, not both");
    } else if (qp) {
      if (!valid_token(*qp)) t.error("query_param", "is not a parameter name");
      r.query_param = *qp;
    } else {
      r.header = header ? *header : "Authorization";
      if (!valid_token(r.header)) t.error("header", "is not a header name");
    }
    if (auto vp = t.string("value_prefix")) r.value_prefix = *vp;
    r.replay_on_401 = r.kind == Kind::github_app;
    if (auto rp = t.boolean("replay_on_401")) r.replay_on_401 = *rp;
    if (auto ttl = t.integer("ttl", 60, 30 * 86400)) r.ttl_s = *ttl;
    if (auto cmd = t.strings("command")) r.command = *cmd;
    if (auto env = t.strings("env")) r.env = *env;
    if (auto a = t.integer("app_id", 1, INT64_MAX)) r.app_id = *a;
    if (auto i = t.integer("installation_id", 1, INT64_MAX)) r.installation_id = *i;
    if (auto repos = t.strings("repositories")) r.repositories = *repos;
    (void)t.string("label");  // the operator's note
    if (auto ps = t.strings("principals")) {
      for (const std::string& sel : *ps) {
        if (auto err = policy::selector_error(sel)) t.error("principals", *err);
      }
      if (ps->empty()) t.error("principals", "an empty list names nobody: leave principals out "
                                             "for the scope's default, or drop the rule");
      r.principals = *ps;
    }
    if (auto rb = t.string("refused_body")) r.refused_body = *rb;
    switch (r.kind) {
      case Kind::static_secret:
        if (!r.command.empty()) t.error("command", "only a command rule runs a command");
        break;
      case Kind::command:
        if (r.command.empty()) t.error("command", "a command rule needs command = [\"/path\", ...]");
        else if (r.command[0].empty() || r.command[0][0] != '/')
          t.error("command", "the minter must be an absolute path (no shell, no PATH search)");
        break;
      case Kind::github_app:
        if (r.app_id == 0 || r.installation_id == 0)
          t.error("kind", "a github-app rule needs app_id and installation_id");
        if (!r.host.empty() && r.host != "api.github.com")
          t.error("host", "a github-app rule is pinned to api.github.com");
        if (!r.command.empty()) t.error("command", "only a command rule runs a command");
        break;
    }
    for (const auto& e : r.env)
      if (!valid_token(e)) t.error("env", fmt::format("'{}' is not a variable name", e));
    t.finish();
    if (!r.id.empty()) {
      if (out->by_id(r.id)) {
        root.error("inject", fmt::format("{}: the switch '{}' is declared twice", r.where, r.id));
        continue;
      }
      out->inject.push_back(std::move(r));
    }
  }
  for (cfg::Table t : root.tables("held")) {
    Held h;
    if (auto host = host_of(t)) h.host = *host;
    h.path_prefix = path_prefix_of(t);
    auto header = t.string("header");
    auto qp = t.string("query_param");
    if (header && qp) t.error("query_param", "give header or query_param, not both");
    if (qp) {
      h.query_param = *qp;
      h.header.clear();
    } else if (header) {
      h.header = *header;
    }
    auto dummy = t.string("dummy");
    if (!dummy || dummy->empty()) t.error(dummy ? "dummy" : "", "needs dummy = \"<the box's dummy value>\"");
    else h.dummy = *dummy;
    h.axis = t.string("axis").value_or("credential");
    h.body = t.string("body").value_or("{\"message\":\"Bad credentials\"}");
    h.any_scheme = t.boolean("any_scheme").value_or(false);
    t.finish();
    out->held.push_back(std::move(h));
  }
  for (cfg::Table t : root.tables("overlap")) {
    Overlap o;
    if (auto host = host_of(t)) o.host = *host;
    o.path_prefix = path_prefix_of(t);
    o.message = t.string("message").value_or("two credentials claim this request");
    t.finish();
    out->overlaps.push_back(std::move(o));
  }
  if (auto d = root.string_map("defaults")) out->defaults = *d;

  // Two active rules on one host with nesting prefixes inject nothing: record
  // the overlap the supervisor did not, over the wider prefix's scope. Like
  // the reference ("neither injects"), it holds back both rules everywhere
  // either applies, not only where both do: the wider rule does not go on
  // injecting outside the narrower prefix.
  for (size_t i = 0; i < out->inject.size(); ++i) {
    for (size_t j = i + 1; j < out->inject.size(); ++j) {
      const Rule& a = out->inject[i];
      const Rule& b = out->inject[j];
      if (a.host != b.host || !nests(a.path_prefix, b.path_prefix)) continue;
      const std::string& wide = a.path_prefix.size() <= b.path_prefix.size() ? a.path_prefix
                                                                             : b.path_prefix;
      if (out->overlap_for(a.host, wide.empty() ? "/" : wide)) continue;
      out->overlaps.push_back(Overlap{
          a.host, wide,
          fmt::format("the switches '{}' and '{}' both claim {}{}; turn one off with `fy mode`",
                      a.id, b.id, a.host, wide)});
    }
  }
}

}  // namespace fy::inject
