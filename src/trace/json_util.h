// Private helpers for the v1 JSON readers: typed field access over a simdjson DOM with errors that
// name the source, the field path and what was expected. The writers use teraio/json_text.h and
// teraio/output_file.h.
#pragma once

#include <simdjson.h>

#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "teraio/error.h"

namespace teraio::json {

// Where a value sits: "tensors[3].bytes". Built only when an error is thrown.
struct Path {
  const Path* parent = nullptr;
  std::string_view key;  // field name, or empty for an array element
  size_t index = 0;

  std::string str() const {
    if (parent == nullptr) return std::string(key);  // the document itself: ""
    std::string out = parent->str();
    if (!key.empty()) {
      if (!out.empty()) out += '.';
      out += key;
    } else {
      out += fmt::format("[{}]", index);
    }
    return out;
  }
  Path field(std::string_view k) const { return Path{this, k, 0}; }
  Path at(size_t i) const { return Path{this, {}, i}; }
};

std::string_view type_name(simdjson::dom::element_type t);

class Reader {
 public:
  explicit Reader(std::string_view source) : source_(source) {}

  [[noreturn]] void fail(const Path& path, std::string_view what) const;

  simdjson::dom::object object(simdjson::dom::element e, const Path& p) const;
  simdjson::dom::array array(simdjson::dom::element e, const Path& p) const;
  // Field of an object; required fields throw when missing.
  simdjson::dom::element field(simdjson::dom::object o, std::string_view key, const Path& p) const;
  bool has(simdjson::dom::object o, std::string_view key) const;
  uint64_t u64(simdjson::dom::element e, const Path& p) const;  // integer >= 0 (or integral double)
  double number(simdjson::dom::element e, const Path& p) const;  // finite
  double non_negative(simdjson::dom::element e, const Path& p) const;
  std::string_view string(simdjson::dom::element e, const Path& p) const;
  bool boolean(simdjson::dom::element e, const Path& p) const;
  // Checks "format" and "version" (1..max_version) of a document; returns the version.
  uint64_t header(simdjson::dom::object root, std::string_view format, uint64_t max_version) const;

  std::string_view source() const { return source_; }

 private:
  std::string_view source_;
};

// Parses `text` into `parser`'s DOM, throwing a teraio::Error naming the source on bad JSON.
simdjson::dom::element parse_document(simdjson::dom::parser& parser, std::string_view text,
                                      std::string_view source);
// Reads a whole file into a padded string, throwing teraio::Error naming the path.
simdjson::padded_string load_file(const std::string& path);

}  // namespace teraio::json
