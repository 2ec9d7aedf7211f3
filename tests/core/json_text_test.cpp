// Tests of the JSON text helpers: escaping of every string, and numbers that are never inf or NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "teraio/error.h"
#include "teraio/json_text.h"

namespace teraio {
namespace {

TEST(JsonText, QuotesAndEscapes) {
  EXPECT_EQ(json_quote("my \"ssd\"\\\n\t\x01"), "\"my \\\"ssd\\\"\\\\\\n\\t\\u0001\"");
}

TEST(JsonText, NumbersAreIntegersOrShortestDoubles) {
  EXPECT_EQ(json_number(0), "0");
  EXPECT_EQ(json_number(-0.0), "0");
  EXPECT_EQ(json_number(1234), "1234");
  EXPECT_EQ(json_number(0.1), "0.1");
  EXPECT_EQ(json_number(1e300), "1e+300");
}

TEST(JsonText, NonFiniteNumbersAreBugsNotOutput) {
  EXPECT_THROW(json_number(std::numeric_limits<double>::infinity(), "x"), InternalError);
  EXPECT_THROW(json_number(std::nan(""), "x"), InternalError);
}

}  // namespace
}  // namespace teraio
