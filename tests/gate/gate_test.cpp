// The gate end to end: the memory suite binary, run on a copy of a source tree, against a real recorded baseline.
#include "memgate/gate/baseline.h"
#include "memgate/gate/suite.h"
#include "fixture_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>

namespace memgate {
namespace {

namespace fs = std::filesystem;

// The suite under test must not inherit the outer run's settings: its rows would land in the outer run's
// results file (and its summary), and an outer strict or update mode would change what it asserts.
const std::string kCleanEnv = "MEMGATE_RESULTS= MEMGATE_STRICT= MEMGATE_UPDATE_BASELINES= ";

// A source tree of two tiny fixtures, with a CPU suite probing each at batch 2.
class GateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(tree / "fixtures/gpus");
    fs::copy(source_dir() + "/fixtures/gpus", tree / "fixtures/gpus", fs::copy_options::recursive);
    testing::write_file(tree / "fixtures/models/gate_a.yaml", testing::tiny_vit_yaml("  trainable: all\n"));
    testing::write_file(tree / "fixtures/models/gate_b.yaml", testing::tiny_vit_yaml("  trainable: head\n"));
    testing::write_file(tree / "fixtures/suites/cpu.yaml",
                        "device: cpu\nfixtures:\n  - {fixture: gate_a, batch_sizes: [2]}\n"
                        "  - {fixture: gate_b, batch_sizes: [2]}\n");
    testing::write_file(tree / "fixtures/suites/gpu.yaml", "device: cuda\nfixtures:\n  - gate_a\n");
  }

  // Runs the CPU suite; returns the exit status and fills failed test names.
  int suite(const std::string& env, std::vector<std::string>* failed = nullptr, std::string* log = nullptr) {
    const auto report = tree / "report.json";
    std::string out;
    const int rc = testing::run(kCleanEnv + "MEMGATE_SOURCE_DIR=" + tree.path().string() + " MEMGATE_COMMIT=test " + env + " " +
                                    MEMGATE_MEMORY_SUITE + " --gtest_filter='Cpu/*' --gtest_output=json:" + report,
                                &out);
    if (log != nullptr) *log = out;
    if (failed != nullptr) {
      failed->clear();
      const auto j = nlohmann::json::parse(testing::read_file(report));
      for (const auto& s : j["testsuites"]) {
        for (const auto& t : s["testsuite"]) {
          if (t.contains("failures")) failed->push_back(t["name"].get<std::string>());
        }
      }
    }
    return rc;
  }

  std::string baseline(const std::string& fixture) { return tree / ("baselines/cpu/" + fixture + ".json"); }

  testing::TempDir tree;
};

TEST_F(GateTest, GrowthFailsOnlyTheComponentThatGrew) {
  std::string log;
  ASSERT_EQ(suite("MEMGATE_UPDATE_BASELINES=1", nullptr, &log), 0) << log;
  ASSERT_TRUE(fs::exists(baseline("gate_a"))) << log;
  ASSERT_EQ(suite(""), 0) << "a fresh baseline must pass";

  // Halve one component of the recorded baseline: the measurement now exceeds it beyond the tolerance.
  auto j = nlohmann::json::parse(testing::read_file(baseline("gate_a")));
  auto& activations = j["probes"][0]["components"]["activations"];
  activations = activations.get<std::int64_t>() / 2;
  testing::write_file(baseline("gate_a"), j.dump(2) + "\n");

  std::vector<std::string> failed;
  EXPECT_NE(suite("", &failed, &log), 0);
  EXPECT_EQ(failed, std::vector<std::string>{"StaysWithinBaseline/gate_a_bs2_activations"}) << log;
  EXPECT_NE(log.find("gate_a at batch 2: activations grew beyond its baseline"), std::string::npos) << log;
  EXPECT_NE(log.find("update-baselines"), std::string::npos) << log;
}

TEST_F(GateTest, ShrinkingPassesWithANoticeAndFailsInStrictMode) {
  ASSERT_EQ(suite("MEMGATE_UPDATE_BASELINES=1"), 0);
  auto j = nlohmann::json::parse(testing::read_file(baseline("gate_a")));
  auto& params = j["probes"][0]["components"]["params"];
  params = params.get<std::int64_t>() * 2;
  testing::write_file(baseline("gate_a"), j.dump(2) + "\n");
  std::string log;
  EXPECT_EQ(suite("", nullptr, &log), 0) << log;
  EXPECT_NE(log.find("the baseline is stale"), std::string::npos) << log;
  std::vector<std::string> failed;
  EXPECT_NE(suite("MEMGATE_STRICT=1", &failed), 0);
  EXPECT_EQ(failed, std::vector<std::string>{"StaysWithinBaseline/gate_a_bs2_params"});
}

TEST_F(GateTest, AChangedFixtureFailsUntilTheBaselinesAreUpdated) {
  ASSERT_EQ(suite("MEMGATE_UPDATE_BASELINES=1"), 0);
  const auto other_before = testing::read_file(baseline("gate_b"));
  testing::write_file(tree / "fixtures/models/gate_a.yaml",
                      testing::tiny_vit_yaml("  trainable: all\n", "  mlp_ratio: 2.0\n"));
  std::vector<std::string> failed;
  std::string log;
  EXPECT_NE(suite("", &failed, &log), 0);
  EXPECT_EQ(failed.size(), 8U) << "every component of the changed fixture fails";
  EXPECT_NE(log.find("the model changed: update the baselines"), std::string::npos) << log;

  const auto a_before = testing::read_file(baseline("gate_a"));
  ASSERT_EQ(suite("MEMGATE_UPDATE_BASELINES=1"), 0);
  EXPECT_NE(testing::read_file(baseline("gate_a")), a_before);
  EXPECT_EQ(testing::read_file(baseline("gate_b")), other_before) << "only the changed fixture's file may change";
  EXPECT_EQ(suite("", &failed), 0);
  EXPECT_TRUE(failed.empty());
}

TEST_F(GateTest, NoBaselinesSkipWithTheCommandAndFailInStrictMode) {
  std::string log;
  EXPECT_EQ(suite("", nullptr, &log), 0) << log;
  EXPECT_NE(log.find("ctest --preset update-baselines"), std::string::npos) << log;
  EXPECT_NE(suite("MEMGATE_STRICT=1"), 0);
}

TEST_F(GateTest, ACorruptBaselineFailsNamingTheFile) {
  ASSERT_EQ(suite("MEMGATE_UPDATE_BASELINES=1"), 0);
  testing::write_file(baseline("gate_a"), "{ not json");
  std::string log;
  EXPECT_NE(suite("", nullptr, &log), 0);
  EXPECT_NE(log.find("gate_a.json: not valid JSON"), std::string::npos) << log;
}

}  // namespace
}  // namespace memgate
