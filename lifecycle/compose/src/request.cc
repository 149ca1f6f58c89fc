#include "request.h"

#include <nlohmann/json.hpp>

namespace fy::compose {

std::string base64(std::string_view in, size_t line) {
  static constexpr char k[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve(in.size() * 4 / 3 + in.size() / 48 + 8);
  size_t col = 0;
  auto put = [&](char c) {
    out += c;
    if (line && ++col == line) {
      out += '\n';
      col = 0;
    }
  };
  size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    put(k[v >> 18]);
    put(k[(v >> 12) & 63]);
    put(k[(v >> 6) & 63]);
    put(k[v & 63]);
  }
  if (size_t rest = in.size() - i) {
    uint32_t v = uint8_t(in[i]) << 16;
    if (rest == 2) v |= uint8_t(in[i + 1]) << 8;
    put(k[v >> 18]);
    put(k[(v >> 12) & 63]);
    put(rest == 2 ? k[(v >> 6) & 63] : '=');
    put('=');
  }
  if (line && col) out += '\n';
  return out;
}

std::string request_json(const Request& r) {
  nlohmann::json j;
  j["argv"] = r.argv;
  j["files"] = r.files;
  j["project"] = r.project;
  j["env"] = r.env;
  j["cwd"] = r.cwd;
  j["wait_s"] = r.wait_s;
  j["answer"] = r.answer;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string guest_script(std::string_view bootstrap, std::string_view zip,
                         std::string_view zip_sha256, const Request& r) {
  std::string s(bootstrap);
  if (!s.ends_with('\n')) s += '\n';
  s += "_fy_boot(b\"\"\"\n";
  s += base64(zip, 76);
  s += "\"\"\", ";
  s += std::to_string(zip.size());
  s += ", \"";
  s += zip_sha256;
  s += "\", b\"";
  s += base64(request_json(r));
  s += "\")\n";
  return s;
}

namespace {
Result<nlohmann::json> parse_json(std::string_view text, std::string_view what) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded())
    return make_error(Errc::parse, "{} is not JSON", what);
  return j;
}
}  // namespace

Result<SshTarget> parse_ssh_target(std::string_view text) {
  auto j = parse_json(text, "fy-machine ssh-target --json's output");
  if (!j) return std::move(j).take_error();
  SshTarget t;
  if (!j->is_object() || !(*j).contains("config") || !(*j)["config"].is_string() ||
      !(*j).contains("host") || !(*j)["host"].is_string())
    return make_error(Errc::parse,
                      "fy-machine ssh-target --json printed no string \"config\" and \"host\"");
  t.config = (*j)["config"].get<std::string>();
  t.host = (*j)["host"].get<std::string>();
  if (t.config.empty() || t.config[0] != '/')
    return make_error(Errc::parse, "fy-machine's ssh config path '{}' is not absolute", t.config);
  if (t.host.empty() || t.host[0] == '-' ||
      t.host.find_first_of(" \t\r\n") != std::string::npos)
    return make_error(Errc::parse, "fy-machine's ssh host alias '{}' is not a host name", t.host);
  return t;
}

Result<std::string> parse_answer(std::string_view out, std::string_view kind,
                                 std::string_view project) {
  while (!out.empty() && out.back() == '\n') out.remove_suffix(1);
  auto nl = out.rfind('\n');
  std::string_view last = nl == std::string_view::npos ? out : out.substr(nl + 1);
  auto j = parse_json(last, "the guest's answer");
  if (!j) return std::move(j).take_error();
  if (!j->is_object() || !j->contains("fy-compose-answer") || !j->contains("project") ||
      !j->contains("body") || !(*j)["fy-compose-answer"].is_string() ||
      !(*j)["project"].is_string())
    return make_error(Errc::parse, "the guest's answer has no fy-compose-answer, project, body");
  if ((*j)["fy-compose-answer"].get<std::string>() != kind)
    return make_error(Errc::refused, "the guest answered '{}', not the '{}' asked for: ignored",
                      (*j)["fy-compose-answer"].get<std::string>(), kind);
  if ((*j)["project"].get<std::string>() != project)
    return make_error(Errc::refused,
                      "the guest answered for project '{}', not '{}' that was asked about: "
                      "ignored",
                      (*j)["project"].get<std::string>(), project);
  return (*j)["body"].dump();
}

Result<std::string> pick_container(std::string_view ps_json, std::string_view project,
                                   std::string_view service) {
  auto j = parse_json(ps_json, "the engine's container list");
  if (!j) return std::move(j).take_error();
  if (!j->is_array()) return make_error(Errc::parse, "the engine's container list is not a list");
  std::vector<std::string> hits;
  for (const auto& c : *j) {
    if (!c.is_object() || !c.contains("Labels") || !c["Labels"].is_object()) continue;
    const auto& l = c["Labels"];
    auto label = [&](const char* k) {
      return l.contains(k) && l[k].is_string() ? l[k].get<std::string>() : std::string();
    };
    std::string proj = label("com.docker.compose.project");
    if (proj.empty()) proj = label("io.podman.compose.project");
    if (proj != project || label("com.docker.compose.service") != service) continue;
    if (c.contains("State") && c["State"].is_string() && c["State"] != "running") continue;
    if (c.contains("Id") && c["Id"].is_string()) hits.push_back(c["Id"].get<std::string>());
  }
  if (hits.empty())
    return make_error(Errc::not_found,
                      "no running container of service '{}' in project '{}': start it with "
                      "fy-compose up -d",
                      service, project);
  if (hits.size() > 1)
    return make_error(Errc::refused,
                      "{} running containers of service '{}' in project '{}': which one to enter is "
                      "ambiguous; scale the service to one",
                      hits.size(), service, project);
  return hits[0];
}

}  // namespace fy::compose
