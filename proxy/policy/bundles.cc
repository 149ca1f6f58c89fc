#include "proxy/policy/bundles.h"

#include <map>
#include <string>

namespace fy::policy {
namespace {

using List = std::vector<std::string_view>;

const std::map<std::string_view, List>& table() {
  static const std::map<std::string_view, List> t = {
      {"anthropic", {"api.anthropic.com", "*.anthropic.com", "claude.ai", "*.claude.ai"}},
      {"vcs",
       {"github.com", "*.github.com", "*.githubusercontent.com", "gitlab.com", "*.gitlab.com",
        "bitbucket.org", "*.bitbucket.org", "codeberg.org"}},
      {"containers",
       {"registry-1.docker.io", "auth.docker.io", "*.docker.io", "*.docker.com", "quay.io",
        "*.quay.io", "ghcr.io", "*.pkg.dev", "gcr.io", "*.gcr.io", "mcr.microsoft.com",
        "*.data.mcr.microsoft.com", "public.ecr.aws", "registry.k8s.io", "*.cloudfront.net"}},
      {"cloud",
       {"*.amazonaws.com", "*.googleapis.com", "*.azure.com", "*.windows.net",
        "*.cloudflare.com", "*.digitaloceanspaces.com"}},
      {"node",
       {"registry.npmjs.org", "*.npmjs.org", "registry.yarnpkg.com", "*.yarnpkg.com",
        "nodejs.org", "*.nodejs.org"}},
      {"python", {"pypi.org", "*.pypi.org", "files.pythonhosted.org", "*.pythonhosted.org"}},
      {"ruby", {"rubygems.org", "*.rubygems.org", "index.rubygems.org"}},
      {"rust", {"crates.io", "*.crates.io", "static.rust-lang.org", "*.rust-lang.org"}},
      {"go", {"proxy.golang.org", "sum.golang.org", "*.golang.org", "go.dev", "*.go.dev"}},
      {"jvm",
       {"repo.maven.apache.org", "repo1.maven.org", "*.maven.org", "plugins.gradle.org",
        "services.gradle.org", "*.gradle.org"}},
      {"other-pkg",
       {"packagist.org", "*.packagist.org", "api.nuget.org", "*.nuget.org", "hackage.haskell.org",
        "conda.anaconda.org", "*.anaconda.org", "cran.r-project.org"}},
      {"linux",
       {"deb.debian.org", "security.debian.org", "*.debian.org", "archive.ubuntu.com",
        "security.ubuntu.com", "*.ubuntu.com", "dl-cdn.alpinelinux.org", "*.fedoraproject.org",
        "mirrors.fedoraproject.org"}},
      {"devtools",
       {"*.visualstudio.com", "*.vscode-cdn.net", "update.code.visualstudio.com",
        "open-vsx.org", "*.open-vsx.org", "*.jetbrains.com"}},
      {"monitoring", {"*.sentry.io", "*.datadoghq.com", "*.newrelic.com", "*.honeycomb.io"}},
      {"cdn",
       {"*.jsdelivr.net", "unpkg.com", "cdnjs.cloudflare.com", "*.fastly.net",
        "*.akamaihd.net"}},
      {"schema", {"json.schemastore.org", "*.schemastore.org", "json-schema.org"}},
      {"mcp", {"*.modelcontextprotocol.io", "modelcontextprotocol.io"}},
  };
  return t;
}

}  // namespace

const std::vector<std::string_view>& bundle_hosts(std::string_view name) {
  static const List empty;
  static const List all = [] {
    List out;
    for (const auto& [k, hosts] : table()) out.insert(out.end(), hosts.begin(), hosts.end());
    return out;
  }();
  if (name == "all") return all;
  auto it = table().find(name);
  return it == table().end() ? empty : it->second;
}

const std::vector<std::string_view>& bundle_names() {
  static const List names = [] {
    List out;
    for (const auto& [k, hosts] : table()) out.push_back(k);
    out.push_back("all");
    return out;
  }();
  return names;
}

}  // namespace fy::policy
