// Reader of a measured run (format teraio.run v1, docs/report.md): the few numbers the report sets
// beside the simulator's prediction. Small documents, so nlohmann/json (docs/dependencies.md).
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "teraio/error.h"
#include "teraio/report.h"

namespace teraio {
namespace {

using Json = nlohmann::json;

double number(const Json& obj, const char* key, std::string_view where) {
  auto it = obj.find(key);
  TERAIO_CHECK(it != obj.end(), "{}: missing key '{}'", where, key);
  TERAIO_CHECK(it->is_number(), "{}.{}: expected a number", where, key);
  const double v = it->get<double>();
  TERAIO_CHECK(std::isfinite(v) && v >= 0, "{}.{}: expected a non-negative number, got {}", where,
               key, v);
  return v;
}

uint64_t byte_count(const Json& obj, const char* key, std::string_view where) {
  const double v = number(obj, key, where);
  TERAIO_CHECK(v < 1.8e19, "{}.{}: {} bytes is out of range", where, key, v);
  return static_cast<uint64_t>(std::llround(v));
}

}  // namespace

RunMeasurement parse_run(std::string_view json, std::string_view source) {
  Json j;
  try {
    j = Json::parse(json.begin(), json.end());
  } catch (const Json::exception& e) {
    throw Error(fmt::format("{}: not valid JSON ({})", source, e.what()));
  }
  TERAIO_CHECK(j.is_object(), "{}: expected a JSON object", source);
  auto fmt_it = j.find("format");
  TERAIO_CHECK(
      fmt_it != j.end() && fmt_it->is_string() && fmt_it->get<std::string>() == "teraio.run",
      "{}: \"format\" must be \"teraio.run\"", source);
  auto ver_it = j.find("version");
  TERAIO_CHECK(ver_it != j.end() && ver_it->is_number_integer(), "{}: missing integer \"version\"",
               source);
  TERAIO_CHECK(ver_it->get<int64_t>() == 1,
               "{}: teraio.run version {} is not supported (this reader knows 1)", source,
               ver_it->get<int64_t>());

  RunMeasurement run;
  const std::string where(source);
  run.iteration_us = number(j, "iteration_us", where);
  TERAIO_CHECK(run.iteration_us > 0, "{}.iteration_us: must be positive", where);
  run.stall_us = number(j, "stall_us", where);
  TERAIO_CHECK(run.stall_us <= run.iteration_us, "{}.stall_us: {} exceeds iteration_us {}", where,
               run.stall_us, run.iteration_us);
  run.peak_bytes = byte_count(j, "peak_bytes", where);
  auto tiers = j.find("tiers");
  TERAIO_CHECK(tiers != j.end() && tiers->is_array(), "{}: missing array \"tiers\"", where);
  for (size_t i = 0; i < tiers->size(); ++i) {
    const Json& t = (*tiers)[i];
    const std::string at = fmt::format("{}.tiers[{}]", where, i);
    TERAIO_CHECK(t.is_object(), "{}: expected an object", at);
    auto name = t.find("name");
    TERAIO_CHECK(name != t.end() && name->is_string(), "{}: missing string \"name\"", at);
    run.tiers.push_back({name->get<std::string>(), byte_count(t, "offload_bytes", at),
                         byte_count(t, "prefetch_bytes", at)});
  }
  return run;
}

RunMeasurement read_run(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TERAIO_CHECK(in, "cannot open run file '{}'", path);
  std::ostringstream text;
  text << in.rdbuf();
  TERAIO_CHECK(!in.bad(), "cannot read run file '{}'", path);
  return parse_run(text.str(), path);
}

}  // namespace teraio
