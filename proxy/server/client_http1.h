// The client side's HTTP/1 (client_codec.h): heads found across reads and
// parsed by llhttp (proxy/http/parser.h, strict), framing checked, bodies
// parsed to their end, pipelined bytes stashed up to kMaxStash, and
// keep-alive as the request's head says; what is sent back is HTTP/1.1
// (proxy/http/rewrite.h's build_answer and build_response_head).
#pragma once

#include <string>
#include <vector>

#include "proxy/server/client_codec.h"

namespace fy::proxy {

class Http1ClientCodec final : public ClientCodec {
 public:
  // Pipelined bytes past this bound pause the client (stash() says so).
  static constexpr size_t kMaxStash = 64 * 1024;

  // `limits` must outlive the codec (the server's).
  explicit Http1ClientCodec(const http::Limits& limits);

  HeadRead read_head(std::string_view in) override;
  bool head_started() const override { return reader_.started(); }
  Parsed parse_head(std::string_view head, http::ParseError* err) override;
  http::Head& head() override { return head_; }
  void keep_head() override;
  BodyRead read_body(const char* p, size_t n) override;
  bool request_complete() const override { return parser_.message_complete(); }
  void head_forwarded() override { reader_.reset(); }
  void next_request() override;
  void restart() override;
  bool keeps_alive(bool client_eof) const override {
    return head_.keep_alive && !(client_eof && stash_.empty());
  }
  [[nodiscard]] bool stash(const ChunkRef& c, const char* p, size_t n) override;
  bool pipelined() const override { return !stash_.empty(); }
  std::vector<Slice> take_stash() override;
  void drop_stash() override;
  void schedule_replay() override {
    if (!stash_.empty()) replay_pending_ = true;
  }
  bool replay_pending() const override { return replay_pending_; }
  bool replay_blocked() const override { return replay_blocked_; }
  [[nodiscard]] bool replay_turn(bool client_full) override;
  bool client_drained() override;

  std::string encode_answer(const answers::Reply& reply, bool close) const override;
  std::string encode_challenge(const answers::Reply& reply, bool close) const override;
  std::string encode_response_head(const http::Head& head, bool close, bool upgrade) const override;
  std::string encode_connect_established() const override;

 private:
  http::HeadReader reader_;
  http::Parser parser_;
  http::Head head_;
  std::string_view head_view_;  // the head parsed last (in a chunk or reader_)
  std::string owned_head_;      // its copy, once kept
  std::vector<Slice> stash_;
  size_t stash_bytes_ = 0;
  bool replay_pending_ = false;  // the next pipelined request runs on the next turn
  bool replay_blocked_ = false;  // ... once the client's queue has drained
};

}  // namespace fy::proxy
