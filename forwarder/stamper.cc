#include "forwarder/stamper.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "core/crypto.h"
#include "core/log.h"
#include "core/text.h"

namespace fy::fwd {
namespace {

std::string read_small(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

}  // namespace

Result<void> Stamper::init(const std::string& key_file, const std::string& boot_id_file,
                           const std::string& state_dir) {
  key_file_ = key_file;
  auto key = read_key_file(key_file);
  if (!key) return std::move(key).take_error();
  key_ = std::move(*key);
  boot_ = read_small(boot_id_file);
  stamp::Fields probe;
  probe.src = "127.0.0.1";
  probe.net = "host";
  probe.seq = 1;
  probe.boot = boot_;
  if (!stamp::verify(stamp::format(probe, key_), key_))
    return make_error(Errc::invalid_argument,
                      "boot id '{}' from {} is not a lower-case UUID: check boot_id_file", boot_,
                      boot_id_file);
  seq_path_ = state_dir + "/seq";
  // "<boot> <next>": continue this boot's sequence, or start a new one.
  std::string rec = read_small(seq_path_);
  size_t sp = rec.find(' ');
  if (sp != std::string::npos && rec.substr(0, sp) == boot_) {
    if (auto n = parse_u64(rec.substr(sp + 1)); n && *n >= 1) next_ = *n;
  }
  reserved_ = next_;
  reserve();
  if (persist_failed_)
    return make_error(Errc::io, "cannot write the sequence record {}: {}; check state_dir",
                      seq_path_, strerror(errno));
  return {};
}

Result<void> Stamper::reload_key() {
  auto key = read_key_file(key_file_);
  if (!key) return std::move(key).take_error();
  std::lock_guard<std::mutex> g(mu_);
  key_ = std::move(*key);
  return {};
}

void Stamper::reserve() {
  uint64_t upto = reserved_ + kBlock;
  std::string tmp = seq_path_ + ".tmp";
  std::string rec = boot_ + " " + std::to_string(upto) + "\n";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  bool ok = fd >= 0 && ::write(fd, rec.data(), rec.size()) == static_cast<ssize_t>(rec.size());
  if (fd >= 0) ::close(fd);
  ok = ok && ::rename(tmp.c_str(), seq_path_.c_str()) == 0;
  if (!ok && !persist_failed_.load())
    log::error(
        "cannot record the stamp sequence in {}: {}; stamps continue, but a restart in "
        "this boot may repeat sequences the proxy then refuses as replays",
        seq_path_, strerror(errno));
  persist_failed_.store(!ok);
  reserved_ = upto;  // in memory either way: never reuse within this process
}

uint64_t Stamper::issued() const {
  std::lock_guard<std::mutex> g(mu_);
  return next_ - 1;
}

std::string Stamper::line(const std::string& src, const std::string& net, const std::string& who) {
  stamp::Fields f;
  std::string key;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (next_ >= reserved_) reserve();
    f.seq = next_++;
    key = key_;
  }
  f.src = src;
  f.net = net;
  f.who = who;
  f.boot = boot_;
  std::string out;
  out.reserve(160);
  out += stamp::kHeader;
  out += ": ";
  out += stamp::format(f, key);
  out += "\r\n";
  return out;
}

}  // namespace fy::fwd
