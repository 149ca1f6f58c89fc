#include "core/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <toml++/toml.h>

#include "core/clock.h"

namespace fy::cfg {

struct Errors {
  std::vector<std::string> list;
};

namespace {

const toml::table* as_table(const void* p) { return static_cast<const toml::table*>(p); }

std::string where_of(const std::string& path, const toml::source_region& src) {
  if (!src.begin) return path;
  return fmt::format("{}:{}:{}", path, src.begin.line, src.begin.column);
}

const char* type_name(toml::node_type t) {
  switch (t) {
    case toml::node_type::none: return "";
    case toml::node_type::table: return "table";
    case toml::node_type::array: return "array";
    case toml::node_type::string: return "string";
    case toml::node_type::integer: return "integer";
    case toml::node_type::floating_point: return "float";
    case toml::node_type::boolean: return "boolean";
    case toml::node_type::date: return "date";
    case toml::node_type::time: return "time";
    case toml::node_type::date_time: return "date-time";
  }
  return "?";
}

}  // namespace

const void* Table::node(std::string_view key) {
  if (std::find(seen_.begin(), seen_.end(), key) == seen_.end()) seen_.emplace_back(key);
  return as_table(tbl_)->get(key);
}

bool Table::has(std::string_view key) const { return as_table(tbl_)->contains(key); }

std::string Table::type_of(std::string_view key) {
  auto* n = static_cast<const toml::node*>(node(key));
  return n ? type_name(n->type()) : "";
}

std::string Table::where(std::string_view key) const {
  if (!key.empty()) {
    if (auto* n = as_table(tbl_)->get(key)) return where_of(path_, n->source());
  }
  return where_of(path_, as_table(tbl_)->source());
}

void Table::error(std::string_view key, std::string_view message) {
  std::string scope = name_.empty() ? std::string(key) : fmt::format("{}.{}", name_, key);
  if (key.empty()) scope = name_;
  errors_->list.push_back(fmt::format("{}: {}: {}", where(key), scope, message));
}

std::optional<std::string> Table::string(std::string_view key) {
  auto* n = static_cast<const toml::node*>(node(key));
  if (!n) return std::nullopt;
  if (auto v = n->value<std::string>(); v && n->is_string()) return *v;
  error(key, fmt::format("expected a string, found {}", type_name(n->type())));
  return std::nullopt;
}

std::optional<int64_t> Table::integer(std::string_view key, int64_t min, int64_t max) {
  auto* n = static_cast<const toml::node*>(node(key));
  if (!n) return std::nullopt;
  if (!n->is_integer()) {
    error(key, fmt::format("expected an integer, found {}", type_name(n->type())));
    return std::nullopt;
  }
  int64_t v = *n->value<int64_t>();
  if (v < min || v > max) {
    error(key, fmt::format("{} is out of range ({}..{})", v, min, max));
    return std::nullopt;
  }
  return v;
}

std::optional<double> Table::real(std::string_view key, double min, double max) {
  auto* n = static_cast<const toml::node*>(node(key));
  if (!n) return std::nullopt;
  if (!n->is_number()) {
    error(key, fmt::format("expected a number, found {}", type_name(n->type())));
    return std::nullopt;
  }
  double v = *n->value<double>();
  if (v < min || v > max) {
    error(key, fmt::format("{} is out of range ({}..{})", v, min, max));
    return std::nullopt;
  }
  return v;
}

std::optional<bool> Table::boolean(std::string_view key) {
  auto* n = static_cast<const toml::node*>(node(key));
  if (!n) return std::nullopt;
  if (!n->is_boolean()) {
    error(key, fmt::format("expected true or false, found {}", type_name(n->type())));
    return std::nullopt;
  }
  return *n->value<bool>();
}

std::optional<std::vector<std::string>> Table::strings(std::string_view key) {
  auto* n = static_cast<const toml::node*>(node(key));
  if (!n) return std::nullopt;
  const toml::array* arr = n->as_array();
  if (!arr) {
    error(key, fmt::format("expected an array of strings, found {}", type_name(n->type())));
    return std::nullopt;
  }
  std::vector<std::string> out;
  bool ok = true;
  for (size_t i = 0; i < arr->size(); ++i) {
    const toml::node& e = *arr->get(i);
    if (!e.is_string()) {
      errors_->list.push_back(fmt::format("{}: {}.{}[{}]: expected a string, found {}",
                                          where_of(path_, e.source()), name_, key, i,
                                          type_name(e.type())));
      ok = false;
      continue;
    }
    out.push_back(*e.value<std::string>());
  }
  if (!ok) return std::nullopt;
  return out;
}

std::optional<int64_t> Table::timestamp_ms(std::string_view key) {
  auto* n = static_cast<const toml::node*>(node(key));
  if (!n) return std::nullopt;
  if (n->is_date_time()) {
    toml::date_time dt = *n->value<toml::date_time>();
    if (!dt.offset) {
      error(key, "a local date-time has no offset: write it in UTC, e.g. 2026-11-29T21:30:00Z");
      return std::nullopt;
    }
    std::string s = fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", dt.date.year,
                                dt.date.month, dt.date.day, dt.time.hour, dt.time.minute,
                                dt.time.second, dt.time.nanosecond / 1000000);
    auto ms = parse_iso8601(s);
    if (!ms) {
      error(key, "is not a valid date-time");
      return std::nullopt;
    }
    return *ms - static_cast<int64_t>(dt.offset->minutes) * 60000;
  }
  if (n->is_string()) {
    auto ms = parse_iso8601(*n->value<std::string>());
    if (!ms) {
      error(key, "is not an RFC 3339 timestamp with an offset (e.g. 2026-11-29T21:30:00Z)");
      return std::nullopt;
    }
    return *ms;
  }
  error(key, fmt::format("expected a date-time, found {}", type_name(n->type())));
  return std::nullopt;
}

