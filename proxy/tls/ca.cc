#include "proxy/tls/ca.h"

#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/bytestring.h>
#include <openssl/ec.h>
#include <openssl/ec_key.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/mem.h>
#include <openssl/nid.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/net.h"

namespace fy::tls {
namespace {

std::string ssl_error() {
  uint32_t e = ERR_get_error();
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return buf;
}

bssl::UniquePtr<EVP_PKEY> new_p256_key() {
  bssl::UniquePtr<EC_KEY> ec(EC_KEY_new_by_curve_name(NID_X9_62_prime256v1));
  if (!ec || !EC_KEY_generate_key(ec.get())) return nullptr;
  bssl::UniquePtr<EVP_PKEY> pkey(EVP_PKEY_new());
  if (!pkey || !EVP_PKEY_assign_EC_KEY(pkey.get(), ec.release())) return nullptr;
  return pkey;
}

bool set_random_serial(X509* x) {
  uint8_t bytes[16];
  RAND_bytes(bytes, sizeof bytes);
  bytes[0] &= 0x7F;  // positive
  bssl::UniquePtr<BIGNUM> bn(BN_bin2bn(bytes, sizeof bytes, nullptr));
  return bn && BN_to_ASN1_INTEGER(bn.get(), X509_get_serialNumber(x));
}

bool add_ext(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  bssl::UniquePtr<X509_EXTENSION> ext(
      X509V3_EXT_nconf_nid(nullptr, &ctx, nid, const_cast<char*>(value.c_str())));
  return ext && X509_add_ext(cert, ext.get(), -1);
}

bool set_validity(X509* x, int64_t not_before_s, int64_t not_after_s) {
  return ASN1_TIME_set(X509_getm_notBefore(x), static_cast<time_t>(not_before_s)) &&
         ASN1_TIME_set(X509_getm_notAfter(x), static_cast<time_t>(not_after_s));
}

Result<void> write_file(const std::string& path, const std::string& data, mode_t mode) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return make_error(Errc::io, "cannot write {}: {}", tmp, strerror(errno));
  ::fchmod(fd, mode);
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n <= 0) {
      ::close(fd);
      return make_error(Errc::io, "cannot write {}: {}", tmp, strerror(errno));
    }
    off += static_cast<size_t>(n);
  }
  ::fsync(fd);
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    return make_error(Errc::io, "cannot rename {} to {}: {}", tmp, path, strerror(errno));
  return {};
}

std::string bio_string(BIO* bio) {
  const uint8_t* data;
  size_t len;
  BIO_mem_contents(bio, &data, &len);
  return std::string(reinterpret_cast<const char*>(data), len);
}

bssl::UniquePtr<CRYPTO_BUFFER> to_buffer(X509* x) {
  uint8_t* der = nullptr;
  int len = i2d_X509(x, &der);
  if (len <= 0) return nullptr;
  bssl::UniquePtr<CRYPTO_BUFFER> buf(CRYPTO_BUFFER_new(der, static_cast<size_t>(len), nullptr));
  OPENSSL_free(der);
  return buf;
}

}  // namespace

Result<std::unique_ptr<CertAuthority>> CertAuthority::load_or_create(const std::string& dir,
                                                                     size_t cache_size,
                                                                     bool* created) {
  std::unique_ptr<CertAuthority> ca(new CertAuthority);
  ca->cache_size_ = cache_size ? cache_size : 1;
  std::string key_path = dir + "/ca-key.pem";
  ca->cert_path_ = dir + "/ca-cert.pem";
  *created = false;

  struct stat kst, cst;
  bool have_key = ::stat(key_path.c_str(), &kst) == 0;
  bool have_cert = ::stat(ca->cert_path_.c_str(), &cst) == 0;
  if (have_key != have_cert) {
    return make_error(Errc::not_found,
                      "the CA in {} is half there ({} exists, {} does not): restore the missing "
                      "file, or remove both to have a new CA generated (the box must then trust "
                      "the new certificate)",
                      dir, have_key ? key_path : ca->cert_path_,
                      have_key ? ca->cert_path_ : key_path);
  }
  if (have_key) {
    if (kst.st_mode & 077)
      return make_error(Errc::permission,
                        "the CA key {} is readable by group or others (mode {:o}): chmod 600 {}",
                        key_path, kst.st_mode & 0777, key_path);
    bssl::UniquePtr<BIO> kb(BIO_new_file(key_path.c_str(), "r"));
    if (kb) ca->ca_key_.reset(PEM_read_bio_PrivateKey(kb.get(), nullptr, nullptr, nullptr));
    if (!ca->ca_key_)
      return make_error(Errc::parse, "cannot read the CA key {}: {}", key_path, ssl_error());
    bssl::UniquePtr<BIO> cb(BIO_new_file(ca->cert_path_.c_str(), "r"));
    if (cb) ca->ca_cert_.reset(PEM_read_bio_X509(cb.get(), nullptr, nullptr, nullptr));
    if (!ca->ca_cert_)
      return make_error(Errc::parse, "cannot read the CA certificate {}: {}", ca->cert_path_,
                        ssl_error());
    if (X509_check_private_key(ca->ca_cert_.get(), ca->ca_key_.get()) != 1)
      return make_error(Errc::invalid_argument,
                        "the CA key {} does not belong to the certificate {}: restore the pair",
                        key_path, ca->cert_path_);
  } else {
    ::mkdir(dir.c_str(), 0700);
    ca->ca_key_ = new_p256_key();
    bssl::UniquePtr<X509> x(X509_new());
    if (!ca->ca_key_ || !x) return make_error(Errc::internal, "CA key generation failed");
    int64_t now = time(nullptr);
    char host[256] = "host";
    gethostname(host, sizeof host - 1);
    std::string cn = std::string("foldyard egress proxy CA (") + host + ")";
    if (cn.size() > 64) cn = "foldyard egress proxy CA";
    X509_NAME* name = X509_get_subject_name(x.get());
    bool ok = X509_set_version(x.get(), X509_VERSION_3) && set_random_serial(x.get()) &&
              set_validity(x.get(), now - 86400, now + 10LL * 365 * 86400) &&
              X509_NAME_add_entry_by_txt(name, "O", MBSTRING_UTF8,
                                         reinterpret_cast<const uint8_t*>("foldyard"), -1, -1,
                                         0) &&
              X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                                         reinterpret_cast<const uint8_t*>(cn.c_str()), -1, -1,
                                         0) &&
              X509_set_issuer_name(x.get(), name) && X509_set_pubkey(x.get(), ca->ca_key_.get()) &&
              add_ext(x.get(), x.get(), NID_basic_constraints, "critical,CA:TRUE,pathlen:0") &&
              add_ext(x.get(), x.get(), NID_key_usage, "critical,keyCertSign,cRLSign") &&
              add_ext(x.get(), x.get(), NID_subject_key_identifier, "hash") &&
              X509_sign(x.get(), ca->ca_key_.get(), EVP_sha256());
    if (!ok) return make_error(Errc::internal, "CA certificate generation failed: {}", ssl_error());
    ca->ca_cert_ = std::move(x);

    bssl::UniquePtr<BIO> kb(BIO_new(BIO_s_mem()));
    bssl::UniquePtr<BIO> cb(BIO_new(BIO_s_mem()));
    if (!PEM_write_bio_PrivateKey(kb.get(), ca->ca_key_.get(), nullptr, nullptr, 0, nullptr,
                                  nullptr) ||
        !PEM_write_bio_X509(cb.get(), ca->ca_cert_.get()))
      return make_error(Errc::internal, "cannot encode the CA: {}", ssl_error());
    FY_TRY(write_file(key_path, bio_string(kb.get()), 0600));
    FY_TRY(write_file(ca->cert_path_, bio_string(cb.get()), 0644));
    *created = true;
  }
  ca->ca_der_ = to_buffer(ca->ca_cert_.get());
  ca->leaf_key_ = new_p256_key();
  if (!ca->ca_der_ || !ca->leaf_key_) return make_error(Errc::internal, "CA setup failed");
  return ca;
}

