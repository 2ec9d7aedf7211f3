// The tier spec syntax (include/teraio/tier_args.h): every form, the old planner form kept as an
// alias, lists, and a one-line error for each malformed spec.
#include <gtest/gtest.h>

#include <string>

#include "teraio/error.h"
#include "teraio/tier_args.h"
#include "teraio/units.h"

namespace teraio {
namespace {

using Kind = TierArg::Kind;

// The message parse_tier_arg(text) throws; fails the test when it does not throw.
std::string error_of(std::string_view text) {
  try {
    parse_tier_arg(text);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for \"" << text << "\"";
  return "";
}

TEST(TierArgs, HostForms) {
  TierArg t = parse_tier_arg("host:64GiB");
  EXPECT_EQ(t.kind, Kind::kHost);
  EXPECT_EQ(t.name, "host");
  EXPECT_FALSE(t.name_given);
  EXPECT_EQ(t.capacity_bytes, 64 * kGiB);
  EXPECT_FALSE(t.bandwidths_given());
  EXPECT_EQ(t.read_gbps, 0);
  EXPECT_TRUE(t.paths.empty());

  t = parse_tier_arg("host:1.5GB:25:20.5");
  EXPECT_EQ(t.kind, Kind::kHost);
  EXPECT_EQ(t.capacity_bytes, 1500000000u);
  EXPECT_EQ(t.read_gbps, 25);
  EXPECT_EQ(t.write_gbps, 20.5);

  t = parse_tier_arg("dram=host:4096");
  EXPECT_EQ(t.kind, Kind::kHost);
  EXPECT_EQ(t.name, "dram");
  EXPECT_TRUE(t.name_given);
  EXPECT_EQ(t.capacity_bytes, 4096u);
}

TEST(TierArgs, FileForms) {
  TierArg t = parse_tier_arg("file:/mnt/nvme0:500GiB");
  EXPECT_EQ(t.kind, Kind::kFile);
  EXPECT_EQ(t.name, "file");
  EXPECT_EQ(t.paths, std::vector<std::string>{"/mnt/nvme0"});
  EXPECT_EQ(t.capacity_bytes, 500 * kGiB);
  EXPECT_FALSE(t.bandwidths_given());

  t = parse_tier_arg("nvme=file:/mnt/nvme0,/mnt/nvme1,rel/dir:2TiB:6.5:6");
  EXPECT_EQ(t.kind, Kind::kFile);
  EXPECT_EQ(t.name, "nvme");
  EXPECT_EQ(t.paths, (std::vector<std::string>{"/mnt/nvme0", "/mnt/nvme1", "rel/dir"}));
  EXPECT_EQ(t.capacity_bytes, 2 * kTiB);
  EXPECT_EQ(t.read_gbps, 6.5);
  EXPECT_EQ(t.write_gbps, 6);
  EXPECT_EQ(t.text, "nvme=file:/mnt/nvme0,/mnt/nvme1,rel/dir:2TiB:6.5:6");

  // '=' inside a directory is part of the directory.
  t = parse_tier_arg("file:/tmp/a=b:1GiB");
  EXPECT_EQ(t.paths, std::vector<std::string>{"/tmp/a=b"});
}

TEST(TierArgs, OldNamedFormIsAnAlias) {
  TierArg t = parse_tier_arg("ssd:2TiB:6.5:6");
  EXPECT_EQ(t.kind, Kind::kNamed);
  EXPECT_EQ(t.name, "ssd");
  EXPECT_TRUE(t.name_given);
  EXPECT_EQ(t.capacity_bytes, 2 * kTiB);
  EXPECT_EQ(t.read_gbps, 6.5);
  EXPECT_EQ(t.write_gbps, 6);

  // The old form with the name host is the host form with bandwidths: same name, same numbers.
  t = parse_tier_arg("host:64GiB:50:50");
  EXPECT_EQ(t.kind, Kind::kHost);
  EXPECT_EQ(t.name, "host");
  EXPECT_EQ(t.read_gbps, 50);

  // A tier named file in the old form: its second field is a size, not a directory.
  t = parse_tier_arg("file:1TiB:2:3");
  EXPECT_EQ(t.kind, Kind::kNamed);
  EXPECT_EQ(t.name, "file");
  EXPECT_EQ(t.capacity_bytes, kTiB);
  EXPECT_EQ(t.write_gbps, 3);

  // Names the old form allowed stay allowed, '=' and quotes included.
  EXPECT_EQ(parse_tier_arg("a=b:1GiB:1:1").name, "a=b");
  EXPECT_EQ(parse_tier_arg(R"(my "ssd"\1:1TiB:1:1)").name, R"(my "ssd"\1)");
}

TEST(TierArgs, BothWaysBandwidthIsAnOptionalFifthFigure) {
  // BOTH_GBPS after the pair: per direction while reads and writes move at once.
  TierArg t = parse_tier_arg("host:64GiB:55.2:55.1:49.6");
  EXPECT_EQ(t.kind, Kind::kHost);
  EXPECT_EQ(t.read_gbps, 55.2);
  EXPECT_EQ(t.write_gbps, 55.1);
  EXPECT_EQ(t.duplex_gbps, 49.6);
  EXPECT_EQ(parse_tier_arg("host:64GiB:55.2:55.1").duplex_gbps, 0);  // not given
  t = parse_tier_arg("file:/a,/b:1TiB:6:5:4");
  EXPECT_EQ(t.kind, Kind::kFile);
  EXPECT_EQ(t.paths, (std::vector<std::string>{"/a", "/b"}));
  EXPECT_EQ(t.duplex_gbps, 4);
  t = parse_tier_arg("ssd:2TiB:6.5:6:3");
  EXPECT_EQ(t.kind, Kind::kNamed);
  EXPECT_EQ(t.duplex_gbps, 3);
  EXPECT_NE(error_of("host:64GiB:5:5:0").find("both-ways GB/s"), std::string::npos);
  EXPECT_NE(error_of("host:64GiB:5:5:x").find("both-ways GB/s"), std::string::npos);
  EXPECT_NE(error_of("host:64GiB:5:5:4:3").find("a host tier is"), std::string::npos);
}

TEST(TierArgs, Lists) {
  std::vector<TierArg> l = parse_tier_arg_list("host:64GiB,file:/mnt/nvme:500GiB");
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[0].kind, Kind::kHost);
  EXPECT_EQ(l[1].kind, Kind::kFile);
  EXPECT_EQ(l[1].paths, std::vector<std::string>{"/mnt/nvme"});
  EXPECT_EQ(l[1].text, "file:/mnt/nvme:500GiB");

  // A file tier's directory list keeps its commas; the tier after it starts a new spec.
  l = parse_tier_arg_list("f=file:/a,/b:1TiB:3:3,ssd:2TiB:1:1,host:1GiB");
  ASSERT_EQ(l.size(), 3u);
  EXPECT_EQ(l[0].paths, (std::vector<std::string>{"/a", "/b"}));
  EXPECT_EQ(l[0].name, "f");
  EXPECT_EQ(l[1].name, "ssd");
  EXPECT_EQ(l[1].kind, Kind::kNamed);
  EXPECT_EQ(l[2].kind, Kind::kHost);

  EXPECT_EQ(parse_tier_arg_list("host:1GiB").size(), 1u);
  EXPECT_THROW(parse_tier_arg_list("host:1GiB,"), Error);
  EXPECT_THROW(parse_tier_arg_list(",host:1GiB"), Error);
  EXPECT_THROW(parse_tier_arg_list("file:/a,/b"), Error);  // no capacity
  EXPECT_THROW(parse_tier_arg_list(""), Error);
}

TEST(TierArgs, MalformedSpecsSayWhatIsExpected) {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"", "--tier: an empty tier spec; expected host:CAPACITY"},
      {"ssd", "--tier \"ssd\": expected host:CAPACITY[:READ_GBPS:WRITE_GBPS[:BOTH_GBPS]], file:DIR"},
      {"ssd:2TiB:6.5", "--tier \"ssd:2TiB:6.5\": expected host:CAPACITY"},
      {":2TiB:1:6", "--tier \":2TiB:1:6\": the tier name is empty"},
      {"host", "--tier \"host\": a host tier is [NAME=]host:CAPACITY[:READ_GBPS:WRITE_GBPS[:BOTH_GBPS]]"},
      {"host:1GiB:5", "--tier \"host:1GiB:5\": a host tier is [NAME=]host:CAPACITY"},
      {"host:1GiB:5:5:5:5", "a host tier is"},
      {"file:1GiB", "--tier \"file:1GiB\": a file tier is [NAME=]file:DIR[,DIR...]:CAPACITY"},
      {"file:/mnt/a:1GiB:5", "--tier \"file:/mnt/a:1GiB:5\": a file tier is"},
      {"x=file:1TiB:6:6", "a file tier is"},
      {"file:/a,,/b:1GiB",
       "--tier \"file:/a,,/b:1GiB\": an empty directory in the list \"/a,,/b\""},
      {"file::1GiB", "an empty directory in the list \"\""},
      {"=host:1GiB", "--tier \"=host:1GiB\": the name before '=' is empty"},
      {"host:64XB", "--tier \"host:64XB\" capacity: '64XB' has an unknown unit"},
      {"host:0", "--tier \"host:0\": the capacity must be positive"},
      {"host:1GiB:0:5", "--tier \"host:1GiB:0:5\" read GB/s"},
      {"ssd:1TiB:5:-1", "--tier \"ssd:1TiB:5:-1\" write GB/s"},
      {"file:/a:1GiB:fast:5", "read GB/s"},
  };
  for (const Case& c : cases) {
    const std::string msg = error_of(c.text);
    EXPECT_NE(msg.find(c.message), std::string::npos) << c.text << " -> " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << c.text << " -> " << msg;
  }
  // The option name comes from the caller.
  try {
    parse_tier_arg("nope", "parse_tiers");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("parse_tiers \"nope\": expected", 0), 0u) << e.what();
  }
}

TEST(TierArgs, SessionTiers) {
  EXPECT_NO_THROW(check_session_tier(parse_tier_arg("host:1GiB")));
  EXPECT_NO_THROW(check_session_tier(parse_tier_arg("host:1GiB:20:20")));
  EXPECT_NO_THROW(check_session_tier(parse_tier_arg("file=file:/a:1GiB")));
  try {
    check_session_tier(parse_tier_arg("ssd:1TiB:5:5"));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is for planning only"), std::string::npos) << e.what();
  }
  try {
    check_session_tier(parse_tier_arg("fast=file:/a:1GiB"));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("drop \"fast=\""), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace teraio
