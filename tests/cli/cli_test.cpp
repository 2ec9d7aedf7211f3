// Faults and bad input at the command line (issue 13): every command on empty traces, strings that
// need escaping, outputs that cannot be written (a file size limit, /dev/full, a full stdout),
// traces beyond the format's bounds, out-of-range numbers, and `teraio clean`. Each case ends in a
// valid result or one line of error and a documented exit status, never a crash or a partial file.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/files.h"
#include "../common/run_teraio.h"

namespace teraio {
namespace {

namespace fs = std::filesystem;
using test::CmdResult;
using test::put;
using test::run_teraio;
using test::slurp;

size_t lines(const std::string& s) {
  return static_cast<size_t>(std::count(s.begin(), s.end(), '\n'));
}

// An error: status 1 and exactly one line, "teraio: error: ..." holding `text`.
void expect_one_line_error(const CmdResult& r, const std::string& text, const std::string& what) {
  EXPECT_EQ(r.status, 1) << what << "\n" << r.out;
  EXPECT_EQ(lines(r.out), 1u) << what << "\n" << r.out;
  EXPECT_TRUE(r.out.starts_with("teraio: error: ")) << what << "\n" << r.out;
  EXPECT_NE(r.out.find(text), std::string::npos) << what << ": expected '" << text << "' in\n"
                                                 << r.out;
}

std::string trace_json(const std::string& tensors, const std::string& kernels) {
  return R"({"format": "teraio.trace", "version": 1, "tensors": [)" + tensors +
         R"(], "kernels": [)" + kernels + "]}";
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("teraio_cli_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    trace_ = path("tiny.json");
    const CmdResult r = run_teraio("synth --model tiny -o " + trace_);
    ASSERT_EQ(r.status, 0) << r.out;
    plan_ = path("tiny.plan.json");
    const CmdResult p =
        run_teraio("plan " + trace_ + " --budget 1536KiB --tier ssd:1TiB:1:1 -o " + plan_);
    ASSERT_EQ(p.status, 0) << p.out;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  fs::path dir_;
  std::string trace_, plan_;
};

TEST_F(Cli, EveryCommandHandlesTracesWithoutKernelsOrTensors) {
  const std::string tensor = R"({"id": 0, "bytes": 100, "kind": "parameter", "persistent": true})";
  const std::string kernel = R"({"name": "k", "time_us": 1, "tensors": []})";
  put(path("no_kernels.json"), trace_json(tensor, ""));
  put(path("no_tensors.json"), trace_json("", kernel));
  put(path("empty.json"), trace_json("", ""));
  for (const std::string name : {"no_kernels", "no_tensors", "empty"}) {
    const std::string t = path(name + ".json");
    const std::string p = path(name + ".plan.json");
    // plan: a valid empty plan (it crashed with SIGSEGV after writing the plan on 0 kernels).
    CmdResult r = run_teraio("plan " + t + " --budget 1GiB --tier ssd:1TiB:1:1 -o " + p);
    ASSERT_EQ(r.signal, 0) << name << r.out;
    ASSERT_EQ(r.status, 0) << name << r.out;
    const auto plan = nlohmann::json::parse(slurp(p));
    EXPECT_TRUE(plan["moves"].empty()) << name;
    r = run_teraio("plan " + t + " --budget 1GiB --tier ssd:1TiB:1:1 -o " + p + " --json");
    ASSERT_EQ(r.status, 0) << name << r.out;
    EXPECT_NO_THROW(nlohmann::json::parse(r.out)) << r.out;
    const std::string commands[] = {
        "analyze " + t,
        "analyze " + t + " --json",
        "simulate " + t + " " + p,
        "simulate " + t + " " + p + " --json",
        "simulate " + t + " " + p + " --sweep-bandwidth --sweep-steps 2 --json",
        "report " + t + " -o " + path("r.html"),
        "report " + t + " --plan " + p + " -o " + path("r.html"),
        "exact " + t + " --budget 1GiB --tier ssd:1TiB:1:1 -o " + path("e.json"),
        "exact " + t + " --budget 1GiB --tier ssd:1TiB:1:1 -o " + path("e.json") + " --json",
        "transform " + t + " --step-in-backward -o " + path("x.json"),
    };
    for (const std::string& c : commands) {
      r = run_teraio(c);
      EXPECT_EQ(r.signal, 0) << c << "\n" << r.out;
      if (r.status == 0) {
        if (c.ends_with("--json")) {
          EXPECT_NO_THROW(nlohmann::json::parse(r.out)) << c << "\n" << r.out;
        }
      } else {
        expect_one_line_error(r, "", c);
      }
    }
  }
}

TEST_F(Cli, TierNamesAreEscapedInEveryJsonAndDuplicatesAreRefused) {
  const std::string p = path("q.plan.json");
  CmdResult r = run_teraio("plan " + trace_ +
                           R"( --budget 1536KiB --tier 'my "ssd"\1:1TiB:1:1' -o )" + p + " --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto summary = nlohmann::json::parse(r.out);
  EXPECT_EQ(summary["plan"], p);
  EXPECT_TRUE(summary["planner"]["offload_bytes_per_tier"].contains(R"(my "ssd"\1)")) << r.out;
  const auto plan = nlohmann::json::parse(slurp(p));
  EXPECT_EQ(plan["tiers"][0]["name"], R"(my "ssd"\1)");
  EXPECT_TRUE(plan["planner"]["offload_bytes_per_tier"].contains(R"(my "ssd"\1)"));
  r = run_teraio("simulate " + trace_ + " " + p + " --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["tiers"][0]["name"], R"(my "ssd"\1)");
  r = run_teraio("exact " + path("none.json") +
                 " --budget 1GiB --tier 'a:1TiB:1:1' --tier a:1GiB:2:2 -o " + p);
  expect_one_line_error(r, "--tier: two tiers are named \"a\"", "exact duplicate tiers");
  r = run_teraio("plan " + trace_ + " --budget 1GiB --tier 'a:1TiB:1:1' --tier a:1GiB:2:2 -o " + p);
  expect_one_line_error(r, "--tier: two tiers are named \"a\"", "plan duplicate tiers");
  const std::string s = path("study.json");
  r = run_teraio(
      "study gap --instances 1 --max-layers 1 --time-limit 10 --tier 'x\"y:1TiB:6.5:6.5' --json " +
      s);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(slurp(s))["tiers"][0], "x\"y:1TiB:6.5:6.5");
}

// The tier specs of docs/formats.md: the host and file forms, NAME=, lists and the old form plan
// alike (a train spec with bandwidths plans as written); one without bandwidths is refused.
TEST_F(Cli, PlanTakesEveryTierSpecForm) {
  const std::string p = path("forms.plan.json");
  const std::string d = path("");
  CmdResult r = run_teraio("plan " + trace_ + " --budget 1536KiB --tier host:4MiB:2:3,nvme=file:" + d +
                           "," + d + ":1TiB:1:1 --tier ssd:1TiB:1:1 -o " + p);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto plan = nlohmann::json::parse(slurp(p));
  ASSERT_EQ(plan["tiers"].size(), 3u);
  EXPECT_EQ(plan["tiers"][0]["name"], "host");
  EXPECT_EQ(plan["tiers"][0]["capacity_bytes"], 4u << 20);
  EXPECT_EQ(plan["tiers"][0]["read_gbps"], 2.0);
  EXPECT_EQ(plan["tiers"][0]["write_gbps"], 3.0);
  EXPECT_EQ(plan["tiers"][1]["name"], "nvme");
  EXPECT_EQ(plan["tiers"][2]["name"], "ssd");
  // One --tier per spec is the same plan.
  const std::string q = path("forms2.plan.json");
  r = run_teraio("plan " + trace_ + " --budget 1536KiB --tier host:4MiB:2:3 --tier nvme=file:" + d +
                 "," + d + ":1TiB:1:1 --tier ssd:1TiB:1:1 -o " + q);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(slurp(q))["moves"], plan["moves"]);

  r = run_teraio("plan " + trace_ + " --budget 1536KiB --tier host:64GiB -o " + p);
  expect_one_line_error(r, "--tier \"host:64GiB\": planning needs the tier's bandwidths; append "
                           ":READ_GBPS:WRITE_GBPS", "plan without bandwidths");
  r = run_teraio("exact " + path("none.json") + " --budget 1GiB --tier host:1GiB:5 -o " + p);
  expect_one_line_error(r, "--tier \"host:1GiB:5\": a host tier is [NAME=]host:CAPACITY",
                        "exact malformed tier");
  r = run_teraio("plan " + trace_ + " --budget 1GiB --tier host:1GiB:1:1,file:/a:1GiB:1:1 -o " + p +
                 " --tier file=host:1GiB:1:1");
  expect_one_line_error(r, "--tier: two tiers are named \"file\"", "a named tier and a file tier");
  r = run_teraio("study gap --instances 1 --tier host:1GiB --json " + p);
  expect_one_line_error(r, "planning needs the tier's bandwidths", "study without bandwidths");
}

// Recompute end to end (docs/planner.md, "Recompute"): synth writes a v2 trace with recomputable
// activations (v1 with --no-recompute-info), plan recomputes at a tight budget and writes a v2 plan
// (none with --no-recompute: v1), simulate reports the recomputes and their time.
TEST_F(Cli, PlanRecomputesUnlessToldNotTo) {
  const std::string t = path("l1.json"), t1 = path("l1v1.json");
  ASSERT_EQ(run_teraio("synth --model llama-1b --batch 1 --micro-batches 1 --seq 2048 -o " + t).status, 0);
  EXPECT_EQ(nlohmann::json::parse(slurp(t))["version"], 2);
  {
    // Compared as the planner plans: without clean offloads, which it does not model
    // (docs/planner.md).
    auto j = nlohmann::json::parse(slurp(t));
    EXPECT_EQ(j["writes_recorded"], true);
    j.erase("writes_recorded");
    for (auto& tensor : j["tensors"]) tensor.erase("written_at");
    test::put(t, j.dump());
  }
  ASSERT_EQ(run_teraio("synth --model llama-1b --batch 1 --micro-batches 1 --seq 2048 --no-recompute-info -o " + t1)
                .status,
            0);
  EXPECT_EQ(nlohmann::json::parse(slurp(t1))["version"], 1);
  const std::string budget = " --budget 7557167136 --tier host:64GiB:55:55 --json -o ";  // 1/4 of the peak
  CmdResult r = run_teraio("plan " + t + budget + path("r.json"));
  ASSERT_EQ(r.status, 0) << r.out;
  const auto with = nlohmann::json::parse(r.out);
  EXPECT_GT(with["planner"]["recomputes"].get<int>(), 0) << r.out;
  const auto plan = nlohmann::json::parse(slurp(path("r.json")));
  EXPECT_EQ(plan["version"], 2);
  r = run_teraio("plan " + t + budget + path("n.json") + " --no-recompute");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto without = nlohmann::json::parse(r.out);
  EXPECT_FALSE(without["planner"].contains("recomputes"));
  EXPECT_EQ(nlohmann::json::parse(slurp(path("n.json")))["version"], 1);
  // What recompute buys: activations made again instead of moved, so fewer bytes cross the link
  // (the floor's link time: 605 against 665 ms). Which plan replays faster is the search's to find
  // (985 and 975 ms without --search, issued as the Session issues them).
  EXPECT_LT(with["floor_us"].get<double>(), without["floor_us"].get<double>());
  EXPECT_LT(with["bytes_by_kind"]["activation"]["offload_bytes"].get<double>(),
            without["bytes_by_kind"]["activation"]["offload_bytes"].get<double>());
  r = run_teraio("plan " + t1 + budget + path("v1.json"));  // a v1 trace: nothing to recompute
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_FALSE(nlohmann::json::parse(r.out)["planner"].contains("recomputes"));
  r = run_teraio("simulate " + t + " " + path("r.json") + " --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto sim = nlohmann::json::parse(r.out);
  EXPECT_EQ(sim["recomputes"], with["planner"]["recomputes"]);
  EXPECT_GT(sim["recompute_us"].get<double>(), 0);
}

// --session-budget plans for what a CUDA Session given that budget plans for: the budget less
// 1/32 (Note [Budget policy]). (`exact` shares the option through PlanningArgs.)
TEST_F(Cli, SessionBudgetPlansForTheSessionsShare) {
  const std::string t = path("sb.json");
  ASSERT_EQ(run_teraio("synth --model tiny -o " + t).status, 0);
  const uint64_t budget = 1600000;  // under the peak (2.1 MiB)
  const std::string args = " --budget " + std::to_string(budget) + " --tier host:1GiB:10:10 --json -o ";
  for (const char* cmd : {"plan ", "plan --search "}) {
    CmdResult r = run_teraio(cmd + t + args + path("a.json"));
    ASSERT_EQ(r.status, 0) << cmd << r.out;
    EXPECT_EQ(nlohmann::json::parse(slurp(path("a.json")))["budget_bytes"], budget) << cmd;
    r = run_teraio(cmd + t + args + path("b.json") + " --session-budget");
    ASSERT_EQ(r.status, 0) << cmd << r.out;
    EXPECT_EQ(nlohmann::json::parse(slurp(path("b.json")))["budget_bytes"], budget - budget / 32) << cmd;
  }
}

// teraio transform (docs/transform.md): the rewritten trace plans and simulates; the change must be
// named; a trace already rewritten is refused.
TEST_F(Cli, TransformWritesATraceThatPlansAndRefusesMisuse) {
  const std::string x = path("x.json"), p = path("x.plan.json");
  CmdResult r = run_teraio("transform " + trace_ + " --step-in-backward -o " + x);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("the updates of 21 parameters moved into the backward (0 kept after it)"),
            std::string::npos)
      << r.out;
  r = run_teraio("plan " + x + " --budget 1536KiB --tier ssd:1TiB:1:1 -o " + p);
  ASSERT_EQ(r.status, 0) << r.out;
  r = run_teraio("simulate " + x + " " + p + " --json");
  ASSERT_EQ(r.status, 0) << r.out;
  expect_one_line_error(run_teraio("transform " + trace_ + " -o " + x),
                        "transform: say which change to make", "transform");
  expect_one_line_error(run_teraio("transform " + x + " --step-in-backward -o " + path("y.json")),
                        "already runs each parameter's update in the backward", "transform");
}

// Each command's output file, written under a file size limit of 0 bytes: the write fails (EFBIG),
// the old file stays whole and no temporary file is left.
TEST_F(Cli, AFailedWriteLeavesTheOldOutputWholeAndNoTemporaryFile) {
  const std::string out = path("out");
  const std::string commands[] = {
      "synth --model tiny -o " + out,
      "plan " + trace_ + " --budget 1536KiB --tier ssd:1TiB:1:1 -o " + out,
      "exact " + trace_ + " --budget 4GiB --tier ssd:1TiB:1:1 --time-limit 10 -o " + out,
      "report " + trace_ + " --sweep-steps 0 -o " + out,
      "transform " + trace_ + " --step-in-backward -o " + out,
      "study gap --instances 1 --max-layers 1 --time-limit 10 --json " + out,
      "study sensitivity --budget-fractions 0.5 --scales 1 --noise-seeds 0 --json " + out,
  };
  const std::vector<std::string> before = [&] {
    put(out, "old");
    return names();
  }();
  for (const std::string& c : commands) {
    put(out, "old");
    const CmdResult r = run_teraio(c + " > /dev/null", "ulimit -f 0; trap '' XFSZ;");
    EXPECT_EQ(r.signal, 0) << c;
    expect_one_line_error(r, "cannot write " + out + ": File too large", c);
    EXPECT_EQ(slurp(out), "old") << c;
    EXPECT_EQ(names(), before) << c << ": a temporary file was left";
    const CmdResult ok = run_teraio(c + " > /dev/null");
    EXPECT_EQ(ok.status, 0) << c << "\n" << ok.out;
    EXPECT_NE(slurp(out), "old") << c;
  }
}

TEST_F(Cli, AFullDeviceAsOutputIsAnErrorWithItsReason) {
  const CmdResult r = run_teraio("report " + trace_ + " --sweep-steps 0 -o /dev/full");
  expect_one_line_error(r, "cannot write /dev/full: No space left on device", "report");
  struct stat st;
  ASSERT_EQ(::stat("/dev/full", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << "/dev/full was replaced";
}

// The version is written once, in VERSION; CMake's project version carries it to --version.
TEST_F(Cli, VersionIsTheVersionFile) {
  std::string want = slurp(std::string(TERAIO_SOURCE_DIR) + "/VERSION");
  want.erase(want.find_last_not_of(" \n") + 1);
  const CmdResult r = run_teraio("--version");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out, "teraio " + want + "\n");
}

TEST_F(Cli, EveryCommandChecksItsStandardOutput) {
  fs::create_directory(dir_ / "tiers");
  const std::string commands[] = {
      "--help",
      "--version",
      "analyze --help",
      "analyze " + trace_,
      "analyze " + trace_ + " --json",
      "plan " + trace_ + " --budget 1536KiB --tier ssd:1TiB:1:1 -o " + path("p2.json"),
      "plan " + trace_ + " --budget 1536KiB --tier ssd:1TiB:1:1 -o " + path("p2.json") + " --json",
      "simulate " + trace_ + " " + plan_,
      "simulate " + trace_ + " " + plan_ + " --json",
      "simulate " + trace_ + " " + plan_ + " --sweep-bandwidth --sweep-steps 3 --json",
      "report " + trace_ + " --sweep-steps 0 -o " + path("r.html"),
      "synth --list",
      "synth --model tiny -o " + path("s.json"),
      "transform " + trace_ + " --step-in-backward -o " + path("x.json"),
      "exact " + trace_ + " --budget 4GiB --tier ssd:1TiB:1:1 --time-limit 10 -o " + path("e.json"),
      "study gap --instances 1 --max-layers 1 --time-limit 10",
      "study sensitivity --budget-fractions 0.5 --scales 1 --noise-seeds 0",
      "iobench --tier host --size 1MiB --repeat 1",
      "iobench --tier host --size 1MiB --repeat 1 --json",
      "clean " + path("tiers"),
      // More than stdio's buffer at once: the write fails inside fmt::print, not at the end.
      "plan " + trace_ + " --budget 1536KiB --tier " + std::string(6000, 'a') + ":1TiB:1:1 -o " +
          path("p3.json"),
  };
  for (const std::string& c : commands) {
    const CmdResult r = run_teraio(c + " > /dev/full");
    EXPECT_EQ(r.status, 1) << c << "\n" << r.out;
    EXPECT_EQ(r.out, "teraio: cannot write to standard output: No space left on device\n") << c;
  }
}

TEST_F(Cli, TracesBeyondTheFormatsBoundsAreRefusedNamingTheField) {
  const std::string big =
      R"({"id": 0, "bytes": 9223372036854775808, "kind": "activation", "persistent": false})";
  const std::string half =
      R"("bytes": 5000000000000000, "kind": "activation", "persistent": false})";
  const std::string k = R"({"name": "k", "time_us": 1, "tensors": [0]})";
  put(path("huge.json"), trace_json(big, k));
  put(path("sum.json"), trace_json(R"({"id": 0, )" + half + R"(, {"id": 1, )" + half, k));
  const std::string slow = R"({"name": "k", "time_us": 1.7e308, "tensors": []})";
  put(path("inf.json"), trace_json("", slow + ", " + slow));
  put(path("long.json"), trace_json("", R"({"name": "k", "time_us": 2e15, "tensors": []})"));
  for (const std::string cmd : {"analyze", "plan"}) {
    const std::string rest =
        std::string(cmd) == "plan" ? " --budget 1GiB --tier ssd:1TiB:1:1 -o " + path("p.json") : "";
    expect_one_line_error(
        run_teraio(std::string(cmd) + " " + path("huge.json") + rest),
        "huge.json: tensors[0].bytes: the tensors' bytes add up to more than 2^53", cmd);
    expect_one_line_error(run_teraio(std::string(cmd) + " " + path("sum.json") + rest),
                          "sum.json: tensors[1].bytes: the tensors' bytes add up to more than 2^53",
                          cmd);
    expect_one_line_error(
        run_teraio(std::string(cmd) + " " + path("inf.json") + rest),
        "inf.json: kernels[0].time_us: the kernels' times add up to more than 1e15 us", cmd);
    expect_one_line_error(run_teraio(std::string(cmd) + " " + path("long.json") + rest),
                          "long.json: kernels[0].time_us", cmd);
  }
}

TEST_F(Cli, OutOfRangeNumbersAreOneLineErrorsWithStatus1) {
  const std::string t = trace_, p = plan_, o = " -o " + path("x");
  const std::pair<std::string, std::string> cases[] = {
      {"analyze " + t + " --ssd-gbps 0", "--ssd-gbps: must be > 0, got 0"},
      {"analyze " + t + " --ssd-gbps nan", "--ssd-gbps: must be > 0, got nan"},
      {"plan " + t + " --budget -1 --tier ssd:1TiB:1:1" + o, "--budget: '-1' is not a size"},
      {"plan " + t + " --budget 1GiB --tier ssd:1TiB:0:1" + o,
       "--tier \"ssd:1TiB:0:1\" read GB/s: '0' is not a positive number"},
      {"exact " + t + " --budget 1GiB --tier ssd:1TiB:1:1 --time-limit 0" + o,
       "--time-limit: must be in (0, 1000000], got 0"},
      {"simulate " + t + " " + p + " --iterations 0", "--iterations: must be in [1, 1000], got 0"},
      {"simulate " + t + " " + p + " --sweep-bandwidth --sweep-steps 0",
       "--sweep-steps: must be in [1, 1000], got 0"},
      {"simulate " + t + " " + p + " --sweep-bandwidth --sweep-min -1",
       "--sweep-min: must be in (0, 1000000], got -1"},
      {"simulate " + t + " " + p + " --tier-bandwidth ssd:inf:1", "'inf' is not a positive number"},
      {"report " + t + " --max-points -3" + o, "--max-points: must be in [16, 10000000], got -3"},
      {"report " + t + " --max-points 8" + o, "--max-points: must be in [16, 10000000], got 8"},
      {"report " + t + " --sweep-steps -1" + o, "--sweep-steps: must be in [0, 1000], got -1"},
      {"synth --model tiny --batch 0" + o, "--batch: must be > 0, got 0"},
      {"synth --model tiny --seq 0" + o, "--seq: must be > 0, got 0"},
      {"synth --model tiny --micro-batches 0" + o, "--micro-batches: must be > 0, got 0"},
      {"synth --model tiny --gpu-tflops 0" + o, "--gpu-tflops: must be > 0, got 0"},
      {"synth --model tiny --hbm-gbps inf" + o, "--hbm-gbps: must be > 0, got inf"},
      {"synth --model tiny --launch-us -1" + o, "--launch-us: must be in [0, 1000000000], got -1"},
      {"synth --model tiny --layers 0" + o, "--layers: must be in [1, 4096], got 0"},
      {"synth --model tiny --dtype fp8" + o, "--dtype: 'fp8' is not one of fp32, bf16, fp16, amp"},
      {"synth --model mixtral-2b" + o, "a mixtral model; synth traces Llama-architecture decoders only"},
      {"study gap --instances 0", "--instances: must be in [1, 10000], got 0"},
      {"study gap --budget-fractions 0.5,2", "--budget-fractions: must be in [0, 1], got 2"},
      {"study gap --first-index -1", "--first-index: must be in [0, 1000000000], got -1"},
      {"study gap --time-limit -1", "--time-limit: must be in (0, 1000000], got -1"},
      {"study gap --max-layers 11", "--max-layers: must be in [1, 10], got 11"},
      {"study sensitivity --scales 0", "--scales: must be in (0, 1000000], got 0"},
      {"study sensitivity --budget-fractions 0", "--budget-fractions: must be in (0, 1], got 0"},
      {"study sensitivity --noise 1", "--noise: must be in [0, 1), got 1"},
      {"study sensitivity --noise-seeds -1", "--noise-seeds: must be in [0, 1000], got -1"},
      {"iobench --tier host --size 1MiB --repeat 0", "--repeat: must be in [1, 10000], got 0"},
      {"iobench --tier host --size 1MiB --queue-depth 0",
       "--queue-depth: must be in [1, 1024], got 0"},
      {"iobench --tier host --size 0", "--size must be > 0"},
  };
  for (const auto& [args, message] : cases) expect_one_line_error(run_teraio(args), message, args);
  // A command line that does not parse: status 2, one line.
  for (const std::string& args :
       {"simulate " + t, "analyze " + t + " --no-such-option", std::string("frobnicate"),
        "simulate " + t + " " + p + " --iterations x", "synth --seq 4294967296 -o " + path("x")}) {
    const CmdResult r = run_teraio(args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.out;
    EXPECT_EQ(lines(r.out), 1u) << args << "\n" << r.out;
  }
}

// `teraio clean`: a tier directory whose lock is free is removed with its bytes counted; one whose
// lock is held (here by this process) is left; a bad path is a one-line error.
TEST_F(Cli, CleanRemovesStaleTierDirectoriesOnly) {
  const fs::path root = dir_ / "tiers";
  fs::create_directories(root / "teraio-999999999-0");
  put(root / "teraio-999999999-0" / "lock", "");
  put(root / "teraio-999999999-0" / "stripe.dat", std::string(8192, 'x'));
  const fs::path live = root / "teraio-1-0";
  fs::create_directories(live);
  put(live / "stripe.dat", "x");
  const int lock = ::open((live / "lock").c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(lock, 0);
  ASSERT_EQ(::flock(lock, LOCK_EX), 0);

  CmdResult r = run_teraio("clean --dry-run " + root.string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("would remove   " + (root / "teraio-999999999-0").string()),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("in use         " + live.string()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("would free 8.0 KiB (8192 bytes) in 1 directory"), std::string::npos)
      << r.out;
  EXPECT_TRUE(fs::exists(root / "teraio-999999999-0" / "stripe.dat"));

  r = run_teraio("clean " + root.string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("removed        " + (root / "teraio-999999999-0").string()),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("freed 8.0 KiB (8192 bytes) in 1 directory; 1 in use, 0 kept"),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists(root / "teraio-999999999-0"));
  EXPECT_TRUE(fs::exists(live / "stripe.dat"));
  ::close(lock);

  expect_one_line_error(run_teraio("clean " + path("missing")),
                        "clean: " + path("missing") + ": No such file or directory", "missing");
  expect_one_line_error(run_teraio("clean " + root.string() + " " + trace_),
                        "clean: " + trace_ + ": not a directory", "file");
  EXPECT_EQ(run_teraio("clean").status, 2);
}

}  // namespace
}  // namespace teraio
