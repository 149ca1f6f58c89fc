// The kinds of a Network Log row's `error` ("<kind>: <detail>"): the one
// table. fy-proxy writes them, fy-netlog shows them (`err:<kind>`), and
// docs/netlog.md lists them; a doctest (tests/unit/netlog/view_test.cc) holds the
// page to this table, so a kind added here without the page fails the build's
// tests. Pure: no I/O.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

#include "core/result.h"

namespace fy::netlog {

enum class ErrorKind { dns, connect, tls_verify, tls, reset, timeout, closed, protocol, io };

struct ErrorKindRow {
  ErrorKind kind;
  std::string_view name;   // as written in the row
  std::string_view means;  // for the operator (docs/netlog.md)
};

inline constexpr std::array<ErrorKindRow, 9> kErrorKinds{{
    {ErrorKind::dns, "dns", "the origin's name did not resolve"},
    {ErrorKind::connect, "connect", "no address of the origin accepted a connection"},
    {ErrorKind::tls_verify, "tls_verify", "the origin's certificate is not trusted"},
    {ErrorKind::tls, "tls", "a TLS handshake or record failed"},
    {ErrorKind::reset, "reset", "the peer reset the connection"},
    {ErrorKind::timeout, "timeout", "a deadline passed (the response stalled, a head was late)"},
    {ErrorKind::closed, "closed", "a side closed before the exchange was whole"},
    {ErrorKind::protocol, "protocol", "bytes that follow neither HTTP nor TLS"},
    {ErrorKind::io, "io", "another socket failure"},
}};

// A row's error that a client-side failure caused starts with this, before
// its kind or reason ("client: timeout: ...", "client: the request head did
// not arrive in time").
inline constexpr std::string_view kClientPrefix = "client: ";

std::string_view error_kind_name(ErrorKind k);

// The kind a Stream failure of code `e` is written as (Errc::parse is a
// protocol error; codes with no kind of their own are io).
ErrorKind error_kind_of(Errc e);

// "<kind>: <detail>".
std::string error_text(ErrorKind k, std::string_view detail);

// The kind of a row's error, after kClientPrefix if it is there; nullopt for
// an error that does not start with a kind of the table.
std::optional<ErrorKind> parse_error_kind(std::string_view error);

}  // namespace fy::netlog
