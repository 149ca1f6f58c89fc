#include "proxy/netlog/writer.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string_view>
#include <vector>

#include "core/clock.h"
#include "core/log.h"

namespace fy::netlog {
namespace {

std::string dir_of(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string base_of(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// "egress.jsonl" -> {"egress", ".jsonl"}
std::pair<std::string, std::string> split_ext(const std::string& base) {
  size_t dot = base.rfind('.');
  if (dot == std::string::npos || dot == 0) return {base, ""};
  return {base.substr(0, dot), base.substr(dot)};
}

void mkdirs(const std::string& dir) {
  std::string cur;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      if (!cur.empty()) ::mkdir(cur.c_str(), 0700);
    }
    if (i < dir.size()) cur += dir[i];
  }
}

// A dated backup's place in rotation order, from the part of its name between
// "<stem>." and "<ext>": "20261129T213000Z" or, for a later rotation within the
// same second, "20261129T213000Z-<n>". nullopt for any other file, which is
// never pruned.
std::optional<std::pair<std::string, uint64_t>> backup_order(std::string_view mid) {
  auto digits = [](std::string_view d) {
    return !d.empty() &&
           std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (mid.size() < 16 || !digits(mid.substr(0, 8)) || mid[8] != 'T' || !digits(mid.substr(9, 6)) ||
      mid[15] != 'Z')
    return std::nullopt;
  std::string_view rest = mid.substr(16);
  if (rest.empty()) return std::make_pair(std::string(mid), uint64_t{0});
  if (rest[0] != '-' || rest.size() > 20 || !digits(rest.substr(1))) return std::nullopt;
  return std::make_pair(std::string(mid.substr(0, 16)), std::stoull(std::string(rest.substr(1))));
}

}  // namespace

Writer::Writer(WriterOptions opts) : opts_(std::move(opts)) {}

Writer::~Writer() {
  flush();
}

void Writer::append(const Row& row) {
  if (buf_.size() >= opts_.max_buffered) {
    ++stats_.rows_dropped;
    return;
  }
  append_json(buf_, row);
  ++buf_rows_;
}

void Writer::append_line(std::string_view line) {
  if (buf_.size() >= opts_.max_buffered) {
    ++stats_.rows_dropped;
    return;
  }
  buf_.append(line);
  ++buf_rows_;
}

bool Writer::open_file() {
  if (fd_) return true;
  mkdirs(dir_of(opts_.path));
  fd_.reset(::open(opts_.path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  if (!fd_) {
    last_error_ = "cannot open " + opts_.path + ": " + strerror(errno);
    return false;
  }
  struct stat st;
  size_ = (::fstat(fd_.get(), &st) == 0) ? static_cast<uint64_t>(st.st_size) : 0;
  return true;
}

void Writer::rotate() {
  fd_.reset();
  auto [stem, ext] = split_ext(base_of(opts_.path));
  std::string dir = dir_of(opts_.path);

  // The backups there now, in rotation order: by stamp, then by suffix (a
  // plain sort would put "Z-1" before "Z" and "Z-10" before "Z-2").
  using Order = std::pair<std::string, uint64_t>;
  std::vector<std::pair<Order, std::string>> backups;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name.size() > stem.size() + ext.size() + 1 && name.rfind(stem + ".", 0) == 0 &&
          name.size() >= ext.size() && name.compare(name.size() - ext.size(), ext.size(), ext) == 0 &&
          name != base_of(opts_.path)) {
        std::string_view mid(name);
        mid = mid.substr(stem.size() + 1, mid.size() - stem.size() - 1 - ext.size());
        if (auto order = backup_order(mid)) backups.emplace_back(*order, name);
      }
    }
    ::closedir(d);
  }
  std::sort(backups.begin(), backups.end());

  // egress.20261129T213000Z.jsonl; a later rotation within the same second gets
  // a suffix above every one of that second still there, so it sorts last even
  // when pruning has freed a lower name.
  std::string stamp = iso8601_utc(wall_ms(), false, true);
  stamp.erase(std::remove(stamp.begin(), stamp.end(), '-'), stamp.end());
  stamp.erase(std::remove(stamp.begin(), stamp.end(), ':'), stamp.end());
  Order order{stamp, 0};
  for (const auto& b : backups)
    if (b.first.first == stamp) order.second = std::max(order.second, b.first.second + 1);
  std::string name =
      stem + "." + stamp + (order.second ? "-" + std::to_string(order.second) : "") + ext;
  std::string target = dir + "/" + name;
  if (::rename(opts_.path.c_str(), target.c_str()) != 0) {
    last_error_ = "cannot rotate " + opts_.path + ": " + strerror(errno);
    ++stats_.write_errors;
    return;
  }
  ++stats_.rotations;

  // Keep the newest `backups`.
  backups.emplace_back(order, name);
  std::sort(backups.begin(), backups.end());
  while (static_cast<int>(backups.size()) > opts_.backups) {
    ::unlink((dir + "/" + backups.front().second).c_str());
    backups.erase(backups.begin());
  }
}

void Writer::flush() {
  if (buf_.empty()) return;
  uint64_t now = mono_ms();
  if (fd_ && now - last_link_check_ms_ >= 1000) {
    // Unlinked under us (the log or its directory removed): writing on would
    // lose every row without an error. Reopen, which recreates the path.
    // Checked at most once a second: rows of that second go to the old file.
    last_link_check_ms_ = now;
    struct stat st;
    if (::fstat(fd_.get(), &st) == 0 && st.st_nlink == 0) fd_.reset();
  }
  bool ok = open_file();
  if (ok && size_ > 0 && size_ + buf_.size() > opts_.max_bytes) {
    rotate();
    ok = open_file();
  }
  const uint64_t start_size = size_;
  size_t off = 0;
  while (ok && off < buf_.size()) {
    ssize_t n = ::write(fd_.get(), buf_.data() + off, buf_.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      last_error_ = "cannot write " + opts_.path + ": " + strerror(errno);
      ok = false;
      break;
    }
    off += static_cast<size_t>(n);
    size_ += static_cast<uint64_t>(n);
  }
  if (ok) {
    stats_.rows += buf_rows_;
  } else {
    // The rows are lost; traffic goes on. Reopen next time (the file may
    // have been removed or the disk freed).
    ++stats_.write_errors;
    stats_.rows_dropped += buf_rows_;
    // Take back a partial write, so no torn row is left for the next rows to
    // be appended to (shrinking needs no space).
    if (fd_ && size_ > start_size && ::ftruncate(fd_.get(), static_cast<off_t>(start_size)) == 0)
      size_ = start_size;
    fd_.reset();
    uint64_t now = mono_ms();
    if (last_report_ms_ == 0 || now - last_report_ms_ >= 60000) {
      last_report_ms_ = now;
      log::warn("{}: {} ({} rows dropped so far; traffic is not affected — free the "
                "disk or fix the path, writing resumes by itself)",
                opts_.what, last_error_, stats_.rows_dropped);
    }
  }
  buf_.clear();
  buf_rows_ = 0;
}

}  // namespace fy::netlog
