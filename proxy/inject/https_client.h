// A one-shot HTTPS request from the proxy itself (the github-app minter asks
// GitHub for installation tokens with it). TLS is verified like any origin
// (system roots + --upstream-ca); no ambient proxy, no redirects, bounded.
#pragma once

#include <uv.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/net.h"
#include "core/result.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace fy::inject {

struct HttpsRequest {
  HostPort dest;        // where to connect (after the resolver's overrides)
  std::string method = "POST";
  std::string path;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  uint64_t timeout_ms = 30'000;
};

struct HttpsResponse {
  int status = 0;
  std::string body;
};

// Resolves a destination to the IP literal and port to connect to, or ""
// when DNS must be asked (host name unchanged, port as given).
using Resolver = std::function<std::pair<std::string, uint16_t>(const HostPort&)>;

// Starts the request. `done` is called exactly once, from a libuv callback
// (never from inside this call), unless cancel() was called first.
class HttpsCall;
HttpsCall* https_request(uv_loop_t* loop, SSL_CTX* ctx, const Resolver& resolve, HttpsRequest req,
                         std::function<void(Result<HttpsResponse>)> done);
void https_cancel(HttpsCall* call);

}  // namespace fy::inject
