// Binding a connection to its first head's forwarder stamp (docs/fy-proxy.md,
// "Stamps"; docs/stamp.md). The connection asks once, at its first head,
// before anything can refuse it, so a refusal's row names who asked too.
//
// Two steps, both without a loop or I/O:
//   1. find the stamp fields of the head: in the parsed fields (find), or,
//      when llhttp could not parse the head, by a line scan of its raw bytes
//      (scan_raw: the forwarder only passes canonical heads, CRLF lines and
//      "Name: value", so the scan finds a stamp where the parser would);
//   2. bind: exactly one field, whose MAC verifies under the key and whose
//      (boot, seq) the replay guard has not seen, attributes the connection;
//      anything else records it unattributed.
// Step 2 checks the MAC with core's crypto layer (BoringSSL); there is no
// libuv here. The counting and logging of each outcome stay with the
// connection.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "core/stamp.h"
#include "proxy/http/header.h"
#include "proxy/netlog/row.h"

namespace fy::stamp_binding {

// The stamp fields one head carries: the value of the last one and how many.
struct Found {
  std::string_view value;  // trimmed of optional whitespace (raw scan)
  size_t count = 0;
};

// The stamp fields among a parsed head's fields.
Found find(std::span<const http::Header> headers);
// The stamp fields of a head that did not parse (or of none at all: ""). The
// first line (the request line) is never a field; a line is read only when
// its CRLF has arrived; a line without a colon is skipped.
Found scan_raw(std::string_view raw);

enum class Outcome : uint8_t {
  not_expected,  // no stamp key: attribution is not expected
  none,          // no stamp field
  several,       // two or more: none of them counts
  invalid,       // one, but it does not verify (`error` says why)
  replayed,      // one that verifies, but its (boot, seq) was already used
  valid,         // bound: `fields` are the connection's
};

struct Binding {
  Outcome outcome = Outcome::not_expected;
  netlog::Attribution attribution = netlog::Attribution::none;
  stamp::Fields fields;  // valid, and replayed (its boot and seq, for the log)
  std::string error;     // invalid
};

// Step 2. `key` is the raw stamp key ("" when the proxy has none); `guard`
// remembers each accepted (boot, seq), so it is asked only for a stamp that
// verifies.
Binding bind(const Found& found, std::string_view key, stamp::ReplayGuard& guard);

}  // namespace fy::stamp_binding
