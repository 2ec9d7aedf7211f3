// JSON string escaping and number formatting shared by every hand-written JSON writer.
#include "teraio/json_text.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <iterator>

#include "teraio/error.h"

namespace teraio {

void append_json_quoted(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

std::string json_quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  append_json_quoted(out, s);
  return out;
}

void append_json_number(std::string& out, double v, std::string_view what) {
  TERAIO_INTERNAL_ASSERT(std::isfinite(v), "{} is {}, which JSON cannot hold", what, v);
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    fmt::format_to(std::back_inserter(out), "{}", static_cast<int64_t>(v));
  } else {
    fmt::format_to(std::back_inserter(out), "{}", v);
  }
}

std::string json_number(double v, std::string_view what) {
  std::string out;
  append_json_number(out, v, what);
  return out;
}

}  // namespace teraio
