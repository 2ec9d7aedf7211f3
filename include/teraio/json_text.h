// Writing JSON text by hand (the commands' --json output, the formats' writers): one escaping
// routine for every writer, so a name with a quote or a control character never breaks a file, and
// one number writer, so inf or NaN never reaches a file (JSON has no such numbers).
#pragma once

#include <string>
#include <string_view>

namespace teraio {

// `s` as a JSON string literal, quotes included.
std::string json_quote(std::string_view s);
// Appends json_quote(s) to `out`.
void append_json_quoted(std::string& out, std::string_view s);

// `v` as a JSON number: integers below 1e15 without a fraction, others in the shortest form that
// reads back to the same double. A non-finite `v` is a bug of the caller (inputs are checked when
// read: docs/formats.md) and throws teraio::InternalError naming `what`.
std::string json_number(double v, std::string_view what = "a number");
void append_json_number(std::string& out, double v, std::string_view what = "a number");

}  // namespace teraio
