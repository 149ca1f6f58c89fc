// Shared by the netlog unit tests: a throwaway directory, file helpers and a
// row maker. Every test works in its own directory under $TMPDIR.
#pragma once

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "proxy/netlog/row.h"

namespace fy::netlog::test {

class TempDir {
 public:
  TempDir() {
    const char* t = std::getenv("TMPDIR");
    std::string tmpl = std::string(t && *t ? t : "/tmp") + "/fy-netlog-test.XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    if (p) path = p;
  }
  ~TempDir() {
    if (!path.empty()) std::system(("rm -rf '" + path + "'").c_str());
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path;
};

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void spit(const std::string& path, const std::string& data, bool append = false) {
  std::ofstream f(path, std::ios::binary | (append ? std::ios::app : std::ios::trunc));
  f << data;
}

inline std::vector<std::string> lines_of(const std::string& data) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < data.size()) {
    size_t nl = data.find('\n', start);
    if (nl == std::string::npos) {
      out.push_back(data.substr(start));
      break;
    }
    out.push_back(data.substr(start, nl - start));
    start = nl + 1;
  }
  return out;
}

inline std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") out.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

inline bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

// A plain request row whose identity is `conn`.
inline Row make_row(uint64_t conn, int64_t ts_ms = 1796074200000) {
  Row r;
  r.ts_ms = ts_ms;
  r.conn = conn;
  r.peer = "127.0.0.1:40000";
  r.method = "GET";
  r.host = "api.example.com";
  r.path = "/v1/items/" + std::to_string(conn);
  r.status = 200;
  r.tls = "decrypted";
  r.bytes_up = 100 + conn;
  r.bytes_down = 1000 + conn;
  r.duration_ms = 12;
  return r;
}

}  // namespace fy::netlog::test
