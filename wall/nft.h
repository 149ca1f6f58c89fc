// fy-wall's view of libnftables: one core nft::Ctx per Nft (core/nft.h, which
// fy-forwarder shares), and what fy-wall asks of it: a transaction, the tables,
// a table's listing. Every ruleset text is handed to libnftables whole, which
// sends it to the kernel as one batch: the kernel commits all of it or none.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/nft.h"
#include "core/result.h"
#include "wall/render.h"

namespace fy::wall {

class Nft {
 public:
  // A context whose netlink socket talks to the calling thread's network
  // namespace. Output and errors are buffered, never printed.
  static Result<Nft> open();

  // Runs `text` as one transaction. With dry_run the kernel validates the
  // batch and nothing is committed. A refusal's message is nft's own,
  // prefixed with what it means; Errc::permission without CAP_NET_ADMIN.
  Result<void> run(const std::string& text, bool dry_run = false);

  // Every table in the namespace, in the kernel's order.
  Result<std::vector<TableRef>> tables();

  // The table as the kernel lists it, or nullopt when it is absent.
  // Stateless omits counter values, so two listings of the same rules compare
  // equal however much traffic they have seen.
  Result<std::optional<std::string>> list(const TableRef& t, bool stateless = true);

 private:
  explicit Nft(nft::Ctx ctx) : ctx_(std::move(ctx)) {}
  Result<std::string> command(const std::string& cmd, bool stateless);
  nft::Ctx ctx_;
};

// A table listing with its chains in name order: the order nft lists chains
// in is the order they were created, which means nothing to the packet path
// (a table whose `walled` chain was added by a later apply lists it last).
std::string sorted_chains(std::string_view listing);

// What the kernel would list for `tables` after `ruleset` is applied: the
// ruleset is applied in a fresh, empty network namespace of a helper thread
// and listed there (stateless). Comparing this with the live listing tells
// whether the live tables are exactly the rendered ones, in nft's own
// canonical spelling. Needs CAP_SYS_ADMIN and CAP_NET_ADMIN.
Result<std::vector<std::string>> canonical_listing(const std::string& ruleset,
                                                   const std::vector<TableRef>& tables);

}  // namespace fy::wall
