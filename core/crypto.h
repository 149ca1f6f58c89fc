// Hashes, MACs and encodings over BoringSSL's libcrypto.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace fy {

using Digest = std::array<uint8_t, 32>;

Digest sha256(std::string_view data);
Digest hmac_sha256(std::string_view key, std::string_view data);

// Constant-time equality for secrets and MACs (lengths are not secret).
bool ct_equal(std::string_view a, std::string_view b);

std::string hex(const uint8_t* data, size_t n);
inline std::string hex(const Digest& d) { return hex(d.data(), d.size()); }
// Lower- or upper-case hex; std::nullopt on odd length or a non-hex character.
std::optional<std::string> unhex(std::string_view s);

std::string base64_encode(std::string_view data);
std::string base64url_encode(std::string_view data);  // no padding (JWT)
std::optional<std::string> base64_decode(std::string_view s);

// Fills with cryptographically secure random bytes.
void random_bytes(uint8_t* out, size_t n);
std::string random_hex(size_t bytes);

// Reads a 32-byte key stored as 64 hex characters (trailing newline allowed).
// Refuses a key file that group or others can read: the stamp key is root-only.
Result<std::string> read_key_file(const std::string& path, bool require_private = true);

}  // namespace fy
