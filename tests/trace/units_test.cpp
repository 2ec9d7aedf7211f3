// Size parsing as every command's options use it.
#include <gtest/gtest.h>

#include "teraio/error.h"
#include "teraio/units.h"

namespace teraio {
namespace {

TEST(Units, ParsesSizes) {
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_EQ(parse_size("40GiB"), 40ull << 30);
  EXPECT_EQ(parse_size("512MiB"), 512ull << 20);
  EXPECT_EQ(parse_size("512mib"), 512ull << 20);
  EXPECT_EQ(parse_size("1.5GB"), 1500000000ull);
  EXPECT_EQ(parse_size("2TiB"), 2ull << 40);
  EXPECT_EQ(parse_size("0.5KiB"), 512u);
  EXPECT_EQ(parse_size("7B"), 7u);
}

TEST(Units, RejectsBadSizesNamingTheOption) {
  for (const char* bad : {"", "GiB", "-1GiB", "12XB", "0.3B", "1e30TiB", "1.2.3GiB"}) {
    try {
      parse_size(bad, "--budget");
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--budget"), std::string::npos) << e.what();
    }
  }
}

TEST(Units, SplitFieldsKeepsEmptyFields) {
  using V = std::vector<std::string_view>;
  EXPECT_EQ(split_fields("3:EIO:write", ':'), (V{"3", "EIO", "write"}));
  EXPECT_EQ(split_fields("a::b:", ':'), (V{"a", "", "b", ""}));
  EXPECT_EQ(split_fields("", ','), (V{""}));
  EXPECT_EQ(split_fields("/a,/b", ','), (V{"/a", "/b"}));
}

TEST(Units, FormatsForPeople) {
  EXPECT_EQ(format_bytes(1536.0 * (1 << 20)), "1.50 GiB");
  EXPECT_EQ(format_bytes(100), "100 B");
  EXPECT_EQ(format_us(1500), "1.50 ms");
}

}  // namespace
}  // namespace teraio
