#include "proxy/server/client_http1.h"

#include <utility>

#include "core/stamp.h"
#include "proxy/http/rewrite.h"

namespace fy::proxy {

Http1ClientCodec::Http1ClientCodec(const http::Limits& limits)
    : reader_(limits), parser_(HTTP_REQUEST, limits) {
  // A stamp field in a trailer would go on with the body bytes, unstripped.
  parser_.refuse_trailer = [](std::string_view name) { return stamp::is_stamp_header(name); };
}

ClientCodec::HeadRead Http1ClientCodec::read_head(std::string_view in) {
  HeadRead r;
  switch (reader_.feed(in, &r.used, &r.head, &r.error)) {
    case http::HeadScanner::Status::need_more: r.status = HeadRead::Status::need_more; break;
    case http::HeadScanner::Status::complete: r.status = HeadRead::Status::head; break;
    case http::HeadScanner::Status::error: r.status = HeadRead::Status::error; break;
  }
  return r;
}

ClientCodec::Parsed Http1ClientCodec::parse_head(std::string_view head, http::ParseError* err) {
  head_view_ = head;
  if (!parser_.parse_head(head, &head_, err)) return Parsed::unparsed;
  if (!http::check_request_framing(head_, err)) return Parsed::bad_framing;
  return Parsed::ok;
}

void Http1ClientCodec::keep_head() {
  // The head's bytes may live in a read chunk that is reused after this
  // callback: copy them and move the parsed views onto the copy.
  if (head_view_.data() == owned_head_.data()) return;
  owned_head_.assign(head_view_);
  head_.rebase(head_view_.data(), owned_head_.data());
  head_view_ = owned_head_;
}

ClientCodec::BodyRead Http1ClientCodec::read_body(const char* p, size_t n) {
  BodyRead r;
  auto used = parser_.parse_body(p, n, &r.error);
  r.ok = used.has_value();
  r.used = used.value_or(0);
  return r;
}

void Http1ClientCodec::next_request() {
  reader_.reset();
  parser_.next_message();
}

void Http1ClientCodec::restart() {
  reader_.reset();
  parser_.reset();
}

bool Http1ClientCodec::stash(const ChunkRef& c, const char* p, size_t n) {
  Slice s;
  s.chunk = c;
  s.off = static_cast<uint32_t>(p - c->data());
  s.len = static_cast<uint32_t>(n);
  stash_.push_back(std::move(s));
  stash_bytes_ += n;
  return stash_bytes_ > kMaxStash;
}

std::vector<Slice> Http1ClientCodec::take_stash() {
  std::vector<Slice> out;
  out.swap(stash_);
  stash_bytes_ = 0;
  return out;
}

void Http1ClientCodec::drop_stash() {
  stash_.clear();
  stash_bytes_ = 0;
}

bool Http1ClientCodec::replay_turn(bool client_full) {
  replay_pending_ = false;
  if (client_full) replay_blocked_ = true;
  return !client_full;
}

bool Http1ClientCodec::client_drained() {
  if (!replay_blocked_) return false;
  replay_blocked_ = false;
  replay_pending_ = true;
  return true;
}

namespace {

http::Answer to_answer(const answers::Reply& reply, bool close) {
  http::Answer a;
  a.status = reply.status;
  a.body = reply.body;
  a.content_type = reply.content_type;
  a.close = close;
  return a;
}

}  // namespace

std::string Http1ClientCodec::encode_answer(const answers::Reply& reply, bool close) const {
  std::string out;
  http::build_answer(out, to_answer(reply, close));
  return out;
}

std::string Http1ClientCodec::encode_challenge(const answers::Reply& reply, bool close) const {
  http::Answer a = to_answer(reply, close);
  a.headers.emplace_back(answers::kBuildChallengeHeader, answers::kBuildChallengeValue);
  std::string out;
  http::build_answer(out, a);
  return out;
}

std::string Http1ClientCodec::encode_response_head(const http::Head& head, bool close,
                                                   bool upgrade) const {
  std::string out;
  http::build_response_head(out, head, close, upgrade);
  return out;
}

std::string Http1ClientCodec::encode_connect_established() const {
  return "HTTP/1.1 200 Connection established\r\n\r\n";
}

}  // namespace fy::proxy