std::optional<std::vector<std::pair<std::string, std::string>>> Table::string_map(
    std::string_view key) {
  auto* n = static_cast<const toml::node*>(node(key));
  if (!n) return std::nullopt;
  const toml::table* t = n->as_table();
  if (!t) {
    error(key, fmt::format("expected a table of strings, found {}", type_name(n->type())));
    return std::nullopt;
  }
  std::vector<std::pair<std::string, std::string>> out;
  bool ok = true;
  for (auto&& [k, v] : *t) {
    if (!v.is_string()) {
      errors_->list.push_back(fmt::format("{}: {}.{}.{}: expected a string, found {}",
                                          where_of(path_, v.source()), name_, key, k.str(),
                                          type_name(v.type())));
      ok = false;
      continue;
    }
    out.emplace_back(std::string(k.str()), *v.value<std::string>());
  }
  if (!ok) return std::nullopt;
  return out;
}

std::optional<Table> Table::table(std::string_view key) {
  auto* n = static_cast<const toml::node*>(node(key));
  if (!n) return std::nullopt;
  const toml::table* t = n->as_table();
  if (!t) {
    error(key, fmt::format("expected a table, found {}", type_name(n->type())));
    return std::nullopt;
  }
  std::string nm = name_.empty() ? fmt::format("[{}]", key)
                                 : fmt::format("{}.{}", name_, key);
  return Table(t, nm, errors_, path_);
}

std::vector<Table> Table::tables(std::string_view key) {
  std::vector<Table> out;
  auto* n = static_cast<const toml::node*>(node(key));
  if (!n) return out;
  const toml::array* arr = n->as_array();
  if (!arr) {
    error(key, fmt::format("expected an array of tables ([[{}]]), found {}", key,
                           type_name(n->type())));
    return out;
  }
  for (size_t i = 0; i < arr->size(); ++i) {
    const toml::node& e = *arr->get(i);
    const toml::table* t = e.as_table();
    if (!t) {
      errors_->list.push_back(fmt::format("{}: [[{}]] #{}: expected a table, found {}",
                                          where_of(path_, e.source()), key, i + 1,
                                          type_name(e.type())));
      continue;
    }
    out.push_back(Table(t, fmt::format("[[{}]] #{}", key, i + 1), errors_, path_));
  }
  return out;
}

void Table::finish() {
  for (auto&& [k, v] : *as_table(tbl_)) {
    if (std::find(seen_.begin(), seen_.end(), k.str()) != seen_.end()) continue;
    std::string scope = name_.empty() ? "the top level" : name_;
    errors_->list.push_back(fmt::format("{}: unknown key '{}' in {} — check its spelling "
                                        "against the documented keys",
                                        where_of(path_, v.source()), k.str(), scope));
  }
}

Result<Doc> Doc::parse(std::string_view text, const std::string& path) {
  Doc d;
  d.path_ = path;
  d.errors_ = std::make_shared<Errors>();
  try {
    auto tbl = std::make_shared<toml::table>(toml::parse(text, path));
    d.tbl_ = tbl;
  } catch (const toml::parse_error& e) {
    return make_error(Errc::parse, "{}:{}:{}: not valid TOML: {}", path, e.source().begin.line,
                      e.source().begin.column, e.description());
  }
  return d;
}

Result<Doc> Doc::load_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return make_error(errno == ENOENT ? Errc::not_found : Errc::io, "{}: cannot be read: {}",
                      path, strerror(errno));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path);
}

Table Doc::root() { return Table(tbl_.get(), "", errors_, path_); }

Result<void> Doc::result() const {
  if (errors_->list.empty()) return {};
  std::string all;
  for (const auto& e : errors_->list) {
    if (!all.empty()) all += '\n';
    all += e;
  }
  return Error{Errc::invalid_argument, all};
}

}  // namespace fy::cfg
