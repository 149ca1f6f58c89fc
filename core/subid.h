// The one reader of subordinate ids (/etc/subuid, /etc/subgid) in the
// project: fy-wall, fy-novsock and fy-machine's boot provisioning (through
// `fy-wall render principals`) wall what it returns.
//
// Its contract is shadow's: the ids it returns for an owner are exactly the
// ids newuidmap (newgidmap) of shadow 4.13, Debian 12's, lets that owner map,
// apart from the owner's own id, which needs no file. Read from shadow's
// lib/subordinateio.c (subordinate_parse, find_range, have_range),
// lib/commonio.c (commonio_open) and lib/getulong.c:
//
//   - Every line counts, not the first: have_range walks a requested range
//     line by line, so an owner may map the union of all its lines.
//   - A line is LOGIN:START:COUNT. Up to three ':'-separated fields are cut,
//     and anything after a third ':' is ignored ("a:1:2:x" is a:1:2); each
//     of the three must be non-empty. A line of 1024 bytes or more, and a
//     line starting with '+' or '-' (NIS), is ignored. Only the '\n' ends a
//     line: "a:1:2\r" has COUNT "2\r", which is not a number, so a CRLF line
//     is ignored. Comments and blank lines are ignored because they do not
//     parse; no line is an error.
//   - START and COUNT are C's strtoul with base 0: leading white space, a
//     sign ('-' negates modulo 2^64), 0x hex and 0 octal; the whole field
//     must be digits, and a value past 2^64-1 is refused (ERANGE).
//   - LOGIN matches the owner when it is the owner's login name, its decimal
//     uid exactly as "%lu" writes it, or any other login name that the
//     passwd database gives the same uid (shared uids). (Newgidmap keys the
//     /etc/subgid lines on the user too: its name and uid, never a gid.)
//   - A line grants the ids START..START+COUNT-1, computed modulo 2^64: a
//     COUNT of 0 grants nothing, except at START 0, where the last id wraps to
//     2^64-1 and the line grants every id; a range that wraps grants nothing.
//     The kernel maps ids up to 2^32-2 ((uid_t)-1 is no id), so a grant is cut
//     there.
//   - /etc/nsswitch.conf: the first line that starts "subid:" (any case,
//     8 bytes or more, not '#') with a word after it decides. "files" means
//     the files; a word over 50 bytes, the files (shadow says so and falls
//     back); any other word is an NSS module, libsubid_WORD.so, which
//     newuidmap asks instead of the files when it loads (and falls back to
//     the files when it does not). A module answers each request by its own
//     has_range, which nothing ties to the ranges it would list, so read()
//     refuses whenever a module is named: a refusal never walls less than
//     what can be mapped.
//
// Refused outright (read() and parse() return an error naming file:line):
// a grant that includes id 0 (walling root would wall the walls themselves,
// and such a line lets the owner become root), more than kMaxRanges separate
// ranges, a NUL byte (commonio's fgets/strlen reading of it is not a text
// file's), and a file over kMaxFileBytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace fy::subid {

enum class Kind { uid, gid };
// "/etc/subuid" or "/etc/subgid".
const char* default_path(Kind k);
inline constexpr const char* kNsswitch = "/etc/nsswitch.conf";

// The largest id the kernel maps: (uid_t)-1 is never an id.
inline constexpr uint32_t kMaxId = 4294967294u;
// What any one consumer has room for (fy-novsock's map has this many slots).
inline constexpr size_t kMaxRanges = 64;
inline constexpr size_t kMaxFileBytes = 16 << 20;
// shadow's line buffer: a line this long or longer is ignored.
inline constexpr size_t kMaxLineBytes = 1024;

// An inclusive range of ids.
struct Range {
  uint32_t lo = 0;
  uint32_t hi = 0;
  bool operator==(const Range&) const = default;
};

// The owner as newuidmap knows it: a passwd entry's name and uid.
struct Owner {
  std::string name;
  uint32_t uid = 0;
};

// The uid of the passwd entry named `login`, or nullopt: shadow's
// getpwnam(LOGIN) in find_range. Injected so parse() stays pure.
using NameToUid = std::function<std::optional<uint32_t>(const std::string& login)>;

// One line that grants the owner ids.
struct Grant {
  size_t line = 0;    // 1-based
  std::string login;  // the LOGIN field as written
  uint64_t start = 0;
  uint64_t count = 0;
  Range ids;  // what it grants, cut at kMaxId
};

struct Subids {
  std::vector<Grant> grants;  // every line that grants the owner an id, in file order
  std::vector<Range> ranges;  // their union: sorted, disjoint, adjacent ranges merged
  // Lines keyed to the owner that grant nothing, for the operator: "file:line: why".
  std::vector<std::string> ignored;
  // Every line keyed to the owner that newuidmap parses, granting or not (the
  // grants' lines and the ignored ones), 1-based, in file order: what an
  // owner that must have no subordinate ids may not have (the host wall's VM
  // user, wall/vmuser.h).
  std::vector<size_t> keyed_lines;
};

// shadow's getulong(): strtoul(s, &end, 0) over the whole field, no ERANGE.
std::optional<uint64_t> shadow_getulong(std::string_view field);

// The ids START:COUNT grants, cut at kMaxId; nullopt for none.
std::optional<Range> granted(uint64_t start, uint64_t count);

// Parses a subuid or subgid text for `who`. `lookup` resolves a LOGIN that is
// neither who.name nor who.uid's decimal text (nullptr: no other name
// matches). `path` names the file in messages.
Result<Subids> parse(std::string_view text, const Owner& who, const NameToUid& lookup,
                     std::string_view path);

// Where newuidmap takes subordinate ids from, by /etc/nsswitch.conf.
struct Source {
  bool files = true;
  std::string module;  // the word, when not files
  size_t line = 0;     // the deciding line, 0 when none decides
};
Source parse_nsswitch(std::string_view text);

// The uid the passwd database (NSS, as getent) gives `login`.
std::optional<uint32_t> passwd_uid(const std::string& login);

// A user given as a login name or a decimal uid, looked up in the passwd
// database; Errc::not_found when it has no entry.
Result<Owner> find_owner(std::string_view user);

// Reads the owner's subordinate ids as newuidmap (kind uid) or newgidmap
// (kind gid) would grant them: `nsswitch` first (absent: the files), then
// `path` (absent: nothing, as newuidmap then maps nothing). Errc::refused
// when an NSS module is named; Errc::io when a file cannot be read.
Result<Subids> read(Kind kind, const Owner& who, const std::string& path,
                    const std::string& nsswitch = kNsswitch);

// read() over texts already read ("" for an absent file), pure: the
// nsswitch.conf text decides (Errc::refused naming `nsswitch_path`:line when
// it names a module), then parse() of `text`. The paths name the files in
// messages.
Result<Subids> from_texts(Kind kind, const Owner& who, std::string_view nsswitch_text,
                          std::string_view nsswitch_path, std::string_view text,
                          std::string_view path, const NameToUid& lookup);

// "100000-165535", "4242".
std::string format_range(const Range& r);
// "4242, 100000-165535"
std::string format_ranges(const std::vector<Range>& ranges);
// The ids of `want` that `have` does not hold, as ranges.
std::vector<Range> uncovered(const std::vector<Range>& want, const std::vector<Range>& have);
// Sorts and merges overlapping and adjacent ranges.
std::vector<Range> merged(std::vector<Range> ranges);

}  // namespace fy::subid
