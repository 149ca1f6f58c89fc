#include "wall/nft.h"

#include <sched.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <thread>

#include "core/text.h"

namespace fy::wall {
Result<Nft> Nft::open() {
  auto ctx = nft::Ctx::open();
  if (!ctx) return std::move(ctx).take_error();
  return Nft(std::move(*ctx));
}

Result<void> Nft::run(const std::string& text, bool dry_run) {
  nft::Reply r = ctx_.run(text, dry_run);
  if (r.ok) return ok();
  std::string err = std::move(r.err);
  if (nft::not_permitted(err)) {
    return make_error(Errc::permission,
                      "the kernel refused: fy-wall needs CAP_NET_ADMIN to change the ruleset — "
                      "run it as root");
  }
  if (err.empty()) err = "(libnftables gave no message)";
  return make_error(Errc::refused,
                    "the kernel refused the transaction, so nothing was changed (the tables "
                    "as they were still hold):\n{}",
                    err);
}

Result<std::string> Nft::command(const std::string& cmd, bool stateless) {
  nft::Reply r = ctx_.run(cmd, false, stateless);
  if (r.ok) return std::move(r.out);
  const std::string& err = r.err;
  if (nft::not_permitted(err)) {
    return make_error(Errc::permission,
                      "the kernel refused: fy-wall needs CAP_NET_ADMIN to read the ruleset — "
                      "run it as root");
  }
  if (err.find("No such file or directory") != std::string::npos) return make_error(Errc::not_found, "{}", err);
  return make_error(Errc::io, "`nft {}` failed: {}", cmd, err);
}

Result<std::vector<TableRef>> Nft::tables() {
  auto out = command("list tables", true);
  if (!out) return std::move(out).take_error();
  std::vector<TableRef> tables;
  std::string_view rest = *out;
  while (!rest.empty()) {
    size_t nl = rest.find('\n');
    std::string_view line = trim_ows(rest.substr(0, nl));
    rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
    if (!line.starts_with("table ")) continue;
    line.remove_prefix(6);
    size_t sp = line.find(' ');
    if (sp == std::string_view::npos) continue;
    tables.push_back({std::string(line.substr(0, sp)), std::string(line.substr(sp + 1))});
  }
  return tables;
}

Result<std::optional<std::string>> Nft::list(const TableRef& t, bool stateless) {
  auto all = tables();
  if (!all) return std::move(all).take_error();
  bool present = false;
  for (const TableRef& x : *all) present = present || x == t;
  if (!present) return std::optional<std::string>();
  auto out = command("list table " + t.str(), stateless);
  if (!out) {
    if (out.error().code == Errc::not_found) return std::optional<std::string>();
    return std::move(out).take_error();
  }
  return std::optional<std::string>(std::move(*out));
}

std::string sorted_chains(std::string_view listing) {
  std::string head, tail;
  std::vector<std::pair<std::string, std::string>> chains;  // name, block
  std::string* block = nullptr;
  while (!listing.empty()) {
    size_t nl = listing.find('\n');
    std::string_view line = listing.substr(0, nl);
    listing.remove_prefix(nl == std::string_view::npos ? listing.size() : nl + 1);
    std::string_view t = trim_ows(line);
    if (t.starts_with("chain ") && t.ends_with("{")) {
      chains.emplace_back(std::string(t.substr(6, t.find(' ', 6) - 6)), "");
      block = &chains.back().second;
    }
    if (t.empty()) continue;  // the blank lines between chains
    std::string& into = block ? *block : (chains.empty() ? head : tail);
    into.append(line).push_back('\n');
    if (block && line == "\t}") block = nullptr;
  }
  std::sort(chains.begin(), chains.end());
  std::string out = head;
  for (const auto& [name, text] : chains) out += text;
  return out + tail;
}

Result<std::vector<std::string>> canonical_listing(const std::string& ruleset,
                                                   const std::vector<TableRef>& tables) {
  Result<std::vector<std::string>> result = make_error(Errc::internal, "not run");
  // A network namespace is per thread: the helper's unshare leaves this
  // thread's namespace alone, and the scratch namespace dies with the helper.
  std::thread helper([&] {
    if (unshare(CLONE_NEWNET) != 0) {
      result = make_error(errno == EPERM ? Errc::permission : Errc::io,
                          "cannot make a scratch network namespace to compare against ({}) — "
                          "status needs root",
                          strerror(errno));
      return;
    }
    auto nft = Nft::open();
    if (!nft) {
      result = std::move(nft).take_error();
      return;
    }
    auto applied = nft->run(ruleset);
    if (!applied) {
      result = std::move(applied).take_error();
      return;
    }
    std::vector<std::string> out;
    for (const TableRef& t : tables) {
      auto l = nft->list(t, true);
      if (!l) {
        result = std::move(l).take_error();
        return;
      }
      out.push_back(sorted_chains(l->value_or("")));
    }
    result = std::move(out);
  });
  helper.join();
  return result;
}

}  // namespace fy::wall
