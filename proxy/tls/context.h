// The two SSL_CTXs the proxy uses, built once at start:
//  - the server context for decrypted clients: TLS 1.2-1.3, ALPN "http/1.1"
//    only, certificates set per connection from the CA's leaf cache;
//  - the client context for origins: TLS 1.2-1.3, peers always verified
//    against the system roots plus an optional bundle, ALPN "http/1.1".
#pragma once

#include <openssl/ssl.h>

#include <string>

#include "core/result.h"

namespace fy::tls {

struct ClientTrust {
  std::string system_roots = "/etc/ssl/certs/ca-certificates.crt";
  std::string extra_bundle;  // PEM file of more roots (optional)
};

Result<bssl::UniquePtr<SSL_CTX>> make_server_context();
Result<bssl::UniquePtr<SSL_CTX>> make_client_context(const ClientTrust& trust);

// The most recent BoringSSL error as text (and clears the queue).
std::string last_error();

}  // namespace fy::tls
