// One error vocabulary for every daemon: an Errc, a message written for the
// operator (what happened, what to do), and Result<T>, a small stand-in for
// C++23's std::expected. No exceptions cross a Result boundary.
#pragma once

#include <fmt/format.h>

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace fy {

enum class Errc {
  invalid_argument,  // bad flag, bad config value, malformed input
  parse,             // bytes that do not follow their grammar
  io,                // a system call failed
  not_found,
  permission,
  timeout,
  too_large,
  closed,
  refused,
  tls,
  dns,
  connect,
  reset,
  internal,  // an invariant broke; a bug
};

const char* errc_name(Errc e);

struct Error {
  Errc code = Errc::internal;
  std::string message;
};

// Builds an Error with a fmt-style message.
template <class... Args>
Error make_error(Errc code, fmt::format_string<Args...> f, Args&&... args) {
  return Error{code, fmt::format(f, std::forward<Args>(args)...)};
}

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT
  Result(Error e) : v_(std::in_place_index<1>, std::move(e)) {}      // NOLINT

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & {
    assert(ok());
    return std::get<0>(v_);
  }
  const T& value() const& {
    assert(ok());
    return std::get<0>(v_);
  }
  T&& value() && {
    assert(ok());
    return std::get<0>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  const Error& error() const {
    assert(!ok());
    return std::get<1>(v_);
  }
  Error&& take_error() && {
    assert(!ok());
    return std::get<1>(std::move(v_));
  }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error e) : err_(std::move(e)), ok_(false) {}  // NOLINT

  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const {
    assert(!ok_);
    return err_;
  }
  Error&& take_error() && { return std::move(err_); }

 private:
  Error err_;
  bool ok_ = true;
};

inline Result<void> ok() { return {}; }

}  // namespace fy

// Propagates an error out of a function returning a Result.
#define FY_TRY(expr)                                          \
  do {                                                        \
    auto fy_try_r_ = (expr);                                  \
    if (!fy_try_r_.ok()) return std::move(fy_try_r_).take_error(); \
  } while (0)
