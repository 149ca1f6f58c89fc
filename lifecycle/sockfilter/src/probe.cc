#include "src/probe.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

namespace fy::sockfilter {
namespace {

struct Reply {
  int status = 0;
  std::string body;
  std::string error;
};

// One request on a fresh connection (Connection: close), read to EOF.
Reply call(const std::string& sock, const std::string& method, const std::string& path,
           const std::string& body) {
  Reply r;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (sock.size() >= sizeof a.sun_path) {
    r.error = "socket path too long";
    close(fd);
    return r;
  }
  memcpy(a.sun_path, sock.c_str(), sock.size() + 1);
  timeval tv{60, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    r.error = std::string("cannot connect: ") + strerror(errno);
    close(fd);
    return r;
  }
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: d\r\nConnection: close\r\n";
  if (!body.empty()) {
    req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  req += "\r\n" + body;
  for (size_t off = 0; off < req.size();) {
    ssize_t n = ::write(fd, req.data() + off, req.size() - off);
    if (n <= 0) {
      r.error = std::string("write: ") + strerror(errno);
      close(fd);
      return r;
    }
    off += static_cast<size_t>(n);
  }
  std::string resp;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      r.error = std::string("read: ") + strerror(errno);
      close(fd);
      return r;
    }
    if (n == 0) break;
    resp.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  if (resp.size() < 12 || resp.compare(0, 5, "HTTP/") != 0) {
    r.error = "no HTTP response";
    return r;
  }
  r.status = atoi(resp.c_str() + 9);
  size_t he = resp.find("\r\n\r\n");
  std::string raw = he == std::string::npos ? "" : resp.substr(he + 4);
  std::string head = resp.substr(0, he);
  std::string lower = head;
  for (char& c : lower) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
  if (lower.find("transfer-encoding: chunked") != std::string::npos) {
    size_t p = 0;
    while (p < raw.size()) {
      size_t eol = raw.find("\r\n", p);
      if (eol == std::string::npos) break;
      size_t len = strtoul(raw.substr(p, eol - p).c_str(), nullptr, 16);
      if (len == 0) break;
      r.body.append(raw, eol + 2, len);
      p = eol + 2 + len + 2;
    }
  } else {
    r.body = raw;
  }
  return r;
}

}  // namespace

int run_probe(const std::string& sock, const std::string& image, const std::string& runtime) {
  const std::string v = "/v4.0.0/libpod";
  // Asks for crun on purpose: the answer must still be `runtime`.
  nlohmann::json spec = {{"image", image},
                         {"command", {"true"}},
                         {"oci_runtime", "crun"},
                         {"name", "fy-sockfilter-probe-" + std::to_string(getpid())}};
  Reply c = call(sock, "POST", v + "/containers/create", spec.dump());
  if (!c.error.empty() || c.status != 201) {
    fprintf(stderr,
            "fy-sockfilter: probe failed: the create through %s %s (%d %s); is the filter "
            "running in front of the runsc engine, and is the image %s there?\n",
            sock.c_str(), c.error.empty() ? "was refused" : c.error.c_str(), c.status,
            c.body.substr(0, 300).c_str(), image.c_str());
    return 1;
  }
  std::string id;
  try {
    id = nlohmann::json::parse(c.body).at("Id").get<std::string>();
  } catch (const std::exception& e) {
    fprintf(stderr, "fy-sockfilter: probe failed: the create's answer has no Id: %s\n",
            c.body.substr(0, 300).c_str());
    return 1;
  }
  Reply in = call(sock, "GET", v + "/containers/" + id + "/json", "");
  std::string got;
  try {
    got = nlohmann::json::parse(in.body).at("OCIRuntime").get<std::string>();
  } catch (const std::exception&) {
    got = "";
  }
  // And the runtime must actually run it: podman names a runtime whose
  // binary is missing just as readily.
  int exit_code = -1;
  if (got == runtime) {
    Reply st = call(sock, "POST", v + "/containers/" + id + "/start", "");
    Reply w = call(sock, "POST", v + "/containers/" + id + "/wait?condition=exited", "");
    if (st.status == 204 && w.status == 200) exit_code = atoi(w.body.c_str());
  }
  Reply rm = call(sock, "DELETE", v + "/containers/" + id + "?force=true", "");
  if (got == runtime && exit_code != 0) {
    fprintf(stderr,
            "fy-sockfilter: probe FAILED: the engine names '%s' for a container created through "
            "%s, but it did not run it (exit %d): check the runtime's binary and wrapper\n",
            runtime.c_str(), sock.c_str(), exit_code);
    return 1;
  }
  if (got != runtime) {
    fprintf(stderr,
            "fy-sockfilter: probe FAILED: a container created through %s runs under '%s', not "
            "'%s': the socket does not hold the gVisor posture; do not hand it to a box\n",
            sock.c_str(), got.empty() ? "(no answer)" : got.c_str(), runtime.c_str());
    return 1;
  }
  if (rm.status != 200 && rm.status != 204) {
    fprintf(stderr, "fy-sockfilter: probe: the probe container %s was not removed (%d)\n",
            id.c_str(), rm.status);
  }
  printf("ok runtime=%s socket=%s\n", runtime.c_str(), sock.c_str());
  return 0;
}

}  // namespace fy::sockfilter
