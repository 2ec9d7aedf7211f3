// Tests of the `teraio simulate` command: runs the built binary on a small trace and plan and
// checks the JSON it prints (exactly the documented keys, the simulated numbers), --tier-bandwidth,
// the sweep's JSON array, and the exit status on an invalid plan.
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "../common/files.h"
#include "../common/run_teraio.h"
#include "sim_test_util.h"

namespace teraio {
namespace {

namespace fs = std::filesystem;
using test::CmdResult;
using test::run_teraio;

class SimulateCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fs::path("teraio_sim_cli_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    // The golden case of simulator_test.cpp: 20 us transfers at 1 GB/s, 20 us of stall.
    const Trace tr =
        test::make_trace({10, 10, 10, 10, 10}, {{20000, false}}, {{0}, {}, {}, {}, {0}});
    Plan plan;
    plan.tiers = {test::tier("ssd", 1.0, 1.0)};
    plan.moves = {test::offload(0, 0, 1), test::prefetch(0, 3, 4)};
    test::fit_budget(tr, plan);
    trace_ = (dir_ / "t.json").string();
    plan_ = (dir_ / "p.json").string();
    write_trace(tr, trace_);
    write_plan(plan, plan_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  std::string trace_, plan_;
};

TEST_F(SimulateCli, JsonHasExactlyTheDocumentedKeys) {
  const CmdResult r = run_teraio("simulate " + trace_ + " " + plan_ + " --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  std::set<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.insert(k);
  EXPECT_EQ(keys, (std::set<std::string>{"iteration_us", "ideal_us", "stall_us", "overlap_us",
                                         "peak_bytes", "tiers", "urgent_fetches", "floor_us",
                                         "floor_bound", "bytes_by_kind"}));
  EXPECT_DOUBLE_EQ(j["iteration_us"].get<double>(), 70);
  EXPECT_DOUBLE_EQ(j["floor_us"].get<double>(), 50);  // the compute: 5 kernels of 10 us
  EXPECT_EQ(j["floor_bound"], "compute");
  EXPECT_DOUBLE_EQ(j["stall_us"].get<double>(), 20);
  EXPECT_EQ(j["peak_bytes"].get<uint64_t>(), 20000u);
  ASSERT_EQ(j["tiers"].size(), 1u);
  std::set<std::string> tier_keys;
  for (const auto& [k, v] : j["tiers"][0].items()) tier_keys.insert(k);
  EXPECT_EQ(tier_keys, (std::set<std::string>{"name", "offload_bytes", "prefetch_bytes",
                                              "write_busy_us", "read_busy_us"}));
  EXPECT_EQ(j["tiers"][0]["name"], "ssd");
  EXPECT_DOUBLE_EQ(j["tiers"][0]["read_busy_us"].get<double>(), 20);
}

TEST_F(SimulateCli, HostTimesAreReportedWhenTheTraceHasThem) {
  // The golden case with a host that needs 15 us per kernel: 5 us behind each 10 us kernel.
  Trace tr = read_trace(trace_);
  for (KernelIndex k = 0; k < tr.num_kernels(); ++k) tr.set_kernel_host_us(k, 15);
  const std::string t = (dir_ / "th.json").string();
  write_trace(tr, t);
  const CmdResult r = run_teraio("simulate " + t + " " + plan_ + " --json --iterations 1");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_DOUBLE_EQ(j["host_us"].get<double>(), 75);
  EXPECT_GT(j["host_wait_us"].get<double>(), 0);
  EXPECT_GE(j["iteration_us"].get<double>(), 75);
  const CmdResult table = run_teraio("simulate " + t + " " + plan_);
  ASSERT_EQ(table.status, 0) << table.out;
  EXPECT_NE(table.out.find("host                 75.0 us per iteration"), std::string::npos)
      << table.out;
}

TEST_F(SimulateCli, RunnerHostTimeIsPaidBeforeEveryKernelOfACpuTrace) {
  // The golden case (5 kernels of 10 us, no host times) with 4 us of the runner's per kernel: 20 us
  // of host time in series with the kernels; the transfers get that much longer to hide.
  const CmdResult r =
      run_teraio("simulate " + trace_ + " " + plan_ + " --json --iterations 1 --runner-host-us 4");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_DOUBLE_EQ(j["host_us"].get<double>(), 20);
  EXPECT_DOUBLE_EQ(j["host_wait_us"].get<double>(), 20);
  EXPECT_GE(j["iteration_us"].get<double>(), 70);
  EXPECT_LE(j["iteration_us"].get<double>(), 90);
  EXPECT_NE(run_teraio("simulate " + trace_ + " " + plan_ + " --runner-host-us -1").status, 0);
}

TEST_F(SimulateCli, TierBandwidthOverridesThePlan) {
  const CmdResult r =
      run_teraio("simulate " + trace_ + " " + plan_ + " --json --tier-bandwidth ssd:2:2");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(r.out)["stall_us"].get<double>(), 0);
  const CmdResult bad =
      run_teraio("simulate " + trace_ + " " + plan_ + " --tier-bandwidth nvme:2:2");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.out.find("no tier named \"nvme\""), std::string::npos) << bad.out;
  EXPECT_EQ(run_teraio("simulate " + trace_ + " " + plan_ + " --tier-bandwidth ssd:2").status, 1);
}

TEST_F(SimulateCli, TierBandwidthGivesTheBothWaysRate) {
  // The FullOverlap golden case of simulator_test.cpp: 70 us with independent directions, 110 us
  // when both ways run at 0.5 GB/s each; a plan's duplex_gbps is kept unless overridden.
  const Trace tr = test::make_trace({10, 10, 10, 10, 10}, {{20000, false}, {20000, true}},
                                    {{0}, {}, {1}, {}, {0}});
  Plan plan;
  plan.tiers = {test::tier("host", 1.0, 1.0)};
  plan.tiers[0].duplex_gbps = 0.5;
  plan.moves = {test::offload(0, 0, 1), test::prefetch(0, 3, 4), test::prefetch(1, 1, 2),
                test::offload(1, 2, 3)};
  test::fit_budget(tr, plan);
  const std::string t = (dir_ / "t2.json").string(), p = (dir_ / "p2.json").string();
  write_trace(tr, t);
  write_plan(plan, p);
  auto iteration = [&](const std::string& extra) {
    const CmdResult r = run_teraio("simulate " + t + " " + p + " --iterations 1 --json" + extra);
    EXPECT_EQ(r.status, 0) << r.out;
    return r.status == 0 ? nlohmann::json::parse(r.out)["iteration_us"].get<double>() : -1.0;
  };
  EXPECT_DOUBLE_EQ(iteration(""), 110);
  EXPECT_DOUBLE_EQ(iteration(" --tier-bandwidth host:1:1"), 110);
  EXPECT_DOUBLE_EQ(iteration(" --tier-bandwidth host:1:1:0"), 70);
  EXPECT_DOUBLE_EQ(iteration(" --tier-bandwidth host:2:2:1"), 70);
  const CmdResult table = run_teraio("simulate " + t + " " + p);
  EXPECT_NE(table.out.find("host: 0.50 GB/s per direction while reads and writes overlap"),
            std::string::npos)
      << table.out;
  const CmdResult bad = run_teraio("simulate " + t + " " + p + " --tier-bandwidth host:1:1:x");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.out.find("both-ways"), std::string::npos) << bad.out;
}

TEST_F(SimulateCli, TableAndSweep) {
  const CmdResult table = run_teraio("simulate " + trace_ + " " + plan_);
  ASSERT_EQ(table.status, 0) << table.out;
  EXPECT_NE(table.out.find("stall"), std::string::npos);
  EXPECT_NE(table.out.find("ssd"), std::string::npos);
  const CmdResult sweep = run_teraio(
      "simulate " + trace_ + " " + plan_ +
      " --sweep-bandwidth --sweep-min 0.5 --sweep-max 2 --sweep-steps 3 --min-tensor 0 --json");
  ASSERT_EQ(sweep.status, 0) << sweep.out;
  const auto j = nlohmann::json::parse(sweep.out);
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 3u);
  EXPECT_DOUBLE_EQ(j[1]["scale"].get<double>(), 1.0);
  for (size_t i = 1; i < j.size(); ++i) {
    EXPECT_LE(j[i]["iteration_us"].get<double>(), j[i - 1]["iteration_us"].get<double>());
  }
}

