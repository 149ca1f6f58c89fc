#include "proxy/tls/context.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <cstring>

namespace fy::tls {

std::string last_error() {
  uint32_t e = ERR_get_error();
  if (e == 0) return "unknown TLS error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return buf;
}

namespace {

int select_alpn(SSL*, const uint8_t** out, uint8_t* out_len, const uint8_t* in, unsigned in_len,
                void*) {
  // Offer HTTP/1.1 only: the decrypted path speaks HTTP/1.1 to the client.
  static const uint8_t kHttp11[] = {'h', 't', 't', 'p', '/', '1', '.', '1'};
  unsigned i = 0;
  while (i < in_len) {
    unsigned len = in[i];
    if (i + 1 + len > in_len) break;
    if (len == sizeof kHttp11 && memcmp(in + i + 1, kHttp11, len) == 0) {
      *out = in + i + 1;
      *out_len = static_cast<uint8_t>(len);
      return SSL_TLSEXT_ERR_OK;
    }
    i += 1 + len;
  }
  // No http/1.1 on offer: continue without ALPN rather than fail the handshake.
  return SSL_TLSEXT_ERR_NOACK;
}

}  // namespace

Result<bssl::UniquePtr<SSL_CTX>> make_server_context() {
  bssl::UniquePtr<SSL_CTX> ctx(SSL_CTX_new(TLS_with_buffers_method()));
  if (!ctx) return make_error(Errc::tls, "cannot create the server TLS context: {}", last_error());
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_max_proto_version(ctx.get(), TLS1_3_VERSION);
  SSL_CTX_set_alpn_select_cb(ctx.get(), select_alpn, nullptr);
  SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_OFF);
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_TICKET);
  return ctx;
}

Result<bssl::UniquePtr<SSL_CTX>> make_client_context(const ClientTrust& trust) {
  bssl::UniquePtr<SSL_CTX> ctx(SSL_CTX_new(TLS_method()));
  if (!ctx) return make_error(Errc::tls, "cannot create the client TLS context: {}", last_error());
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_max_proto_version(ctx.get(), TLS1_3_VERSION);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  static const uint8_t kAlpn[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
  SSL_CTX_set_alpn_protos(ctx.get(), kAlpn, sizeof kAlpn);
  struct stat st;
  if (!trust.system_roots.empty() && ::stat(trust.system_roots.c_str(), &st) == 0) {
    if (!SSL_CTX_load_verify_locations(ctx.get(), trust.system_roots.c_str(), nullptr))
      return make_error(Errc::tls, "cannot load the system roots {}: {}", trust.system_roots,
                        last_error());
  }
  if (!trust.extra_bundle.empty()) {
    if (::stat(trust.extra_bundle.c_str(), &st) != 0)
      return make_error(Errc::not_found, "upstream CA bundle {} does not exist: {}",
                        trust.extra_bundle, strerror(errno));
    if (!SSL_CTX_load_verify_locations(ctx.get(), trust.extra_bundle.c_str(), nullptr))
      return make_error(Errc::tls, "cannot load the upstream CA bundle {}: {}",
                        trust.extra_bundle, last_error());
  }
  ERR_clear_error();
  return ctx;
}

}  // namespace fy::tls
