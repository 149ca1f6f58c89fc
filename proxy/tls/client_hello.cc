#include "proxy/tls/client_hello.h"

#include <openssl/bytestring.h>

#include "core/net.h"

namespace fy::tls {

ClientHello parse_client_hello(std::string_view data) {
  ClientHello out;
  if (data.empty()) return out;
  if (static_cast<uint8_t>(data[0]) != 0x16) {
    out.status = ClientHello::Status::not_tls;
    return out;
  }
  // Gather the handshake bytes from consecutive handshake records.
  std::string hs;
  size_t off = 0;
  size_t need = 0;  // handshake bytes needed: 4 + body length, once known
  while (true) {
    if (data.size() - off < 5) {
      out.status = data.size() > kMaxClientHello ? ClientHello::Status::malformed
                                                 : ClientHello::Status::need_more;
      return out;
    }
    const auto* rec = reinterpret_cast<const uint8_t*>(data.data() + off);
    if (rec[0] != 0x16 || rec[1] != 0x03) {
      out.status = off == 0 && rec[1] != 0x03 ? ClientHello::Status::not_tls
                                              : ClientHello::Status::malformed;
      return out;
    }
    size_t len = static_cast<size_t>(rec[3]) << 8 | rec[4];
    if (len == 0 || len > 16384 + 2048) {
      out.status = ClientHello::Status::malformed;
      return out;
    }
    if (data.size() - off - 5 < len) {
      out.status = off + 5 + len > kMaxClientHello ? ClientHello::Status::malformed
                                                   : ClientHello::Status::need_more;
      return out;
    }
    hs.append(data.data() + off + 5, len);
    off += 5 + len;
    if (need == 0 && hs.size() >= 4) {
      const auto* h = reinterpret_cast<const uint8_t*>(hs.data());
      if (h[0] != 1) {  // client_hello
        out.status = ClientHello::Status::malformed;
        return out;
      }
      need = 4 + (static_cast<size_t>(h[1]) << 16 | static_cast<size_t>(h[2]) << 8 | h[3]);
      if (need > kMaxClientHello) {
        out.status = ClientHello::Status::malformed;
        return out;
      }
    }
    if (need != 0 && hs.size() >= need) break;
  }

  CBS body;
  CBS_init(&body, reinterpret_cast<const uint8_t*>(hs.data()) + 4, need - 4);
  uint16_t version;
  CBS random, session_id, ciphers, compression, extensions;
  if (!CBS_get_u16(&body, &version) || !CBS_get_bytes(&body, &random, 32) ||
      !CBS_get_u8_length_prefixed(&body, &session_id) ||
      !CBS_get_u16_length_prefixed(&body, &ciphers) ||
      !CBS_get_u8_length_prefixed(&body, &compression)) {
    out.status = ClientHello::Status::malformed;
    return out;
  }
  out.status = ClientHello::Status::ok;
  if (CBS_len(&body) == 0) return out;  // no extensions
  if (!CBS_get_u16_length_prefixed(&body, &extensions)) {
    out.status = ClientHello::Status::malformed;
    return out;
  }
  while (CBS_len(&extensions) > 0) {
    uint16_t type;
    CBS ext;
    if (!CBS_get_u16(&extensions, &type) || !CBS_get_u16_length_prefixed(&extensions, &ext)) {
      out.status = ClientHello::Status::malformed;
      return out;
    }
    if (type == 0) {  // server_name
      CBS list;
      if (!CBS_get_u16_length_prefixed(&ext, &list)) {
        out.status = ClientHello::Status::malformed;
        return out;
      }
      while (CBS_len(&list) > 0) {
        uint8_t name_type;
        CBS name;
        if (!CBS_get_u8(&list, &name_type) || !CBS_get_u16_length_prefixed(&list, &name)) {
          out.status = ClientHello::Status::malformed;
          return out;
        }
        if (name_type == 0 && !out.sni_present) {
          out.sni_present = true;
          auto host = normalize_host(std::string_view(
              reinterpret_cast<const char*>(CBS_data(&name)), CBS_len(&name)));
          if (host) out.sni = *host;
        }
      }
    } else if (type == 16) {  // ALPN
      CBS list;
      if (!CBS_get_u16_length_prefixed(&ext, &list)) {
        out.status = ClientHello::Status::malformed;
        return out;
      }
      while (CBS_len(&list) > 0) {
        CBS proto;
        if (!CBS_get_u8_length_prefixed(&list, &proto)) {
          out.status = ClientHello::Status::malformed;
          return out;
        }
        std::string_view p(reinterpret_cast<const char*>(CBS_data(&proto)), CBS_len(&proto));
        if (p == "h2") out.alpn_h2 = true;
        if (p == "http/1.1") out.alpn_http11 = true;
      }
    }
  }
  return out;
}

}  // namespace fy::tls
