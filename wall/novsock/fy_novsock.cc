// fy-novsock: closes AF_VSOCK to the walled principals (docs/fy-wall.md,
// "vsock") with a BPF-LSM program on socket_create (novsock.bpf.c).
//
//   fy-novsock apply --uids LIST [--pin-dir DIR]   attach (or update the ranges)
//   fy-novsock status [--pin-dir DIR]              exit 0 attached, 1 not
//   fy-novsock remove [--pin-dir DIR]              detach
//
// LIST is comma-separated uids and inclusive ranges ("4242,100000-165535"),
// at most FY_NOVSOCK_SLOTS of them, never uid 0 (root, and Lima's guest agent
// with it, keeps vsock: the vz driver carries the agent over it). The program
// stays attached after this process exits: its link and maps are pinned under
// DIR (default /sys/fs/bpf/fy-novsock), and `remove` unpins them. Re-applying
// rewrites the ranges of the attached program in place (new ranges first,
// then the stale slots are emptied), never detaching it.
//
// Exit codes: 0 done (status: attached), 1 failed or not attached (with what
// to do), 2 usage.
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "core/text.h"
#include "novsock.h"
#include "novsock_bpf.h"

namespace {

constexpr const char* kDefaultPinDir = "/sys/fs/bpf/fy-novsock";

// "4242,100000-165535" -> ranges; nullopt with *why on anything else.
std::optional<std::vector<fy_uid_range>> parse_uid_ranges(std::string_view list,
                                                          std::string* why) {
  std::vector<fy_uid_range> out;
  for (std::string_view item : fy::split_list(list)) {
    std::string_view lo_s = item, hi_s = item;
    if (size_t dash = item.find('-'); dash != std::string_view::npos) {
      lo_s = item.substr(0, dash);
      hi_s = item.substr(dash + 1);
    }
    auto lo = fy::parse_u64(lo_s), hi = fy::parse_u64(hi_s);
    if (!lo || !hi || *hi > 0xfffffffeULL || *lo > *hi) {
      *why = "'" + std::string(item) + "' is not a uid or an ascending uid range A-B";
      return std::nullopt;
    }
    if (*lo == 0) {
      *why = "'" + std::string(item) + "' includes uid 0: root (and the guest agent) keeps vsock";
      return std::nullopt;
    }
    out.push_back({static_cast<unsigned>(*lo), static_cast<unsigned>(*hi)});
  }
  if (out.empty()) {
    *why = "no uid given";
    return std::nullopt;
  }
  if (out.size() > FY_NOVSOCK_SLOTS) {
    *why = "more than " + std::to_string(FY_NOVSOCK_SLOTS) + " ranges";
    return std::nullopt;
  }
  return out;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int fail(const std::string& what) {
  std::fprintf(stderr, "fy-novsock: %s\n", what.c_str());
  return 1;
}

std::string err(int e) { return std::strerror(e < 0 ? -e : e); }

// Why the kernel cannot run the program, or "" when it may.
std::string lsm_missing() {
  std::string lsm = read_text("/sys/kernel/security/lsm");
  if (lsm.empty()) return "";  // securityfs not mounted: let the attach say
  while (!lsm.empty() && (lsm.back() == '\n' || lsm.back() == ' ')) lsm.pop_back();
  if (fy::list_has_token(lsm, "bpf")) return "";
  return "the kernel's active LSMs (" + lsm +
         ") do not include bpf: boot the guest with lsm=" + lsm +
         ",bpf on its command line (the kernel needs CONFIG_BPF_LSM)";
}

// Writes `ranges` into the map: new ranges first, then the stale slots
// emptied, so a re-apply never opens a slot it keeps.
int write_ranges(int map_fd, const std::vector<fy_uid_range>& ranges) {
  for (unsigned i = 0; i < ranges.size(); i++) {
    if (bpf_map_update_elem(map_fd, &i, &ranges[i], BPF_ANY) != 0) return -errno;
  }
  for (unsigned i = ranges.size(); i < FY_NOVSOCK_SLOTS; i++) {
    fy_uid_range r{1, 0};
    if (bpf_map_update_elem(map_fd, &i, &r, BPF_ANY) != 0) return -errno;
  }
  return 0;
}

int apply(const std::string& dir, const std::vector<fy_uid_range>& ranges) {
  const std::string link_path = dir + "/link", uids_path = dir + "/uids";
  if (int link = bpf_obj_get(link_path.c_str()); link >= 0) {
    close(link);
    int map = bpf_obj_get(uids_path.c_str());
    if (map < 0) return fail("attached at " + link_path + " but " + uids_path +
                             " is missing: run `fy-novsock remove`, then apply again");
    int rc = write_ranges(map, ranges);
    close(map);
    if (rc != 0) return fail("cannot update " + uids_path + ": " + err(rc));
    std::printf("fy-novsock: attached already; ranges updated\n");
    return 0;
  }
  if (std::string why = lsm_missing(); !why.empty()) return fail(why);
  libbpf_set_print([](libbpf_print_level level, const char* fmt, va_list args) -> int {
    return level == LIBBPF_WARN ? std::vfprintf(stderr, fmt, args) : 0;
  });
  bpf_object* obj = bpf_object__open_mem(kNovsockBpf, sizeof kNovsockBpf, nullptr);
  if (!obj) return fail("cannot open the BPF object: " + err(errno));
  struct Closer {
    bpf_object* o;
    ~Closer() { bpf_object__close(o); }
  } closer{obj};
  if (int rc = bpf_object__load(obj); rc != 0)
    return fail("the kernel refused the program: " + err(rc) +
                " (needs root, BTF at /sys/kernel/btf/vmlinux and a BPF-LSM kernel)");
  bpf_map* uids = bpf_object__find_map_by_name(obj, "fy_novsock_uids");
  bpf_map* denied = bpf_object__find_map_by_name(obj, "fy_novsock_denied");
  bpf_program* prog = bpf_object__find_program_by_name(obj, "fy_novsock");
  if (!uids || !denied || !prog) return fail("the embedded BPF object lacks its maps or program");
  // The ranges before the attach: the program never runs with them empty.
  if (int rc = write_ranges(bpf_map__fd(uids), ranges); rc != 0)
    return fail("cannot fill the uid map: " + err(rc));
  bpf_link* link = bpf_program__attach_lsm(prog);
  if (!link) return fail("cannot attach to lsm/socket_create: " + err(errno) +
                         " (is bpf among /sys/kernel/security/lsm?)");
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    bpf_link__destroy(link);
    return fail("cannot make " + dir + ": " + err(errno) + " (is bpffs mounted at /sys/fs/bpf?)");
  }
  int rc = bpf_map__pin(uids, uids_path.c_str());
  if (rc == 0) rc = bpf_map__pin(denied, (dir + "/denied").c_str());
  if (rc == 0) rc = bpf_link__pin(link, link_path.c_str());
  if (rc != 0) {
    unlink(uids_path.c_str());
    unlink((dir + "/denied").c_str());
    bpf_link__destroy(link);
    return fail("cannot pin under " + dir + ": " + err(rc));
  }
  bpf_link__destroy(link);  // the pin holds it
  std::printf("fy-novsock: attached to lsm/socket_create, pinned at %s\n", link_path.c_str());
  return 0;
}

int status(const std::string& dir) {
  int link = bpf_obj_get((dir + "/link").c_str());
  if (link < 0) {
    std::printf("fy-novsock: not attached (no %s/link): AF_VSOCK is open to every uid\n",
                dir.c_str());
    return 1;
  }
  close(link);
  std::string ranges;
  if (int map = bpf_obj_get((dir + "/uids").c_str()); map >= 0) {
    for (unsigned i = 0; i < FY_NOVSOCK_SLOTS; i++) {
      fy_uid_range r{};
      if (bpf_map_lookup_elem(map, &i, &r) != 0 || r.lo > r.hi) continue;
      if (!ranges.empty()) ranges += ",";
      ranges += r.lo == r.hi ? std::to_string(r.lo)
                             : std::to_string(r.lo) + "-" + std::to_string(r.hi);
    }
    close(map);
  }
  unsigned long long n = 0;
  if (int map = bpf_obj_get((dir + "/denied").c_str()); map >= 0) {
    unsigned k = 0;
    bpf_map_lookup_elem(map, &k, &n);
    close(map);
  }
  std::printf("fy-novsock: attached; AF_VSOCK refused to uids %s; refused %llu so far\n",
              ranges.empty() ? "(none)" : ranges.c_str(), n);
  return 0;
}

int remove_pins(const std::string& dir) {
  int rc = 0;
  for (const char* f : {"/link", "/uids", "/denied"}) {
    std::string p = dir + f;
    if (unlink(p.c_str()) != 0 && errno != ENOENT) {
      std::fprintf(stderr, "fy-novsock: cannot remove %s: %s\n", p.c_str(), err(errno).c_str());
      rc = 1;
    }
  }
  rmdir(dir.c_str());
  if (rc == 0) std::printf("fy-novsock: detached\n");
  return rc;
}

int usage() {
  std::fprintf(stderr,
               "usage: fy-novsock apply --uids LIST [--pin-dir DIR]\n"
               "       fy-novsock status [--pin-dir DIR]\n"
               "       fy-novsock remove [--pin-dir DIR]\n"
               "LIST: uids and ranges, e.g. 4242,100000-165535 (never 0)\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  std::string cmd = argv[1], dir = kDefaultPinDir, uids;
  bool have_uids = false;
  for (int i = 2; i < argc; i++) {
    std::string a = argv[i];
    if ((a == "--uids" || a == "--pin-dir") && i + 1 < argc) {
      (a == "--uids" ? uids : dir) = argv[++i];
      have_uids |= a == "--uids";
    } else {
      std::fprintf(stderr, "fy-novsock: unknown argument '%s'\n", a.c_str());
      return usage();
    }
  }
  if (cmd == "apply") {
    if (!have_uids) return usage();
    std::string why;
    auto ranges = parse_uid_ranges(uids, &why);
    if (!ranges) {
      std::fprintf(stderr, "fy-novsock: --uids %s: %s\n", uids.c_str(), why.c_str());
      return 2;
    }
    return apply(dir, *ranges);
  }
  if (have_uids) return usage();
  if (cmd == "status") return status(dir);
  if (cmd == "remove") return remove_pins(dir);
  return usage();
}
