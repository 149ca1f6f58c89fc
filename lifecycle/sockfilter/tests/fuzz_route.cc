// libFuzzer target: the route classifier. Input: a method selector byte, a
// has-body byte, then the request target. Traps when a target the classifier
// does not refuse is classified as a create differently from an independent
// model of podman's router (the two create routes as regular expressions on
// the escaped path, query dropped), or when a target it forwards matches an
// independent model of the other creating doors (kube play/apply, local paths,
// quadlet installs, image scp), or when anything it forwards lies outside the
// families podman routes (default deny: a pass is always a route of the table).
#include <cstdint>
#include <cstdlib>
#include <regex>
#include <string>

#include "src/route.h"

using namespace fy::sockfilter;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  static const char* methods[] = {"POST", "GET", "PUT", "DELETE", "HEAD", "PATCH"};
  std::string method = methods[data[0] % 6];
  bool body = data[1] & 1;
  std::string target(reinterpret_cast<const char*>(data + 2), size - 2);
  Route r = classify(method, target, body, "");
  if (r.action == Action::refuse) {
    if (r.reason.empty()) abort();
    return 0;
  }
  std::string path = target.substr(0, target.find('?'));
  static const std::regex libpod("^/v[0-9][0-9A-Za-z.-]*/libpod/containers/create$");
  static const std::regex compat("^(/v[0-9][0-9A-Za-z.-]*)?/containers/create$");
  bool post = method == "POST";
  bool want_libpod = post && std::regex_match(path, libpod);
  bool want_compat = post && !want_libpod && std::regex_match(path, compat);
  if (want_libpod != (r.action == Action::create_libpod)) abort();
  if (want_compat != (r.action == Action::create_compat)) abort();
  // Whatever passes is a path the router matches as it is: no dot segment,
  // no empty segment but a trailing one.
  if (needs_clean(path)) abort();
  if (r.action == Action::pass) {
    static const std::regex doors(
        "^/v[0-9][0-9A-Za-z.-]*/libpod/(play/kube|kube/play|kube/apply|local/build|"
        "local/images/load|artifacts/local/add|images/scp/.*)$");
    static const std::regex quadlets("^/v[0-9][0-9A-Za-z.-]*/libpod/quadlets(/[^/]+)?$");
    if (post && std::regex_match(path, doors)) abort();
    if ((post || method == "DELETE") && std::regex_match(path, quadlets)) abort();
    static const std::regex families(
        "^(/v[0-9][0-9A-Za-z.-]*)?/(_ping|info|version|events|system|auth|monitor|plugins|"
        "distribution|configs|nodes|secrets?|services|swarm|tasks|containers|commit|exec|build|"
        "images|networks|volumes|libpod)(/.*)?$");
    if (!std::regex_match(path, families)) abort();
    if (method == "PATCH" && path.find("/plugins") == std::string::npos &&
        path.find("/monitor") == std::string::npos && path.find("/distribution/") == std::string::npos &&
        !std::regex_search(path, std::regex("/(configs|nodes|secrets|services|swarm|tasks)/"))) {
      abort();  // only the method-less routes take any method
    }
  }
  return 0;
}