std::string CertAuthority::cert_pem() const {
  bssl::UniquePtr<BIO> b(BIO_new(BIO_s_mem()));
  PEM_write_bio_X509(b.get(), ca_cert_.get());
  return bio_string(b.get());
}

Result<bssl::UniquePtr<CRYPTO_BUFFER>> CertAuthority::mint(const std::string& name,
                                                           int64_t now_ms) {
  bssl::UniquePtr<X509> x(X509_new());
  if (!x) return make_error(Errc::internal, "out of memory");
  int64_t now = now_ms / 1000;
  int64_t ca_end = now + 365 * 86400;
  {
    // Never outlive the CA.
    int days = 0, secs = 0;
    const ASN1_TIME* end = X509_get0_notAfter(ca_cert_.get());
    bssl::UniquePtr<ASN1_TIME> now_t(ASN1_TIME_set(nullptr, static_cast<time_t>(now)));
    if (now_t && ASN1_TIME_diff(&days, &secs, now_t.get(), end)) {
      int64_t left = static_cast<int64_t>(days) * 86400 + secs;
      if (left < 365 * 86400) ca_end = now + left;
    }
  }
  bool ip = is_ipv4_literal(name) || is_ipv6_literal(name);
  std::string san = (ip ? "IP:" : "DNS:") + name;
  X509_NAME* subj = X509_get_subject_name(x.get());
  bool ok = X509_set_version(x.get(), X509_VERSION_3) && set_random_serial(x.get()) &&
            set_validity(x.get(), now - 86400, ca_end) &&
            X509_set_issuer_name(x.get(), X509_get_subject_name(ca_cert_.get())) &&
            X509_set_pubkey(x.get(), leaf_key_.get());
  if (ok && name.size() <= 64)
    ok = X509_NAME_add_entry_by_txt(subj, "CN", MBSTRING_UTF8,
                                    reinterpret_cast<const uint8_t*>(name.c_str()), -1, -1, 0);
  ok = ok && add_ext(x.get(), ca_cert_.get(), NID_basic_constraints, "critical,CA:FALSE") &&
       add_ext(x.get(), ca_cert_.get(), NID_key_usage, "critical,digitalSignature") &&
       add_ext(x.get(), ca_cert_.get(), NID_ext_key_usage, "serverAuth") &&
       add_ext(x.get(), ca_cert_.get(), NID_subject_alt_name, san) &&
       add_ext(x.get(), ca_cert_.get(), NID_authority_key_identifier, "keyid:always") &&
       X509_sign(x.get(), ca_key_.get(), EVP_sha256());
  if (!ok) return make_error(Errc::internal, "cannot mint a certificate for {}: {}", name,
                             ssl_error());
  auto buf = to_buffer(x.get());
  if (!buf) return make_error(Errc::internal, "cannot encode the certificate for {}", name);
  return buf;
}

Result<CRYPTO_BUFFER*> CertAuthority::leaf_for(const std::string& name, int64_t now_ms) {
  auto it = index_.find(name);
  if (it != index_.end()) {
    ++stats_.hits;
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->second.get();
  }
  auto leaf = mint(name, now_ms);
  if (!leaf) return std::move(leaf).take_error();
  ++stats_.minted;
  lru_.emplace_front(name, std::move(*leaf));
  index_[name] = lru_.begin();
  while (lru_.size() > cache_size_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
    ++stats_.evicted;
  }
  return lru_.front().second.get();
}

}  // namespace fy::tls
