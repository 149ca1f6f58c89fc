// Resumable sessions with origins. A full handshake with an origin costs the
// proxy an ECDSA verify, a key exchange and a signature check (Debian's
// BoringSSL is built without assembly: ~0.3 ms of CPU); resuming skips all of
// that for the origin the proxy already verified.
//
// Contract: a session is offered only to a connection for the same key
// ("host:port" of the destination, which is also the name verified); sessions
// TLS 1.3 marks single-use are handed out once; the cache holds at most
// `max` keys (least recently stored dropped first). Loop thread only.
#pragma once

#include <openssl/ssl.h>

#include <list>
#include <string>
#include <unordered_map>

namespace fy::tls {

class SessionCache {
 public:
  explicit SessionCache(size_t max = 1024) : max_(max) {}
  // Installs the new-session callback on `ctx` (a client context).
  void attach(SSL_CTX* ctx);
  // Before a handshake: offers a cached session for `key` and tags `ssl` so
  // a session it receives is stored under `key`.
  void prepare(SSL* ssl, const std::string& key);
  size_t size() const { return index_.size(); }
  uint64_t resumptions() const { return offered_; }

 private:
  static int on_new_session(SSL* ssl, SSL_SESSION* session);
  void store(const std::string& key, SSL_SESSION* session);
  size_t max_;
  using Entry = std::pair<std::string, bssl::UniquePtr<SSL_SESSION>>;
  std::list<Entry> lru_;  // most recent first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  uint64_t offered_ = 0;
};

}  // namespace fy::tls
