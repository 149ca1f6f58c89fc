// HTTP/1 message parsing for the proxy: llhttp (strict mode) plus the checks
// that close request smuggling, run on a complete head before llhttp sees it.
//
// A message is parsed in two steps:
//   1. HeadScanner finds the end of the head in the incoming bytes (bounded),
//      refusing bare LF and stray CR as it goes;
//   2. Parser::parse_head runs llhttp over the complete head and fills a Head
//      whose string_views point into the head bytes (the caller keeps them
//      alive); then Parser::parse_body consumes body bytes and stops exactly
//      at the end of the message, so the caller can forward the message's raw
//      bytes (framing included) and keep what follows for the next message.
//
// Contract: a message that any check refuses is never forwarded; the error
// carries the status to answer (400, 431, 501) and a reason for the log.
#pragma once

#include <llhttp.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "proxy/http/header.h"

namespace fy::http {

struct Limits {
  size_t max_head_bytes = 64 * 1024;  // over it: 431
  size_t max_headers = 100;           // over it: 431
};

struct ParseError {
  int status = 400;     // what to answer
  std::string reason;   // for the client body and the log
};

struct Head {
  // Requests.
  std::string_view method;
  llhttp_method_t method_id = HTTP_GET;
  std::string_view target;
  // Responses.
  int status = 0;
  std::string_view reason;

  uint8_t http_major = 1;
  uint8_t http_minor = 1;
  std::vector<Header> headers;

  // Framing, from llhttp.
  bool chunked = false;
  std::optional<uint64_t> content_length;
  bool keep_alive = true;  // llhttp_should_keep_alive after the head
  bool upgrade = false;    // CONNECT, or a request/101 response with Upgrade

  // Moves every view from the bytes at `from` to a copy of them at `to`.
  void rebase(const char* from, const char* to);

  // First value of `name` (case-insensitive), or nullopt.
  std::optional<std::string_view> get(std::string_view name) const;
  size_t count(std::string_view name) const;
};

// Finds the end of a head ("\r\n\r\n") across reads.
class HeadScanner {
 public:
  enum class Status { need_more, complete, error };
  explicit HeadScanner(const Limits& limits) : limits_(limits) {}

  // Scans `data`, the bytes after everything scanned so far. On `complete`,
  // `*used` is how many bytes of `data` belong to the head. On `error`, the
  // error describes the refusal.
  Status scan(std::string_view data, size_t* used, ParseError* error);
  size_t scanned() const { return total_; }
  void reset();

 private:
  const Limits& limits_;
  size_t total_ = 0;
  // Line-ending state carried across reads.
  bool saw_cr_ = false;    // previous byte was '\r'
  int crlf_run_ = 0;       // consecutive CRLFs ending at the previous byte
  bool at_line_start_ = true;
  bool first_line_ = true;
};

// A head across reads: viewed in place when it arrives whole in one read,
// copied into its own buffer when it spans reads.
class HeadReader {
 public:
  explicit HeadReader(const Limits& limits) : scan_(limits) {}
  // Feeds the next bytes. On `complete`, `*head` views the whole head (in
  // `data` or in the reader's buffer: valid until the next feed() or
  // reset()) and `*used` is how many bytes of `data` belong to it.
  HeadScanner::Status feed(std::string_view data, size_t* used, std::string_view* head,
                           ParseError* error);
  void reset();
  bool started() const { return scan_.scanned() > 0; }

 private:
  HeadScanner scan_;
  std::string buf_;
};

class Parser {
 public:
  // type: HTTP_REQUEST or HTTP_RESPONSE.
  Parser(llhttp_type_t type, const Limits& limits);
  Parser(const Parser&) = delete;
  Parser& operator=(const Parser&) = delete;

  // Parses a complete head (as found by HeadScanner, blank line included).
  // For responses, call expect_response_to(method) first.
  bool parse_head(std::string_view head, Head* out, ParseError* error);

  // Consumes body bytes of the current message; returns how many belong to
  // it (the rest belong to the next message) or nullopt on a framing error.
  // `on_body` (optional) sees the decoded body bytes.
  std::optional<size_t> parse_body(const char* p, size_t n, ParseError* error);
  // The peer closed: completes a close-delimited body. False when the message
  // was cut short.
  bool finish();

  bool message_complete() const { return message_complete_; }
  // True when the body runs until the connection closes (responses only).
  bool body_until_eof() const;
  // Prepares for the next message on the same connection.
  void next_message();
  // Starts over as if new (after a CONNECT: a new protocol begins).
  void reset();

  // Responses: the request method decides whether a body follows (HEAD,
  // CONNECT 2xx).
  void expect_response_to(llhttp_method_t method) { request_method_ = method; }

  std::function<void(std::string_view)> on_body;
  // Optional: a chunked body's trailer field whose name this returns true for
  // ends parse_body with a 400 (the proxy refuses stamp fields there, where
  // it cannot strip them before the bytes go on).
  std::function<bool(std::string_view)> refuse_trailer;

 private:
  static int cb_url(llhttp_t*, const char*, size_t);
  static int cb_status(llhttp_t*, const char*, size_t);
  static int cb_header_field(llhttp_t*, const char*, size_t);
  static int cb_header_value(llhttp_t*, const char*, size_t);
  static int cb_header_field_complete(llhttp_t*);
  static int cb_header_value_complete(llhttp_t*);
  static int cb_headers_complete(llhttp_t*);
  static int cb_body(llhttp_t*, const char*, size_t);
  static int cb_message_complete(llhttp_t*);

  const Limits& limits_;
  llhttp_t parser_;
  llhttp_settings_t settings_;
  llhttp_type_t type_;
  llhttp_method_t request_method_ = HTTP_GET;
  Head* head_ = nullptr;
  bool new_header_next_ = true;
  // The trailer field being read (parse_body), capped: a longer name is kept
  // as its first kMaxTrailerName + 1 bytes, which no refused name matches.
  static constexpr size_t kMaxTrailerName = 64;
  std::string trailer_name_;
  std::string refused_trailer_;
  bool headers_complete_ = false;
  bool message_complete_ = false;
  bool too_many_headers_ = false;
};

// Checks a request head beyond llhttp: exactly one Host (when present), no
// Transfer-Encoding other than "chunked", no Content-Length with it.
bool check_request_framing(const Head& head, ParseError* error);

}  // namespace fy::http
