// fy-novsock: closes AF_VSOCK and multicast memberships to the walled
// principals (docs/fy-wall.md, "vsock" and "Kernel-sent packets") with two
// BPF-LSM programs (novsock.bpf.c): socket_create refuses AF_VSOCK,
// socket_setsockopt refuses every option that changes a multicast membership
// or source filter (the kernel's IGMP/MLD reports would carry the groups and
// sources the caller chose, with no socket to judge them by).
//
//   fy-novsock apply --user NAME|UID [--pin-dir DIR]   the user and every uid
//                                                     it can map (core/subid.h)
//   fy-novsock apply --uids LIST [--pin-dir DIR]       attach (or update the ranges)
//   fy-novsock status [--pin-dir DIR]                  exit 0 attached, 1 not
//   fy-novsock remove [--pin-dir DIR]                  detach
//
// --user reads the passwd database and /etc/subuid as fy-wall does (one
// reader: core/subid.h), so the two wall the same uids; it refuses NSS subid
// and a grant of uid 0. LIST is comma-separated uids and inclusive ranges
// ("4242,100000-165535"), at most FY_NOVSOCK_SLOTS of them, never uid 0
// (root, and Lima's guest agent with it, keeps vsock: the vz driver carries
// the agent over it). The programs stay attached after this process exits:
// their links and maps are pinned under DIR (default /sys/fs/bpf/fy-novsock),
// and `remove` unpins them. Re-applying rewrites the ranges of the attached
// programs in place (new ranges first, then the stale slots are emptied),
// never detaching them.
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

#include "core/args.h"
#include "core/subid.h"
#include "core/text.h"
#include "novsock.h"
#include "novsock_bpf.h"

