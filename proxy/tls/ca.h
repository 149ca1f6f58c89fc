// The proxy's certificate authority and the leaf certificates it mints.
//
// On first start the CA (ECDSA P-256, ten years) is generated under the state
// directory: ca-key.pem (mode 0600) and ca-cert.pem (the certificate the box
// trusts). Leaves are ECDSA P-256 under one key made at start, SAN = the host
// name or IP address, valid one year (never past the CA), and cached in an LRU
// of bounded size.
#pragma once

#include <openssl/evp.h>
#include <openssl/x509.h>
#include <openssl/pool.h>

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>

#include "core/result.h"

namespace fy::tls {

class CertAuthority {
 public:
  struct Stats {
    uint64_t hits = 0;
    uint64_t minted = 0;
    uint64_t evicted = 0;
  };

  // Loads <dir>/ca-key.pem and <dir>/ca-cert.pem, or creates both when
  // neither exists. A key readable by group or others is refused.
  static Result<std::unique_ptr<CertAuthority>> load_or_create(const std::string& dir,
                                                               size_t cache_size, bool* created);

  const std::string& cert_path() const { return cert_path_; }
  std::string cert_pem() const;

  // The DER leaf for `name` (a normalized host or IP literal), minted on a
  // miss. The pointer stays valid until the entry is evicted: take a
  // reference (CRYPTO_BUFFER_up_ref) before the next call if it must outlive it.
  Result<CRYPTO_BUFFER*> leaf_for(const std::string& name, int64_t now_ms);
  EVP_PKEY* leaf_key() const { return leaf_key_.get(); }
  CRYPTO_BUFFER* ca_der() const { return ca_der_.get(); }
  const Stats& stats() const { return stats_; }
  size_t cached() const { return lru_.size(); }

 private:
  CertAuthority() = default;
  Result<bssl::UniquePtr<CRYPTO_BUFFER>> mint(const std::string& name, int64_t now_ms);

  std::string cert_path_;
  bssl::UniquePtr<EVP_PKEY> ca_key_;
  bssl::UniquePtr<X509> ca_cert_;
  bssl::UniquePtr<CRYPTO_BUFFER> ca_der_;
  bssl::UniquePtr<EVP_PKEY> leaf_key_;
  size_t cache_size_ = 1024;
  // LRU: most recently used at the front.
  using Entry = std::pair<std::string, bssl::UniquePtr<CRYPTO_BUFFER>>;
  std::list<Entry> lru_;
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  Stats stats_;
};

}  // namespace fy::tls
