// Helpers shared by the plan-checking and format tests of tests/trace: check_plan on a trace's own
// lifetimes, all of a check's errors as one string, and the error a reader gives for an edited
// JSON text.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "teraio/analysis.h"
#include "teraio/error.h"
#include "teraio/plan_check.h"
#include "teraio/trace.h"

namespace teraio::test {

inline PlanCheck check(const Trace& t, const Plan& p) { return check_plan(t, Lifetimes(t), p); }

inline std::string all_errors(const PlanCheck& c) {
  std::string s;
  for (const auto& e : c.errors) s += e + "\n";
  return s;
}

// The message `parse` (parse_plan or parse_trace with a file name) throws for `json` with the first
// `from` replaced by `to`; "no error" when it accepts the text.
template <class Parse>
std::string reader_error(const std::string& json, const std::string& from, const std::string& to,
                         Parse parse) {
  std::string text = json;
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at == std::string::npos) return "no such text";
  text.replace(at, from.size(), to);
  try {
    parse(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace teraio::test