// A trace that records writes (docs/simulator.md, "Clean offloads"): a persistent parameter read
// back and only read is offloaded again without a byte written; the JSON gains the clean counts at
// the top and per tier, the table a line.
TEST_F(SimulateCli, CleanOffloadsAreReported) {
  Trace tr =
      test::make_trace({10, 10, 10, 10, 10, 10}, {{10000, true}}, {{0}, {}, {}, {0}, {}, {}});
  tr.writes_recorded = true;
  tr.tensors[0].written_at = {3};  // the second offload writes, the first is clean
  Plan plan;
  plan.tiers = {test::tier("host", 1.0, 1.0)};
  plan.moves = {test::offload(0, 0, 0), test::prefetch(0, 2, 3), test::offload(0, 3, 3),
                test::prefetch(0, 5, 0)};
  test::fit_budget(tr, plan);
  const std::string t = (dir_ / "clean.json").string(), p = (dir_ / "clean.plan.json").string();
  write_trace(tr, t);
  write_plan(plan, p);
  const CmdResult r = run_teraio("simulate " + t + " " + p + " --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["clean_offloads"].get<uint64_t>(), 1u);
  EXPECT_EQ(j["clean_offload_bytes"].get<uint64_t>(), 10000u);
  EXPECT_EQ(j["tiers"][0]["clean_offloads"].get<uint64_t>(), 1u);
  EXPECT_EQ(j["tiers"][0]["clean_offload_bytes"].get<uint64_t>(), 10000u);
  EXPECT_EQ(j["tiers"][0]["offload_bytes"].get<uint64_t>(), 10000u) << "only the dirty one";
  EXPECT_DOUBLE_EQ(j["iteration_us"].get<double>(), 70);
  const CmdResult table = run_teraio("simulate " + t + " " + p);
  ASSERT_EQ(table.status, 0) << table.out;
  EXPECT_NE(table.out.find("clean offloads       1 per iteration, 9.8 KiB not written"),
            std::string::npos)
      << table.out;
  // Without writes recorded: no such keys, no line.
  const CmdResult plain = run_teraio("simulate " + trace_ + " " + plan_);
  EXPECT_EQ(plain.out.find("clean offloads"), std::string::npos) << plain.out;
}

// --timeline writes the last simulated iteration (docs/formats.md, "Timeline files"): the golden
// case's offload after kernel 0 runs behind kernel 1 and holds kernel 2 for 10 us until it lands;
// the prefetch issued with kernel 3 holds kernel 4 another 10 us (the 20 us of stall).
TEST_F(SimulateCli, TimelineFileHasTheKernelsAndTransfers) {
  const std::string out = (dir_ / "timeline.json").string();
  const CmdResult r = run_teraio("simulate " + trace_ + " " + plan_ + " --timeline " + out);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(test::slurp(out));
  EXPECT_EQ(j["format"], "teraio.timeline");
  EXPECT_EQ(j["version"], 1);
  EXPECT_DOUBLE_EQ(j["iteration_us"].get<double>(), 70);
  EXPECT_DOUBLE_EQ(j["last_iteration_us"].get<double>(), 70);
  EXPECT_DOUBLE_EQ(j["ideal_us"].get<double>(), 50);
  EXPECT_DOUBLE_EQ(j["stall_us"].get<double>(), 20);
  ASSERT_EQ(j["kernels"].size(), 5u);
  const double starts[] = {0, 10, 30, 40, 60};
  for (size_t k = 0; k < 5; ++k) {
    EXPECT_DOUBLE_EQ(j["kernels"][k]["start_us"].get<double>(), starts[k]) << k;
    EXPECT_DOUBLE_EQ(j["kernels"][k]["time_us"].get<double>(), 10) << k;
  }
  ASSERT_EQ(j["transfers"].size(), 2u);
  const auto& w = j["transfers"][0];
  const auto& rd = j["transfers"][1];
  EXPECT_EQ(w["direction"], "write");
  EXPECT_EQ(rd["direction"], "read");
  for (const auto* x : {&w, &rd}) {
    EXPECT_EQ((*x)["tier"], "ssd");
    EXPECT_EQ((*x)["tensor"], 0);
    EXPECT_EQ((*x)["bytes"], 20000);
    EXPECT_DOUBLE_EQ((*x)["end_us"].get<double>() - (*x)["begin_us"].get<double>(), 20);
  }
  EXPECT_EQ(w["move"], 0);
  EXPECT_EQ(rd["move"], 1);
  EXPECT_EQ(w["op"], "offload");
  EXPECT_EQ(rd["op"], "prefetch");
  EXPECT_DOUBLE_EQ(w["begin_us"].get<double>(), 10);
  EXPECT_DOUBLE_EQ(rd["end_us"].get<double>(), 60);
  // One simulation, not a sweep's many.
  const CmdResult both = run_teraio("simulate " + trace_ + " " + plan_ + " --timeline " + out +
                                    " --sweep-bandwidth");
  EXPECT_NE(both.status, 0);
  EXPECT_NE(both.out.find("--timeline"), std::string::npos) << both.out;
}

TEST_F(SimulateCli, InvalidPlanExitsWithStatus1) {
  Plan plan = read_plan(plan_);
  plan.moves.erase(plan.moves.begin());  // a prefetch with no offload
  write_plan(plan, plan_);
  const CmdResult r = run_teraio("simulate " + trace_ + " " + plan_);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("not valid"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace teraio
