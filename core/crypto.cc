#include "core/crypto.h"

#include <openssl/base64.h>
#include <openssl/digest.h>
#include <openssl/hmac.h>
#include <openssl/mem.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>

namespace fy {

Digest sha256(std::string_view data) {
  Digest d;
  SHA256(reinterpret_cast<const uint8_t*>(data.data()), data.size(), d.data());
  return d;
}

Digest hmac_sha256(std::string_view key, std::string_view data) {
  Digest d;
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), key.size(), reinterpret_cast<const uint8_t*>(data.data()),
       data.size(), d.data(), &len);
  return d;
}

bool ct_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string hex(const uint8_t* data, size_t n) {
  static const char kHex[] = "0123456789abcdef";
  std::string out(n * 2, '\0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kHex[data[i] >> 4];
    out[2 * i + 1] = kHex[data[i] & 15];
  }
  return out;
}

std::optional<std::string> unhex(std::string_view s) {
  if (s.size() % 2) return std::nullopt;
  auto nib = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out(s.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = nib(s[2 * i]), lo = nib(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out[i] = static_cast<char>(hi << 4 | lo);
  }
  return out;
}

std::string base64_encode(std::string_view data) {
  size_t len = 0;
  EVP_EncodedLength(&len, data.size());
  std::string out(len, '\0');
  size_t n = EVP_EncodeBlock(reinterpret_cast<uint8_t*>(out.data()),
                             reinterpret_cast<const uint8_t*>(data.data()), data.size());
  out.resize(n);
  return out;
}

std::string base64url_encode(std::string_view data) {
  std::string s = base64_encode(data);
  while (!s.empty() && s.back() == '=') s.pop_back();
  for (char& c : s) {
    if (c == '+') c = '-';
    if (c == '/') c = '_';
  }
  return s;
}

std::optional<std::string> base64_decode(std::string_view s) {
  size_t max = 0;
  if (!EVP_DecodedLength(&max, s.size())) return std::nullopt;
  std::string out(max, '\0');
  size_t n = 0;
  if (!EVP_DecodeBase64(reinterpret_cast<uint8_t*>(out.data()), &n, max,
                        reinterpret_cast<const uint8_t*>(s.data()), s.size()))
    return std::nullopt;
  out.resize(n);
  return out;
}

void random_bytes(uint8_t* out, size_t n) { RAND_bytes(out, n); }

std::string random_hex(size_t bytes) {
  std::string raw(bytes, '\0');
  random_bytes(reinterpret_cast<uint8_t*>(raw.data()), bytes);
  return hex(reinterpret_cast<const uint8_t*>(raw.data()), bytes);
}

Result<std::string> read_key_file(const std::string& path, bool require_private) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return make_error(Errc::not_found, "key file {} cannot be read: {}", path, strerror(errno));
  if (require_private && (st.st_mode & 077))
    return make_error(Errc::permission,
                      "key file {} is readable by group or others (mode {:o}); it must be "
                      "root-only: chmod 600 {}",
                      path, st.st_mode & 0777, path);
  std::ifstream in(path);
  if (!in) return make_error(Errc::io, "key file {} cannot be opened", path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' '))
    text.pop_back();
  auto key = unhex(text);
  if (!key || key->size() != 32)
    return make_error(Errc::parse,
                      "key file {} does not hold a key: expected 64 hex characters (32 bytes), "
                      "as `head -c32 /dev/urandom | xxd -p -c64` writes",
                      path);
  return *key;
}

}  // namespace fy
