#include "proxy/http/rewrite.h"

#include <fmt/format.h>

#include "core/stamp.h"
#include "core/text.h"

namespace fy::http {

bool is_hop_by_hop(std::string_view n) {
  switch (n.size()) {
    case 2: return iequals(n, "te");
    case 7: return iequals(n, "trailer") || iequals(n, "upgrade");
    case 10: return iequals(n, "connection") || iequals(n, "keep-alive");
    case 16: return iequals(n, "proxy-connection");
    case 18: return iequals(n, "proxy-authenticate");
    case 19: return iequals(n, "proxy-authorization");
    default: return false;
  }
}

bool named_by_connection(const Head& head, std::string_view name) {
  if (iequals(name, "content-length") || iequals(name, "transfer-encoding") ||
      iequals(name, "host"))
    return false;
  for (const Header& h : head.headers)
    if (iequals(h.name, "connection") && list_has_token(h.value, name)) return true;
  return false;
}

namespace {

bool has_connection_header(const Head& head) { return head.count("connection") > 0; }

void append_field(std::string& out, std::string_view name, std::string_view value) {
  out.append(name);
  out.append(": ");
  out.append(value);
  out.append("\r\n");
}

}  // namespace

void build_request_head(std::string& out, const Head& in, const RequestOut& req) {
  out.append(req.method);
  out += ' ';
  out.append(req.target);
  out.append(in.http_minor == 0 ? " HTTP/1.0\r\n" : " HTTP/1.1\r\n");
  bool conn_header = has_connection_header(in);
  bool saw_host = false;
  for (const Header& h : in.headers) {
    bool keep_upgrade = req.upgrade && iequals(h.name, "upgrade");
    if (!keep_upgrade) {
      if (is_hop_by_hop(h.name)) continue;
      if (conn_header && named_by_connection(in, h.name)) continue;
    }
    if (stamp::is_stamp_header(h.name)) continue;
    bool replaced = false;
    for (const auto& [name, value] : req.set)
      if (iequals(h.name, name)) replaced = true;
    if (replaced) continue;
    if (iequals(h.name, "host")) saw_host = true;
    append_field(out, h.name, h.value);
  }
  if (!saw_host && !req.host.empty()) append_field(out, "Host", req.host);
  for (const auto& [name, value] : req.set) append_field(out, name, value);
  if (req.upgrade) append_field(out, "Connection", "upgrade");
  out.append("\r\n");
}

void build_response_head(std::string& out, const Head& in, bool close, bool upgrade) {
  fmt::format_to(std::back_inserter(out), "HTTP/1.1 {} ", in.status);
  out.append(in.reason.empty() ? std::string_view(reason_phrase(in.status)) : in.reason);
  out.append("\r\n");
  bool conn_header = has_connection_header(in);
  for (const Header& h : in.headers) {
    bool keep_upgrade = upgrade && iequals(h.name, "upgrade");
    if (!keep_upgrade) {
      if (is_hop_by_hop(h.name)) continue;
      if (conn_header && named_by_connection(in, h.name)) continue;
    }
    if (stamp::is_stamp_header(h.name)) continue;
    append_field(out, h.name, h.value);
  }
  if (upgrade) {
    append_field(out, "Connection", "upgrade");
  } else if (close) {
    append_field(out, "Connection", "close");
  }
  out.append("\r\n");
}

void build_answer(std::string& out, const Answer& a) {
  fmt::format_to(std::back_inserter(out), "HTTP/1.1 {} {}\r\n", a.status, reason_phrase(a.status));
  if (!a.body.empty() || a.status >= 200) {
    if (!a.content_type.empty() && !a.body.empty()) append_field(out, "Content-Type", a.content_type);
    fmt::format_to(std::back_inserter(out), "Content-Length: {}\r\n", a.body.size());
  }
  for (const auto& [k, v] : a.headers) append_field(out, k, v);
  if (a.close) append_field(out, "Connection", "close");
  out.append("\r\n");
  out.append(a.body);
}

const char* reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 101: return "Switching Protocols";
    case 200: return "OK";
    case 204: return "No Content";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 407: return "Proxy Authentication Required";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 421: return "Misdirected Request";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Status";
  }
}

}  // namespace fy::http
