// Building the heads the proxy sends: the request head to the origin and the
// response head to the client. Heads are rebuilt into a small string (a few
// hundred bytes); bodies are never copied here.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "proxy/http/parser.h"

namespace fy::http {

// Hop-by-hop fields (RFC 9110 section 7.6.1) plus the proxy's own: never
// forwarded in either direction. Transfer-Encoding is not among them: the
// proxy forwards a body's framing as it arrived.
bool is_hop_by_hop(std::string_view name);

// Whether `name` is listed in the message's Connection header(s) and so is
// hop-by-hop for this message. Framing fields (Content-Length,
// Transfer-Encoding, Host) are never dropped this way: a Connection header
// naming them would change how the next hop frames the message.
bool named_by_connection(const Head& head, std::string_view name);

struct RequestOut {
  std::string_view method;
  std::string_view target;     // origin-form: "/path?query"
  std::string_view host;       // Host header value to send when the client sent none
  bool upgrade = false;        // a WebSocket/Upgrade request: keep Upgrade, send Connection: upgrade
  // Fields to set: any existing field of that name is removed and this one is
  // written once (credential injection overwrites, never appends).
  std::vector<std::pair<std::string_view, std::string>> set;
};

// Writes the request head for the origin into `out`.
void build_request_head(std::string& out, const Head& in, const RequestOut& req);

// Writes the response head for the client. `close` adds "Connection: close".
void build_response_head(std::string& out, const Head& in, bool close, bool upgrade);

// A complete response the proxy answers itself.
struct Answer {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  bool close = false;
  std::vector<std::pair<std::string, std::string>> headers;
};
void build_answer(std::string& out, const Answer& a);
const char* reason_phrase(int status);

}  // namespace fy::http
