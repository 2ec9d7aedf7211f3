// Writing JSON text by hand (the commands' --json output, the formats' writers): one escaping
// routine for every writer, so a name with a quote or a control character never breaks a file.
#pragma once

#include <string>
#include <string_view>

namespace teraio {

// `s` as a JSON string literal, quotes included.
std::string json_quote(std::string_view s);
// Appends json_quote(s) to `out`.
void append_json_quoted(std::string& out, std::string_view s);

}  // namespace teraio
