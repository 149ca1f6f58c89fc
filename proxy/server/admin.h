// The admin endpoint (loopback): GET /healthz answers "ok" with the policy
// state, GET /metrics the Prometheus text of the server's counters. One
// request per connection; anything else is 404/405.
#pragma once

#include <uv.h>

#include <string>

#include "core/result.h"

namespace fy::proxy {

class Server;

class Admin {
 public:
  Admin(Server& srv, uv_loop_t* loop);
  ~Admin();
  // Binds `endpoint` ("127.0.0.1:0"); returns the bound port.
  Result<int> listen(const std::string& endpoint);
  void close();

 private:
  static void on_connection(uv_stream_t* s, int status);
  Server& srv_;
  uv_tcp_t tcp_;
  bool open_ = false;
};

// Binds a TCP handle to "ip:port" (port may be 0) and listens.
Result<int> bind_and_listen(uv_tcp_t* tcp, const std::string& endpoint, int backlog,
                            uv_connection_cb cb);

}  // namespace fy::proxy
