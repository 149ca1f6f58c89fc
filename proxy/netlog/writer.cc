#include "proxy/netlog/writer.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
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

}  // namespace

Writer::Writer(WriterOptions opts) : opts_(std::move(opts)) {}

Writer::~Writer() {
  flush();
  if (fd_ >= 0) ::close(fd_);
}

void Writer::append(const Row& row) {
  if (buf_.size() >= opts_.max_buffered) {
    ++stats_.rows_dropped;
    return;
  }
  append_json(buf_, row);
  ++buf_rows_;
}

bool Writer::open_file() {
  if (fd_ >= 0) return true;
  mkdirs(dir_of(opts_.path));
  fd_ = ::open(opts_.path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd_ < 0) {
    last_error_ = "cannot open " + opts_.path + ": " + strerror(errno);
    return false;
  }
  struct stat st;
  size_ = (::fstat(fd_, &st) == 0) ? static_cast<uint64_t>(st.st_size) : 0;
  return true;
}

void Writer::rotate() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  auto [stem, ext] = split_ext(base_of(opts_.path));
  std::string dir = dir_of(opts_.path);
  // egress.20261129T213000Z.jsonl; a second rotation within one second gets a suffix.
  std::string stamp = iso8601_utc(wall_ms(), false, true);
  stamp.erase(std::remove(stamp.begin(), stamp.end(), '-'), stamp.end());
  stamp.erase(std::remove(stamp.begin(), stamp.end(), ':'), stamp.end());
  std::string target = dir + "/" + stem + "." + stamp + ext;
  for (int n = 1; ::access(target.c_str(), F_OK) == 0; ++n)
    target = dir + "/" + stem + "." + stamp + "-" + std::to_string(n) + ext;
  if (::rename(opts_.path.c_str(), target.c_str()) != 0) {
    last_error_ = "cannot rotate " + opts_.path + ": " + strerror(errno);
    ++stats_.write_errors;
    return;
  }
  ++stats_.rotations;

  // Keep the newest `backups`: dated names sort by time.
  std::vector<std::string> backups;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name.size() > stem.size() + ext.size() + 1 && name.rfind(stem + ".", 0) == 0 &&
          name.size() >= ext.size() && name.compare(name.size() - ext.size(), ext.size(), ext) == 0 &&
          name != base_of(opts_.path))
        backups.push_back(name);
    }
    ::closedir(d);
  }
  std::sort(backups.begin(), backups.end());
  while (static_cast<int>(backups.size()) > opts_.backups) {
    ::unlink((dir + "/" + backups.front()).c_str());
    backups.erase(backups.begin());
  }
}

void Writer::flush() {
  if (buf_.empty()) return;
  bool ok = open_file();
  if (ok && size_ > 0 && size_ + buf_.size() > opts_.max_bytes) {
    rotate();
    ok = open_file();
  }
  size_t off = 0;
  while (ok && off < buf_.size()) {
    ssize_t n = ::write(fd_, buf_.data() + off, buf_.size() - off);
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
    if (fd_ >= 0) {
      ::close(fd_);
      fd_ = -1;
    }
    uint64_t now = mono_ms();
    if (last_report_ms_ == 0 || now - last_report_ms_ >= 60000) {
      last_report_ms_ = now;
      log::warn("network log: {} ({} rows dropped so far; traffic is not affected — free the "
                "disk or fix the path, writing resumes by itself)",
                last_error_, stats_.rows_dropped);
    }
  }
  buf_.clear();
  buf_rows_ = 0;
}

}  // namespace fy::netlog
