// Reads the server name out of a TLS ClientHello before any TLS library sees
// it: the proxy decides between tunnelling and decrypting on it. Untrusted
// bytes; bounded; fuzzed (tests/proxy/fuzz_client_hello.cc).
#pragma once

#include <string>
#include <string_view>

namespace fy::tls {

inline constexpr size_t kMaxClientHello = 32 * 1024;

struct ClientHello {
  enum class Status { need_more, ok, not_tls, malformed };
  Status status = Status::need_more;
  std::string sni;      // normalized host name; "" when absent or not a valid host
  bool sni_present = false;
  bool alpn_h2 = false;  // offers "h2"
  bool alpn_http11 = false;
};

// Parses the start of a client's byte stream. `data` is everything received
// so far; need_more until the whole ClientHello has arrived (at most
// kMaxClientHello bytes, then malformed).
ClientHello parse_client_hello(std::string_view data);

}  // namespace fy::tls
