// TOML loading with toml++ for every daemon's configuration and policy files.
//
// The contract: a file is read whole, every key is validated, and a problem is
// reported as "file:line:col: what is wrong — what to do". Keys the reader
// never asked for are refused (a typo must not silently mean "default").
// Readers collect every error rather than stopping at the first, so an
// operator fixes a file in one pass.
//
//   auto doc = cfg::Doc::load_file(path);            // Result<Doc>
//   cfg::Table t = doc->root();
//   auto port = t.integer("port", 1, 65535);         // optional<int64_t>
//   t.finish();                                      // unknown keys -> errors
//   FY_TRY(doc->result());                           // all errors, or ok
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace fy::cfg {

struct Errors;

class Table {
 public:
  // Each getter marks `key` known. A present key of the wrong type or out of
  // range records an error and returns nullopt, as an absent key does.
  std::optional<std::string> string(std::string_view key);
  std::optional<int64_t> integer(std::string_view key, int64_t min, int64_t max);
  std::optional<double> real(std::string_view key, double min, double max);
  std::optional<bool> boolean(std::string_view key);
  std::optional<std::vector<std::string>> strings(std::string_view key);
  // A TOML offset date-time, or a string holding an RFC 3339 timestamp with an
  // offset; returns ms since the epoch. Local (naive) times are refused.
  std::optional<int64_t> timestamp_ms(std::string_view key);
  // A table of string values (e.g. `resolve = { "a.test" = "127.0.0.1" }`).
  std::optional<std::vector<std::pair<std::string, std::string>>> string_map(std::string_view key);
  std::optional<Table> table(std::string_view key);
  // An array of tables ([[key]]); empty when absent.
  std::vector<Table> tables(std::string_view key);

  bool has(std::string_view key) const;
  // What kind of value `key` holds: "string", "integer", "boolean", "array",
  // "table", "date-time", ... or "" when absent. Marks the key known.
  std::string type_of(std::string_view key);

  // "file:line:col" of `key` (or of the table itself when key is empty).
  std::string where(std::string_view key = {}) const;
  // Records an error at `key`.
  void error(std::string_view key, std::string_view message);
  // Records an error for every key no getter asked about.
  void finish();

  const std::string& name() const { return name_; }  // "[proxy]", "[[grant]] #2"

 private:
  friend class Doc;
  Table(const void* tbl, std::string name, std::shared_ptr<Errors> errors, std::string path)
      : tbl_(tbl), name_(std::move(name)), errors_(std::move(errors)), path_(std::move(path)) {}
  const void* node(std::string_view key);
  const void* tbl_;  // const toml::table*, owned by the Doc
  std::string name_;
  std::shared_ptr<Errors> errors_;
  std::string path_;
  std::vector<std::string> seen_;
};

class Doc {
 public:
  static Result<Doc> load_file(const std::string& path);
  static Result<Doc> parse(std::string_view text, const std::string& path);
  Table root();
  // Every error recorded so far, one per line; ok when there were none.
  Result<void> result() const;
  const std::string& path() const { return path_; }

 private:
  std::shared_ptr<void> tbl_;  // toml::table
  std::string path_;
  std::shared_ptr<Errors> errors_;
};

}  // namespace fy::cfg