namespace {

constexpr const char* kDefaultPinDir = "/sys/fs/bpf/fy-novsock";

// "4242,100000-165535" -> ranges; nullopt with *why on anything else.
std::optional<std::vector<fy_uid_range>> parse_uid_ranges(std::string_view list, std::string* why) {
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

std::string err(int e) {
  return std::strerror(e < 0 ? -e : e);
}

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

// The pinned objects: the two links, the shared uid map, the two counters.
struct Pins {
  std::string link, link_mcast, uids, denied, mcast_denied;
  explicit Pins(const std::string& dir)
      : link(dir + "/link"),
        link_mcast(dir + "/link-mcast"),
        uids(dir + "/uids"),
        denied(dir + "/denied"),
        mcast_denied(dir + "/mcast-denied") {}
};

bool pinned(const std::string& path) {
  int fd = bpf_obj_get(path.c_str());
  if (fd < 0) return false;
  close(fd);
  return true;
}

int apply_programs(const std::string& dir, const std::vector<fy_uid_range>& ranges) {
  const Pins pins(dir);
  const bool vsock = pinned(pins.link), mcast = pinned(pins.link_mcast);
  if (vsock && mcast) {
    int map = bpf_obj_get(pins.uids.c_str());
    if (map < 0)
      return fail("attached at " + pins.link + " but " + pins.uids +
                  " is missing: run `fy-novsock remove`, then apply again");
    int rc = write_ranges(map, ranges);
    close(map);
    if (rc != 0) return fail("cannot update " + pins.uids + ": " + err(rc));
    std::printf("fy-novsock: attached already; ranges updated\n");
    return 0;
  }
  if (vsock || mcast) {
    return fail("an older fy-novsock is attached at " + dir + " (" +
                (vsock ? pins.link : pins.link_mcast) +
                " alone): run `fy-novsock remove`, then apply again (a reboot clears it too)");
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
    return fail("the kernel refused the programs: " + err(rc) +
                " (needs root, BTF at /sys/kernel/btf/vmlinux and a BPF-LSM kernel)");
  bpf_map* uids = bpf_object__find_map_by_name(obj, "fy_novsock_uids");
  bpf_map* denied = bpf_object__find_map_by_name(obj, "fy_novsock_denied");
  bpf_map* mcast_denied = bpf_object__find_map_by_name(obj, "fy_nomcast_denied");
  bpf_program* prog = bpf_object__find_program_by_name(obj, "fy_novsock");
  bpf_program* mprog = bpf_object__find_program_by_name(obj, "fy_nomcast");
  if (!uids || !denied || !mcast_denied || !prog || !mprog)
    return fail("the embedded BPF object lacks its maps or programs");
  // The ranges before the attach: the programs never run with them empty.
  if (int rc = write_ranges(bpf_map__fd(uids), ranges); rc != 0)
    return fail("cannot fill the uid map: " + err(rc));
  bpf_link* link = bpf_program__attach_lsm(prog);
  if (!link)
    return fail("cannot attach to lsm/socket_create: " + err(errno) +
                " (is bpf among /sys/kernel/security/lsm?)");
  bpf_link* mlink = bpf_program__attach_lsm(mprog);
  if (!mlink) {
    int e = errno;
    bpf_link__destroy(link);
    return fail("cannot attach to lsm/socket_setsockopt: " + err(e));
  }
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    int e = errno;
    bpf_link__destroy(link);
    bpf_link__destroy(mlink);
    return fail("cannot make " + dir + ": " + err(e) + " (is bpffs mounted at /sys/fs/bpf?)");
  }
  int rc = bpf_map__pin(uids, pins.uids.c_str());
  if (rc == 0) rc = bpf_map__pin(denied, pins.denied.c_str());
  if (rc == 0) rc = bpf_map__pin(mcast_denied, pins.mcast_denied.c_str());
  if (rc == 0) rc = bpf_link__pin(link, pins.link.c_str());
  if (rc == 0) rc = bpf_link__pin(mlink, pins.link_mcast.c_str());
  if (rc != 0) {
    for (const std::string* p :
         {&pins.link, &pins.link_mcast, &pins.uids, &pins.denied, &pins.mcast_denied})
      unlink(p->c_str());
    bpf_link__destroy(link);
    bpf_link__destroy(mlink);
    return fail("cannot pin under " + dir + ": " + err(rc));
  }
  bpf_link__destroy(link);  // the pins hold them
  bpf_link__destroy(mlink);
  std::printf(
      "fy-novsock: attached to lsm/socket_create and lsm/socket_setsockopt, pinned at "
      "%s\n",
      dir.c_str());
  return 0;
}

unsigned long long counted(const std::string& path) {
  unsigned long long n = 0;
  if (int map = bpf_obj_get(path.c_str()); map >= 0) {
    unsigned k = 0;
    bpf_map_lookup_elem(map, &k, &n);
    close(map);
  }
  return n;
}

int status(const std::string& dir) {
  const Pins pins(dir);
  const bool vsock = pinned(pins.link), mcast = pinned(pins.link_mcast);
  if (!vsock && !mcast) {
    std::printf(
        "fy-novsock: not attached (no %s): AF_VSOCK and multicast memberships are open to "
        "every uid\n",
        pins.link.c_str());
    return 1;
  }
  std::string ranges;
  if (int map = bpf_obj_get(pins.uids.c_str()); map >= 0) {
    for (unsigned i = 0; i < FY_NOVSOCK_SLOTS; i++) {
      fy_uid_range r{};
      if (bpf_map_lookup_elem(map, &i, &r) != 0 || r.lo > r.hi) continue;
      if (!ranges.empty()) ranges += ",";
      ranges +=
          r.lo == r.hi ? std::to_string(r.lo) : std::to_string(r.lo) + "-" + std::to_string(r.hi);
    }
    close(map);
  }
  if (!vsock || !mcast) {
    std::printf(
        "fy-novsock: only %s is attached (an older fy-novsock): %s is open to uids %s "
        "— run `fy-novsock remove`, then apply\n",
        vsock ? pins.link.c_str() : pins.link_mcast.c_str(),
        vsock ? "multicast membership" : "AF_VSOCK", ranges.c_str());
    return 1;
  }
  std::printf(
      "fy-novsock: attached; AF_VSOCK and multicast memberships refused to uids %s; refused "
      "%llu socket(s) and %llu membership change(s) so far\n",
      ranges.empty() ? "(none)" : ranges.c_str(), counted(pins.denied), counted(pins.mcast_denied));
  return 0;
}

int remove_pins(const std::string& dir) {
  int rc = 0;
  for (const char* f : {"/link", "/link-mcast", "/uids", "/denied", "/mcast-denied"}) {
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
               "usage: fy-novsock apply --user NAME|UID [--pin-dir DIR]\n"
               "       fy-novsock apply --uids LIST [--pin-dir DIR]\n"
               "       fy-novsock status [--pin-dir DIR]\n"
               "       fy-novsock remove [--pin-dir DIR]\n"
               "LIST: uids and ranges, e.g. 4242,100000-165535 (never 0)\n");
  return 2;
}

// The user's uid and every uid it can map, as fy-wall reads them.
std::optional<std::vector<fy_uid_range>> user_ranges(const std::string& user, std::string* why) {
  auto who = fy::subid::find_owner(user);
  if (!who) {
    *why = who.error().message;
    return std::nullopt;
  }
  if (who->uid == 0) {
    *why = "the user is root (uid 0): root (and the guest agent) keeps vsock";
    return std::nullopt;
  }
  auto ids =
      fy::subid::read(fy::subid::Kind::uid, *who, fy::subid::default_path(fy::subid::Kind::uid));
  if (!ids) {
    *why = ids.error().message;
    return std::nullopt;
  }
  std::vector<fy_uid_range> out{{who->uid, who->uid}};
  for (const fy::subid::Range& r : ids->ranges) out.push_back({r.lo, r.hi});
  if (out.size() > FY_NOVSOCK_SLOTS) {
    *why = "more than " + std::to_string(FY_NOVSOCK_SLOTS) + " ranges";
    return std::nullopt;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = kDefaultPinDir;
  std::optional<std::string> uids, user;
  fy::ArgParser p;
  p.value("--pin-dir", &dir, "a directory on bpffs");
  p.value("--uids", [&](const std::string& v) -> fy::ArgParser::Refusal {
    uids = v;
    return std::nullopt;
  });
  p.value("--user", [&](const std::string& v) -> fy::ArgParser::Refusal {
    user = v;
    return std::nullopt;
  });
  fy::ParsedArgs a = p.parse(argc, argv);
  if (a.problem) {
    std::fprintf(stderr, "fy-novsock: %s\n",
                 a.problem->kind == fy::ArgProblem::Kind::bad_value
                     ? a.problem->message.c_str()
                     : ("bad argument '" + a.problem->option + "'").c_str());
    return usage();
  }
  if (a.positional.size() != 1) return usage();
  const std::string& cmd = a.positional[0];
  if (cmd == "apply") {
    if (uids.has_value() == user.has_value()) return usage();  // exactly one of them
    std::string why;
    auto ranges = uids ? parse_uid_ranges(*uids, &why) : user_ranges(*user, &why);
    if (!ranges) {
      std::fprintf(stderr, "fy-novsock: %s %s: %s\n", uids ? "--uids" : "--user",
                   (uids ? *uids : *user).c_str(), why.c_str());
      return uids ? 2 : 1;
    }
    return apply_programs(dir, *ranges);
  }
  if (uids || user) return usage();
  if (cmd == "status") return status(dir);
  if (cmd == "remove") return remove_pins(dir);
  return usage();
}
