#include "proxy/tls/session_cache.h"

namespace fy::tls {
namespace {

// ex_data on each SSL: the key (a heap std::string freed with the SSL).
int key_index() {
  static int index = SSL_get_ex_new_index(
      0, nullptr, nullptr, nullptr,
      [](void*, void* ptr, CRYPTO_EX_DATA*, int, long, void*) {
        delete static_cast<std::string*>(ptr);
      });
  return index;
}

}  // namespace

void SessionCache::attach(SSL_CTX* ctx) {
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL);
  SSL_CTX_set_app_data(ctx, this);
  SSL_CTX_sess_set_new_cb(ctx, on_new_session);
}

void SessionCache::prepare(SSL* ssl, const std::string& key) {
  SSL_set_ex_data(ssl, key_index(), new std::string(key));
  auto it = index_.find(key);
  if (it == index_.end()) return;
  SSL_SESSION* session = it->second->second.get();
  SSL_set_session(ssl, session);  // takes its own reference
  ++offered_;
  if (SSL_SESSION_should_be_single_use(session)) {
    lru_.erase(it->second);
    index_.erase(it);
  }
}

int SessionCache::on_new_session(SSL* ssl, SSL_SESSION* session) {
  auto* cache = static_cast<SessionCache*>(SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl)));
  auto* key = static_cast<std::string*>(SSL_get_ex_data(ssl, key_index()));
  if (!cache || !key || !SSL_SESSION_is_resumable(session)) return 0;
  cache->store(*key, session);
  return 1;  // the cache owns the reference now
}

void SessionCache::store(const std::string& key, SSL_SESSION* session) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    lru_.erase(it->second);
    index_.erase(it);
  }
  lru_.emplace_front(key, bssl::UniquePtr<SSL_SESSION>(session));
  index_[key] = lru_.begin();
  while (lru_.size() > max_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

}  // namespace fy::tls
