// Typed access to simdjson's DOM with precise error messages; file loading.
#include "json_util.h"

#include <cerrno>
#include <cmath>
#include <cstring>

namespace teraio::json {

std::string_view type_name(simdjson::dom::element_type t) {
  using T = simdjson::dom::element_type;
  switch (t) {
    case T::ARRAY: return "an array";
    case T::OBJECT: return "an object";
    case T::INT64:
    case T::UINT64: return "an integer";
    case T::DOUBLE: return "a number";
    case T::STRING: return "a string";
    case T::BOOL: return "a boolean";
    case T::NULL_VALUE: return "null";
  }
  return "a value";
}

void Reader::fail(const Path& path, std::string_view what) const {
  throw Error(fmt::format("{}: {}: {}", source_, path.str(), what));
}

simdjson::dom::object Reader::object(simdjson::dom::element e, const Path& p) const {
  simdjson::dom::object o;
  if (e.get_object().get(o)) fail(p, fmt::format("expected an object, got {}", type_name(e.type())));
  return o;
}

simdjson::dom::array Reader::array(simdjson::dom::element e, const Path& p) const {
  simdjson::dom::array a;
  if (e.get_array().get(a)) fail(p, fmt::format("expected an array, got {}", type_name(e.type())));
  return a;
}

simdjson::dom::element Reader::field(simdjson::dom::object o, std::string_view key,
                                     const Path& p) const {
  simdjson::dom::element e;
  if (o.at_key(key).get(e)) fail(p.field(key), "required field is missing");
  return e;
}

bool Reader::has(simdjson::dom::object o, std::string_view key) const {
  simdjson::dom::element e;
  return !o.at_key(key).get(e);
}

uint64_t Reader::u64(simdjson::dom::element e, const Path& p) const {
  using T = simdjson::dom::element_type;
  switch (e.type()) {
    case T::UINT64: return e.get_uint64().value_unsafe();
    case T::INT64: {
      const int64_t v = e.get_int64().value_unsafe();
      if (v < 0) fail(p, fmt::format("must be >= 0, got {}", v));
      return static_cast<uint64_t>(v);
    }
    case T::DOUBLE: {
      const double v = e.get_double().value_unsafe();
      if (!(v >= 0)) fail(p, fmt::format("must be >= 0, got {}", v));
      if (v != std::floor(v) || v >= 0x1p64) fail(p, fmt::format("must be a whole number, got {}", v));
      return static_cast<uint64_t>(v);
    }
    default: fail(p, fmt::format("expected an integer, got {}", type_name(e.type())));
  }
}

double Reader::number(simdjson::dom::element e, const Path& p) const {
  double v = 0;
  if (e.get_double().get(v)) fail(p, fmt::format("expected a number, got {}", type_name(e.type())));
  if (!std::isfinite(v)) fail(p, "must be finite");
  return v;
}

double Reader::non_negative(simdjson::dom::element e, const Path& p) const {
  const double v = number(e, p);
  if (v < 0) fail(p, fmt::format("must be >= 0, got {}", v));
  return v;
}

std::string_view Reader::string(simdjson::dom::element e, const Path& p) const {
  std::string_view s;
  if (e.get_string().get(s)) fail(p, fmt::format("expected a string, got {}", type_name(e.type())));
  return s;
}

bool Reader::boolean(simdjson::dom::element e, const Path& p) const {
  bool b = false;
  if (e.get_bool().get(b)) fail(p, fmt::format("expected true or false, got {}", type_name(e.type())));
  return b;
}

uint64_t Reader::header(simdjson::dom::object root, std::string_view format, uint64_t max_version) const {
  const Path top;
  Path fp = top.field("format");
  const std::string_view f = string(field(root, "format", top), fp);
  if (f != format) fail(fp, fmt::format("expected \"{}\", got \"{}\"", format, f));
  Path vp = top.field("version");
  const uint64_t v = u64(field(root, "version", top), vp);
  if (v < 1 || v > max_version) {
    fail(vp, max_version == 1
                 ? fmt::format("unsupported version {} (this teraio reads {} version 1)", v, format)
                 : fmt::format("unsupported version {} (this teraio reads {} versions 1 to {})", v, format,
                               max_version));
  }
  return v;
}

simdjson::dom::element parse_document(simdjson::dom::parser& parser, std::string_view text,
                                      std::string_view source) {
  simdjson::dom::element doc;
  auto err = parser.parse(text.data(), text.size(), /*realloc_if_needed=*/true).get(doc);
  if (err) {
    throw Error(fmt::format("{}: not valid JSON ({}){}", source, simdjson::error_message(err),
                            err == simdjson::TAPE_ERROR || err == simdjson::INCOMPLETE_ARRAY_OR_OBJECT
                                ? "; the file may be truncated"
                                : ""));
  }
  if (doc.type() != simdjson::dom::element_type::OBJECT) {
    throw Error(fmt::format("{}: expected a JSON object at the top level, got {}", source,
                            type_name(doc.type())));
  }
  return doc;
}

simdjson::padded_string load_file(const std::string& path) {
  simdjson::padded_string text;
  auto err = simdjson::padded_string::load(path).get(text);
  if (err) {
    throw Error(fmt::format("{}: cannot read ({})", path,
                            errno ? std::strerror(errno) : simdjson::error_message(err)));
  }
  return text;
}

}  // namespace teraio::json
