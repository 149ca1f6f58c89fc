// What may be said about a credential: never the value. These helpers shape
// minter failures for the box (the 502 body) and paths for the Network Log.
#pragma once

#include <string>
#include <string_view>

namespace fy::inject {

// Replaces every run of 20 or more token characters ([A-Za-z0-9_+/=.-]) with
// "‹redacted›": what a token looks like, in whatever a minter printed.
std::string redact_tokens(std::string_view s);

// The last `lines` non-empty lines of `text`, redacted, at most `max` bytes.
std::string stderr_tail(std::string_view text, size_t lines = 3, size_t max = 500);

// Replaces (or adds) the query parameter `name` of a request target with
// `value` (percent-encoded). Every occurrence of the parameter is removed,
// including percent-encoded spellings of its name.
std::string set_query_param(std::string_view target, std::string_view name, std::string_view value);

// The target with the value of parameter `name` (any spelling) replaced by
// "‹redacted›", for the Network Log.
std::string redact_query_param(std::string_view target, std::string_view name);

std::string percent_decode(std::string_view s);
std::string percent_encode(std::string_view s);

}  // namespace fy::inject
