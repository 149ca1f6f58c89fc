#include "core/args.h"

#include <utility>

namespace fy {

ArgParser& ArgParser::add(std::string_view names, Opt o) {
  while (!names.empty()) {
    size_t comma = names.find(',');
    o.names.emplace_back(names.substr(0, comma));
    names.remove_prefix(comma == std::string_view::npos ? names.size() : comma + 1);
  }
  opts_.push_back(std::move(o));
  return *this;
}

ArgParser& ArgParser::flag(std::string_view names, FlagFn fn) {
  return add(names, Opt{{}, Type::flag, std::move(fn), nullptr, ""});
}

ArgParser& ArgParser::flag(std::string_view names, bool* set) {
  return flag(names, [set]() -> Refusal {
    *set = true;
    return std::nullopt;
  });
}

ArgParser& ArgParser::value(std::string_view names, ValueFn fn, std::string_view needs) {
  return add(names, Opt{{}, Type::value, nullptr, std::move(fn), std::string(needs)});
}

ArgParser& ArgParser::value(std::string_view names, std::string* into, std::string_view needs) {
  return value(
      names,
      [into](const std::string& v) -> Refusal {
        *into = v;
        return std::nullopt;
      },
      needs);
}

ArgParser& ArgParser::stop(std::string_view names) {
  return add(names, Opt{{}, Type::stop, nullptr, nullptr, ""});
}

ArgParser& ArgParser::any_long(AnyLongFn fn) {
  any_long_ = std::move(fn);
  return *this;
}

ArgParser& ArgParser::reject_positionals() {
  reject_positionals_ = true;
  return *this;
}

const ArgParser::Opt* ArgParser::find(std::string_view name) const {
  for (const Opt& o : opts_)
    for (const std::string& n : o.names)
      if (n == name) return &o;
  return nullptr;
}

ParsedArgs ArgParser::parse(int argc, const char* const* argv) const {
  using Kind = ArgProblem::Kind;
  ParsedArgs out;
  auto problem = [&](Kind k, std::string option, std::string message = "") {
    out.problem = ArgProblem{k, std::move(option), std::move(message)};
  };
  // Runs `o` with its value: the attached one, else the next word.
  auto take = [&](const Opt& o, const std::string& typed, std::optional<std::string> attached,
                  int& i) -> bool {
    if (o.type == Type::stop) {
      if (attached) {
        problem(Kind::no_value, typed);
        return false;
      }
      out.stopped_at = o.names.front();
      return false;
    }
    if (o.type == Type::flag) {
      if (attached) {
        problem(Kind::no_value, typed);
        return false;
      }
      if (Refusal r = o.on_flag()) {
        problem(Kind::bad_value, typed, std::move(*r));
        return false;
      }
      return true;
    }
    if (!attached) {
      if (i + 1 >= argc) {
        problem(Kind::needs_value, typed, o.needs);
        return false;
      }
      attached = argv[++i];
    }
    if (Refusal r = o.on_value(*attached)) {
      problem(Kind::bad_value, typed, std::move(*r));
      return false;
    }
    return true;
  };

  bool options_done = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (options_done || a == "-" || a.empty() || a[0] != '-') {
      if (reject_positionals_) {
        problem(Kind::unknown, a);
        return out;
      }
      out.positional.push_back(std::move(a));
      continue;
    }
    if (a == "--") {
      options_done = true;
      continue;
    }
    if (a[1] == '-') {  // --name or --name=VALUE
      std::string name = a;
      std::optional<std::string> attached;
      if (size_t eq = a.find('='); eq != std::string::npos) {
        name = a.substr(0, eq);
        attached = a.substr(eq + 1);
      }
      if (const Opt* o = find(name)) {
        if (!take(*o, name, std::move(attached), i)) return out;
        continue;
      }
      if (!any_long_) {
        problem(Kind::unknown, name);
        return out;
      }
      if (!attached) {
        if (i + 1 >= argc) {
          problem(Kind::needs_value, name, "a value");
          return out;
        }
        attached = argv[++i];
      }
      if (Refusal r = any_long_(std::string_view(name).substr(2), *attached)) {
        problem(Kind::bad_value, name, std::move(*r));
        return out;
      }
      continue;
    }
    // -x, -xVALUE, -xyz (grouped flags, the last may take a value).
    for (size_t k = 1; k < a.size(); ++k) {
      std::string name = std::string("-") + a[k];
      const Opt* o = find(name);
      if (!o) {
        problem(Kind::unknown, k == 1 && a.size() == 2 ? a : name);
        return out;
      }
      std::optional<std::string> attached;
      if (o->type == Type::value && k + 1 < a.size()) attached = a.substr(k + 1);
      if (!take(*o, name, std::move(attached), i)) return out;
      if (o->type == Type::value) break;
    }
  }
  return out;
}

}  // namespace fy
