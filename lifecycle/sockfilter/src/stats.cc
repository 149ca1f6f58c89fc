#include "src/stats.h"

namespace fy::sockfilter {

Stats::Stats() {
  for (auto c : kRefusalCodes) refusals.emplace(std::string(c), 0);
}

void Stats::refused(std::string_view code) {
  auto it = refusals.find(code);
  if (it == refusals.end()) it = refusals.emplace(std::string(code), 0).first;
  it->second++;
}

std::string Stats::render() const {
  std::string out;
  out += "# HELP fy_sockfilter_connections_total Client connections accepted.\n";
  out += "# TYPE fy_sockfilter_connections_total counter\n";
  out += "fy_sockfilter_connections_total " + std::to_string(connections) + "\n";
  out += "# HELP fy_sockfilter_requests_total Requests classified, by route class.\n";
  out += "# TYPE fy_sockfilter_requests_total counter\n";
  for (int i = 0; i < kRouteClasses; ++i) {
    out += "fy_sockfilter_requests_total{class=\"" +
           std::string(class_name(static_cast<RouteClass>(i))) + "\"} " +
           std::to_string(requests[i]) + "\n";
  }
  out += "# HELP fy_sockfilter_refusals_total Requests the filter answered itself, by reason.\n";
  out += "# TYPE fy_sockfilter_refusals_total counter\n";
  for (const auto& [code, n] : refusals) {
    out += "fy_sockfilter_refusals_total{reason=\"" + code + "\"} " + std::to_string(n) + "\n";
  }
  out += "# HELP fy_sockfilter_stripped_total Create-body members removed, by field.\n";
  out += "# TYPE fy_sockfilter_stripped_total counter\n";
  for (int i = 0; i < kStrippedKinds; ++i) {
    out += "fy_sockfilter_stripped_total{field=\"" +
           std::string(stripped_name(static_cast<Stripped>(i))) + "\"} " +
           std::to_string(stripped[i]) + "\n";
  }
  out += "# HELP fy_sockfilter_creates_rewritten_total Create bodies checked and forwarded.\n";
  out += "# TYPE fy_sockfilter_creates_rewritten_total counter\n";
  out += "fy_sockfilter_creates_rewritten_total " + std::to_string(creates_rewritten) + "\n";
  return out;
}

}  // namespace fy::sockfilter
