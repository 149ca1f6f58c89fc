// The one command-line parser of every binary (fy-wall, fy-forwarder and its
// hook, fy-netlog, fy-engine-watch, fy-proxy), in place of their hand-written
// loops and getopt_long tables.
//
// Why not CLI11: every binary's --help is a hand-written text the tests read
// verbatim, and every usage error has the binary's own wording and exit code;
// CLI11 would be told to print neither its help nor its errors, leaving only
// the loop, which this is. It is a table and ~150 lines, with no exceptions
// and no new package.
//
// Grammar (getopt_long's, less abbreviations): `--name VALUE`, `--name=VALUE`,
// `-n VALUE`, `-nVALUE`, grouped short flags (`-fn 5`); a value is the next
// word whatever it looks like (`--ports -1`); `--` ends the options; `-` alone
// is a positional. Long names must be given whole: `--fol` is unknown, not
// `--follow`, so a flag added later cannot change what an old command line
// means. Arguments are read in order and a handler runs as its option is
// read; the first problem ends the parse, as does a stop option (--help,
// --version), so `--help` after a bad option reports the bad option.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fy {

struct ArgProblem {
  enum class Kind {
    unknown,      // no such option (or a positional where none is taken)
    needs_value,  // an option that takes a value was last
    no_value,     // --flag=VALUE for a flag
    bad_value,    // a handler refused the value: `message` says why
  };
  Kind kind = Kind::unknown;
  std::string option;   // as typed, without "=VALUE"; the word itself for a positional
  std::string message;  // bad_value: the handler's; needs_value: the option's noun ("a value")
};

struct ParsedArgs {
  std::optional<std::string> stopped_at;  // the stop option read (its first name), if one was
  std::vector<std::string> positional;    // in order
  std::optional<ArgProblem> problem;      // the first, if any
  bool ok() const { return !problem; }
};

class ArgParser {
 public:
  // A handler's answer: nullopt when the value is taken, else why not (the
  // message goes to ArgProblem::bad_value as it is).
  using Refusal = std::optional<std::string>;
  using FlagFn = std::function<Refusal()>;
  using ValueFn = std::function<Refusal(const std::string& value)>;
  using AnyLongFn = std::function<Refusal(std::string_view name, const std::string& value)>;

  // `names`: comma-separated, each "-x" or "--long" ("-f,--follow").
  ArgParser& flag(std::string_view names, FlagFn fn);
  ArgParser& flag(std::string_view names, bool* set);
  // `needs` names what the value is, for the needs_value message.
  ArgParser& value(std::string_view names, ValueFn fn, std::string_view needs = "a value");
  ArgParser& value(std::string_view names, std::string* into, std::string_view needs = "a value");
  // The parse ends when one is read (--help, --version).
  ArgParser& stop(std::string_view names);
  // Every --name not declared takes a value and goes here (fy-proxy's flags,
  // which are its config keys); without it such a name is unknown.
  ArgParser& any_long(AnyLongFn fn);
  // Positionals are collected; with reject_positionals(), the first is an
  // unknown argument at once, in order with the options.
  ArgParser& reject_positionals();

  ParsedArgs parse(int argc, const char* const* argv) const;

 private:
  enum class Type { flag, value, stop };
  struct Opt {
    std::vector<std::string> names;
    Type type;
    FlagFn on_flag;
    ValueFn on_value;
    std::string needs;
  };
  const Opt* find(std::string_view name) const;
  ArgParser& add(std::string_view names, Opt o);
  std::vector<Opt> opts_;
  AnyLongFn any_long_;
  bool reject_positionals_ = false;
};

}  // namespace fy
