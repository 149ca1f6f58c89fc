#include "proxy/http/parser.h"

#include <algorithm>

#include "core/text.h"

namespace fy::http {

std::optional<std::string_view> Head::get(std::string_view name) const {
  for (const Header& h : headers)
    if (iequals(h.name, name)) return h.value;
  return std::nullopt;
}

void Head::rebase(const char* from, const char* to) {
  auto move = [&](std::string_view& v) {
    if (v.data() == nullptr) return;
    v = std::string_view(to + (v.data() - from), v.size());
  };
  // method points at llhttp's static name table, not into the head.
  move(target);
  move(reason);
  for (Header& h : headers) {
    move(h.name);
    move(h.value);
  }
}

size_t Head::count(std::string_view name) const {
  size_t n = 0;
  for (const Header& h : headers)
    if (iequals(h.name, name)) ++n;
  return n;
}

void HeadScanner::reset() {
  total_ = 0;
  saw_cr_ = false;
  crlf_run_ = 0;
  at_line_start_ = true;
  first_line_ = true;
}

HeadScanner::Status HeadScanner::scan(std::string_view data, size_t* used, ParseError* error) {
  for (size_t i = 0; i < data.size(); ++i) {
    if (++total_ > limits_.max_head_bytes) {
      *error = {431, "the request head is larger than " +
                         std::to_string(limits_.max_head_bytes / 1024) + " KiB"};
      return Status::error;
    }
    char c = data[i];
    if (c == '\n') {
      if (!saw_cr_) {
        *error = {400, "a line of the head ends in a bare LF (lines must end in CRLF)"};
        return Status::error;
      }
      saw_cr_ = false;
      if (++crlf_run_ == 2 || (first_line_ && at_line_start_)) {
        if (first_line_ && at_line_start_) {
          *error = {400, "the head starts with an empty line"};
          return Status::error;
        }
        *used = i + 1;
        return Status::complete;
      }
      at_line_start_ = true;
      first_line_ = false;
      continue;
    }
    if (saw_cr_) {
      *error = {400, "the head contains a CR that does not end a line"};
      return Status::error;
    }
    if (c == '\r') {
      saw_cr_ = true;
      continue;
    }
    if (c == '\0') {
      *error = {400, "the head contains a NUL byte"};
      return Status::error;
    }
    if (at_line_start_ && !first_line_ && (c == ' ' || c == '\t')) {
      *error = {400, "the head folds a header over two lines (obs-fold is not accepted)"};
      return Status::error;
    }
    crlf_run_ = 0;
    at_line_start_ = false;
  }
  return Status::need_more;
}

HeadScanner::Status HeadReader::feed(std::string_view data, size_t* used, std::string_view* head,
                                     ParseError* error) {
  auto st = scan_.scan(data, used, error);
  if (st == HeadScanner::Status::need_more) {
    buf_.append(data);
  } else if (st == HeadScanner::Status::complete) {
    if (buf_.empty()) {
      *head = data.substr(0, *used);
    } else {
      buf_.append(data.substr(0, *used));
      *head = buf_;
    }
  }
  return st;
}

void HeadReader::reset() {
  scan_.reset();
  buf_.clear();
}

namespace {
Parser* self(llhttp_t* p) { return static_cast<Parser*>(p->data); }

// Extends a view by a span that continues it, or starts it.
void extend(std::string_view* v, const char* at, size_t len) {
  if (v->empty()) {
    *v = std::string_view(at, len);
  } else {
    *v = std::string_view(v->data(), static_cast<size_t>(at + len - v->data()));
  }
}
}  // namespace

Parser::Parser(llhttp_type_t type, const Limits& limits) : limits_(limits), type_(type) {
  llhttp_settings_init(&settings_);
  settings_.on_url = cb_url;
  settings_.on_status = cb_status;
  settings_.on_header_field = cb_header_field;
  settings_.on_header_value = cb_header_value;
  settings_.on_header_field_complete = cb_header_field_complete;
  settings_.on_header_value_complete = cb_header_value_complete;
  settings_.on_headers_complete = cb_headers_complete;
  settings_.on_body = cb_body;
  settings_.on_message_complete = cb_message_complete;
  llhttp_init(&parser_, type, &settings_);
  parser_.data = this;
}

// Span callbacks run with head_ set only inside parse_head; trailer fields of
// a chunked body arrive during parse_body and are not collected, only their
// names checked (refuse_trailer).
int Parser::cb_url(llhttp_t* p, const char* at, size_t len) {
  if (!self(p)->head_) return 0;
  extend(&self(p)->head_->target, at, len);
  return 0;
}

int Parser::cb_status(llhttp_t* p, const char* at, size_t len) {
  if (!self(p)->head_) return 0;
  extend(&self(p)->head_->reason, at, len);
  return 0;
}

int Parser::cb_header_field(llhttp_t* p, const char* at, size_t len) {
  Parser* s = self(p);
  Head* h = s->head_;
  if (!h) {
    if (s->refuse_trailer && s->trailer_name_.size() <= kMaxTrailerName)
      s->trailer_name_.append(at, std::min(len, kMaxTrailerName + 1 - s->trailer_name_.size()));
    return 0;
  }
  if (s->new_header_next_) {
    if (h->headers.size() >= s->limits_.max_headers) {
      s->too_many_headers_ = true;
      return HPE_USER;
    }
    h->headers.push_back(Header{});
    s->new_header_next_ = false;
  }
  extend(&h->headers.back().name, at, len);
  return 0;
}

int Parser::cb_header_value(llhttp_t* p, const char* at, size_t len) {
  if (!self(p)->head_) return 0;
  extend(&self(p)->head_->headers.back().value, at, len);
  return 0;
}

int Parser::cb_header_field_complete(llhttp_t* p) {
  Parser* s = self(p);
  if (s->head_ || !s->refuse_trailer) return 0;
  std::string name;
  name.swap(s->trailer_name_);
  if (name.size() <= kMaxTrailerName && s->refuse_trailer(name)) {
    s->refused_trailer_ = std::move(name);
    return HPE_USER;
  }
  return 0;
}

int Parser::cb_header_value_complete(llhttp_t* p) {
  self(p)->new_header_next_ = true;
  return 0;
}

int Parser::cb_headers_complete(llhttp_t* p) {
  Parser* s = self(p);
  Head* h = s->head_;
  if (!h) return 0;  // end of a chunked body's trailers
  s->headers_complete_ = true;
  h->http_major = p->http_major;
  h->http_minor = p->http_minor;
  h->chunked = (p->flags & F_CHUNKED) != 0;
  if (p->flags & F_CONTENT_LENGTH) h->content_length = p->content_length;
  h->keep_alive = llhttp_should_keep_alive(p) != 0;
  h->upgrade = p->upgrade != 0;
  if (s->type_ == HTTP_REQUEST) {
    h->method_id = static_cast<llhttp_method_t>(p->method);
    h->method = llhttp_method_name(h->method_id);
    return 0;
  }
  h->status = p->status_code;
  // No body whatever the headers say: a response to HEAD, 1xx, 204, 304
  // (RFC 9112 section 6.3). llhttp leaves this to the caller.
  if (s->request_method_ == HTTP_HEAD || (h->status >= 100 && h->status < 200 && h->status != 101) ||
      h->status == 204 || h->status == 304)
    return 1;
  return 0;
}

int Parser::cb_body(llhttp_t* p, const char* at, size_t len) {
  Parser* s = self(p);
  if (s->on_body) s->on_body(std::string_view(at, len));
  return 0;
}

int Parser::cb_message_complete(llhttp_t* p) {
  self(p)->message_complete_ = true;
  // Stop right after this message: what follows belongs to the next one.
  return HPE_PAUSED;
}

bool Parser::parse_head(std::string_view head, Head* out, ParseError* error) {
  *out = Head{};
  head_ = out;
  new_header_next_ = true;
  headers_complete_ = false;
  message_complete_ = false;
  too_many_headers_ = false;
  llhttp_errno_t rc = llhttp_execute(&parser_, head.data(), head.size());
  head_ = nullptr;
  if (too_many_headers_) {
    *error = {431, "the head has more than " + std::to_string(limits_.max_headers) + " headers"};
    return false;
  }
  if (rc != HPE_OK && rc != HPE_PAUSED && rc != HPE_PAUSED_UPGRADE) {
    std::string why = llhttp_get_error_reason(&parser_) ? llhttp_get_error_reason(&parser_) : "";
    if (rc == HPE_INVALID_METHOD || rc == HPE_INVALID_URL || rc == HPE_INVALID_VERSION ||
        rc == HPE_INVALID_CONSTANT)
      *error = {400, "the request line is not HTTP/1: " + why};
    else
      *error = {400, "the head is malformed: " + why};
    return false;
  }
  if (!headers_complete_) {
    *error = {400, "the head is incomplete"};
    return false;
  }
  // Header names and values must not be empty of name; values are trimmed by
  // llhttp of leading OWS; trailing OWS is trimmed here.
  for (Header& h : out->headers) {
    if (h.name.empty()) {
      *error = {400, "the head has a header without a name"};
      return false;
    }
    h.value = trim_ows(h.value);
  }
  return true;
}

std::optional<size_t> Parser::parse_body(const char* p, size_t n, ParseError* error) {
  if (message_complete_) return 0;
  if (n == 0) return 0;
  llhttp_errno_t rc = llhttp_execute(&parser_, p, n);
  if (rc == HPE_OK) return n;
  if (rc == HPE_PAUSED || rc == HPE_PAUSED_UPGRADE) {
    return static_cast<size_t>(llhttp_get_error_pos(&parser_) - p);
  }
  if (!refused_trailer_.empty()) {
    *error = {400, "the chunked body's trailer section carries a " + refused_trailer_ +
                       " field, which the proxy does not let through (only fy-forwarder writes "
                       "it, in the request head): send the request without that trailer"};
    return std::nullopt;
  }
  std::string why = llhttp_get_error_reason(&parser_) ? llhttp_get_error_reason(&parser_) : "";
  *error = {400, "the body's framing is malformed: " + why};
  return std::nullopt;
}

bool Parser::finish() {
  if (message_complete_) return true;
  llhttp_errno_t rc = llhttp_finish(&parser_);
  return (rc == HPE_OK || rc == HPE_PAUSED) && message_complete_;
}

bool Parser::body_until_eof() const { return llhttp_message_needs_eof(&parser_) != 0; }

void Parser::next_message() {
  llhttp_errno_t e = llhttp_get_errno(&parser_);
  if (e == HPE_PAUSED_UPGRADE || parser_.upgrade) {
    // The message asked for an upgrade that did not happen (no 101): HTTP
    // goes on. llhttp would still treat what follows as the new protocol,
    // so start the parser over.
    llhttp_reset(&parser_);
  } else if (e == HPE_PAUSED) {
    llhttp_resume(&parser_);
  }
  trailer_name_.clear();
  refused_trailer_.clear();
  message_complete_ = false;
  headers_complete_ = false;
}

void Parser::reset() {
  llhttp_reset(&parser_);
  trailer_name_.clear();
  refused_trailer_.clear();
  message_complete_ = false;
  headers_complete_ = false;
}

bool check_request_framing(const Head& head, ParseError* error) {
  if (head.count("host") > 1) {
    *error = {400, "the request has more than one Host header"};
    return false;
  }
  size_t te = head.count("transfer-encoding");
  if (te > 0) {
    if (te > 1 || !iequals(*head.get("transfer-encoding"), "chunked")) {
      *error = {501, "the request's Transfer-Encoding is not plain \"chunked\""};
      return false;
    }
    if (head.count("content-length") > 0) {
      *error = {400, "the request has both Content-Length and Transfer-Encoding"};
      return false;
    }
  }
  if (head.count("content-length") > 1) {
    *error = {400, "the request has more than one Content-Length header"};
    return false;
  }
  if (head.http_major != 1) {
    *error = {505, "only HTTP/1.0 and HTTP/1.1 are served"};
    return false;
  }
  return true;
}

}  // namespace fy::http
