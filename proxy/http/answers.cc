#include "proxy/http/answers.h"

#include <fmt/format.h>

#include "core/json.h"

namespace fy::answers {

namespace {

// {"message":"<text>"}, the JSON shape of the proxy's credential answers.
std::string json_message(const std::string& text) {
  std::string body = "{\"message\":";
  json_append_string(body, text);
  body += "}";
  return body;
}

std::string allowlist_text(std::string_view key) {
  return fmt::format(
      "refused by the foldyard allowlist - grant it on your computer: `fy allow add {}`\n", key);
}

}  // namespace

Reply bad_head(int status, std::string_view reason) {
  return {status, fmt::format("foldyard's proxy refused this request: {}. Send a well-formed "
                              "HTTP/1.1 request.\n",
                              reason)};
}

Reply origin_form() {
  return {400,
          "foldyard's proxy refused this request: it is a proxy, so requests name their "
          "destination in absolute form (GET http://host/path HTTP/1.1) or use CONNECT "
          "host:port\n"};
}

Reply bad_scheme(std::string_view scheme) {
  return {400, fmt::format("foldyard's proxy refused this request: the scheme '{}' is not "
                           "served; use http:// or CONNECT\n",
                           scheme)};
}

Reply bad_authority(std::string_view message) {
  return {400, fmt::format("foldyard's proxy refused this request: {}\n", message)};
}

Reply bad_connect(std::string_view message) {
  return {400, fmt::format("foldyard's proxy refused this CONNECT: {} (write CONNECT host:port)\n",
                           message)};
}

Reply unattributed() {
  return {403,
          "refused by the foldyard proxy - this connection carries no valid stamp from the "
          "forwarder, and the policy requires one (attribution = \"require\"): send it through "
          "fy-forwarder\n"};
}

Reply allowlist(std::string_view key) { return {403, allowlist_text(key)}; }

Reply claim() {
  return {403,
          "refused by the foldyard proxy - the request's Host header names a different host "
          "than the one it is sent to\n"};
}

Reply held(std::string_view body) { return {401, std::string(body), kJson}; }

Reply build_challenge(std::string_view key) {
  return {407, allowlist_text(key) + "(this host is open to builds: a build proves itself with "
                                     "fy-build:<secret>)\n"};
}

Reply scoped(std::string_view body) { return {401, std::string(body), kJson}; }

std::string scoped_json(std::string_view host, std::string_view rule, std::string_view principal) {
  return json_message(fmt::format("foldyard did not send this request: the credential for {} "
                                  "(switch '{}') is not for {} (on your computer: the policy's "
                                  "[scope] names who it is for)",
                                  host, rule, principal));
}

Reply overlap(std::string_view message) {
  return {502,
          json_message(fmt::format("foldyard did not send this request: {} (on your computer: "
                                   "the mode can't be changed from the box)",
                                   message)),
          kJson};
}

Reply mint_failed(std::string_view host, std::string_view reason, bool after_401) {
  std::string text =
      after_401 ? fmt::format("foldyard could not mint a credential for {} after it refused the "
                              "one this request carried (401): {} (on your computer, `fy host "
                              "logs` has the details)",
                              host, reason)
                : fmt::format("foldyard could not mint a credential for {}, so this request was "
                              "not sent: {} (on your computer, `fy host logs` has the details)",
                              host, reason);
  return {502, json_message(text), kJson};
}

Reply head_timeout(uint64_t seconds) {
  return {408, fmt::format("foldyard's proxy closed this connection: the request head did not "
                           "arrive within {} s\n",
                           seconds)};
}

Reply upstream_failed(std::string_view dest, std::string_view reason) {
  return {502, fmt::format("foldyard's proxy could not reach {}: {}\n", dest, reason)};
}

Reply upstream_timeout(std::string_view dest, std::string_view reason) {
  return {504, fmt::format("foldyard's proxy timed out reaching {}: {}\n", dest, reason)};
}

Reply out_of_files(std::string_view dest, std::string_view reason) {
  return {503, fmt::format("foldyard's proxy could not open a connection to {}: {}. Retry "
                           "shortly; on the host, raise the proxy's open-file limit (systemd: "
                           "LimitNOFILE=; a shell: ulimit -n) or lower --max-connections\n",
                           dest, reason)};
}

Reply connection_limit(size_t limit, bool by_files) {
  return {503, fmt::format("foldyard's proxy is at its connection limit ({}); retry shortly, or "
                           "raise {}\n",
                           limit,
                           by_files ? "the proxy's open-file limit (LimitNOFILE / ulimit -n)"
                                    : "--max-connections")};
}

}  // namespace fy::answers
