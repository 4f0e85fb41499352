// The gate end to end: the memory suite binary, run on a copy of a source tree, against a real recorded baseline.
#include "memgate/gate/baseline.h"
#include "memgate/gate/report.h"
#include "memgate/gate/suite.h"
#include "memgate/backend/device.h"
#include "fixture_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <iostream>
#include <memory>
#include <regex>
#include <set>
#include <sstream>

namespace memgate {
namespace {

namespace fs = std::filesystem;

// The suite under test must not inherit the outer run's settings: its rows would land in the outer run's
// results file (and its summary), and an outer strict or update mode would change what it asserts.
const std::string kCleanEnv = "MEMGATE_RESULTS= MEMGATE_STRICT= MEMGATE_UPDATE_BASELINES= MEMGATE_CPU_KERNELS= "
                              "ONEDNN_MAX_CPU_ISA= DNNL_MAX_CPU_ISA= ";

// A source tree of two tiny fixtures, with a CPU suite probing each at batch 2.
class GateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(tree / "fixtures/gpus");
    fs::copy(testing::source_dir() + "/fixtures/gpus", tree / "fixtures/gpus", fs::copy_options::recursive);
    testing::write_file(tree / "fixtures/models/gate_a.yaml", testing::tiny_vit_yaml("  trainable: all\n"));
    testing::write_file(tree / "fixtures/models/gate_b.yaml", testing::tiny_vit_yaml("  trainable: head\n"));
    testing::write_file(tree / "fixtures/suites/cpu.yaml",
                        "device: cpu\nfixtures:\n  - {fixture: gate_a, batch_sizes: [2]}\n"
                        "  - {fixture: gate_b, batch_sizes: [2]}\n");
    testing::write_file(tree / "fixtures/suites/gpu.yaml", "device: cuda\nfixtures:\n  - gate_a\n");
  }

  // Runs the CPU suite through CTest, as `ctest --preset cpu` does (the measuring tests, then the component tests
  // that require them); returns ctest's exit status and fills the names of the tests that failed.
  int suite(const std::string& env, std::vector<std::string>* failed = nullptr, std::string* log = nullptr,
            const std::string& select = "-L '^cpu$'") {
    const std::string dir = tree / "ctest";
    fs::create_directories(dir);
    // The listing (a process that loads LibTorch) is kept, as ctest keeps it (cmake/MemgateListMemoryTests.cmake),
    // while what it read is as it was: the files and folders it names in --memgate_ctest_inputs. A test's later runs
    // of an unchanged tree registered the same tests: GateTest lists 10 times, not 25.
    if (listing_.empty() || what_was_read(listing_inputs_) != listing_read_) {
      std::string listing;
      const int listed = testing::run(kCleanEnv + "MEMGATE_SOURCE_DIR=" + tree.path().string() + " " +
                                          MEMGATE_MEMORY_SUITE + " --memgate_ctest_list --memgate_verdict_binary=" +
                                          MEMGATE_VERDICT_TESTS + " --memgate_verdicts_dir=" + tree / "verdicts" +
                                          " --memgate_ctest_inputs=" + listing_inputs_,
                                      &listing);
      if (listed != 0) {
        if (log != nullptr) *log = listing;
        listing_.clear();
        return listed;
      }
      listing_ = fs::exists(listing_inputs_) ? listing : "";
      listing_read_ = what_was_read(listing_inputs_);
      testing::write_file(dir + "/tests.cmake", listing);
    }
    testing::write_file(dir + "/CTestTestfile.cmake", "include(tests.cmake)\n");
    const auto junit = tree / "junit.xml";
    fs::remove(junit);
    std::string out;
    const int rc = testing::run(kCleanEnv + "MEMGATE_COMMIT=test " + env + " " + MEMGATE_CTEST + " --test-dir " +
                                    dir + " " + select + " -j2 -V --output-junit " + junit,
                                &out);
    if (log != nullptr) *log = out;
    if (failed != nullptr) {
      failed->clear();
      // CTest's JUnit: <testcase name="..." classname="..." time="..." status="run|fail|notrun|disabled">
      const std::regex testcase(R"re(<testcase name="([^"]*)"[^>]*status="(fail|notrun)")re");
      const auto xml = testing::read_file(junit);
      for (std::sregex_iterator it(xml.begin(), xml.end(), testcase), end; it != end; ++it) {
        failed->push_back((*it)[1].str());
      }
    }
    return rc;
  }

  std::string baseline(const std::string& fixture) { return tree / ("baselines/cpu/" + fixture + ".json"); }

  // Each file and folder that a listing names in its inputs file, with the file's text or the folder's names.
  static std::string what_was_read(const std::string& inputs) {
    std::error_code ec;
    if (!fs::exists(inputs, ec)) return "";
    std::string state;
    std::istringstream lines(testing::read_file(inputs));
    for (std::string path; std::getline(lines, path);) {
      state += path + "\n";
      if (fs::is_directory(path, ec)) {
        std::set<std::string> names;
        for (const auto& entry : fs::directory_iterator(path, ec)) names.insert(entry.path().filename().string());
        for (const auto& name : names) state += "  " + name + "\n";
      } else if (fs::exists(path, ec)) {
        state += testing::read_file(path) + "\n";
      }
    }
    return state;
  }

  // The two fixtures' baselines, recorded by the update workflow: by the first test that asks, in its tree, then
  // copied from there into each later test's (the same fixtures, so the same files). Returns the update's status.
  int record_baselines() {
    if (recorded_ == nullptr) {
      std::string log;
      const int rc = suite("MEMGATE_UPDATE_BASELINES=1", nullptr, &log);
      if (rc != 0) {
        std::cerr << log;
        return rc;
      }
      recorded_ = std::make_unique<testing::TempDir>();
      fs::copy(tree / "baselines", recorded_->path(), fs::copy_options::recursive);
      return 0;
    }
    fs::copy(recorded_->path(), tree / "baselines", fs::copy_options::recursive);
    return 0;
  }
  static void TearDownTestSuite() { recorded_.reset(); }

  testing::TempDir tree;
  static inline std::unique_ptr<testing::TempDir> recorded_;

 private:
  std::string listing_inputs_ = tree / "listing.inputs";
  std::string listing_, listing_read_;  ///< the kept listing and what it read
};

TEST_F(GateTest, GrowthFailsOnlyTheComponentThatGrew) {
  ASSERT_EQ(record_baselines(), 0);  // by the update workflow, in this tree where this test is the first to ask
  ASSERT_TRUE(fs::exists(baseline("gate_a")));
  std::string log;
  ASSERT_EQ(suite(""), 0) << "a fresh baseline must pass";

  // Halve one component of the recorded baseline: the measurement now exceeds it beyond the tolerance.
  auto j = nlohmann::json::parse(testing::read_file(baseline("gate_a")));
  auto& activations = j["probes"][0]["components"]["activations"];
  activations = activations.get<std::int64_t>() / 2;
  testing::write_file(baseline("gate_a"), j.dump(2) + "\n");

  std::vector<std::string> failed;
  EXPECT_NE(suite("", &failed, &log), 0);
  EXPECT_EQ(failed, std::vector<std::string>{"Cpu/ComponentTest.StaysWithinBaseline/gate_a_bs2_activations"}) << log;
  EXPECT_NE(log.find("gate_a at batch 2: activations grew beyond its baseline"), std::string::npos) << log;
  EXPECT_NE(log.find("update-baselines"), std::string::npos) << log;
}

// A failing probe leaves its allocator history for memory_viz (by default on a GPU; MEMGATE_SNAPSHOTS=failing here),
// named in the failure; a passing one leaves none.
TEST_F(GateTest, AFailingProbeLeavesAMemoryVizSnapshot) {
  ASSERT_EQ(record_baselines(), 0);
  auto j = nlohmann::json::parse(testing::read_file(baseline("gate_a")));
  auto& activations = j["probes"][0]["components"]["activations"];
  activations = activations.get<std::int64_t>() / 2;
  testing::write_file(baseline("gate_a"), j.dump(2) + "\n");
  const auto snapshots = tree.path() / "snapshots";
  std::string log;
  EXPECT_NE(suite("MEMGATE_SNAPSHOT_DIR=" + snapshots.string(), nullptr, &log), 0);
  EXPECT_FALSE(fs::exists(snapshots)) << "off by default on the CPU";
  std::vector<std::string> failed;
  EXPECT_NE(suite("MEMGATE_SNAPSHOTS=failing MEMGATE_SNAPSHOT_DIR=" + snapshots.string(), &failed, &log), 0);
  EXPECT_EQ(failed, std::vector<std::string>{"Cpu/ComponentTest.StaysWithinBaseline/gate_a_bs2_activations"}) << log;
  const auto file = snapshots / "cpu" / "gate_a_bs2.pickle";
  ASSERT_TRUE(fs::exists(file)) << log;
  EXPECT_GT(fs::file_size(file), 1000U);
  EXPECT_FALSE(fs::exists(snapshots / "cpu" / "gate_b_bs2.pickle")) << "gate_b passed";
  EXPECT_NE(log.find("memory_viz snapshot of this probe: " + file.string()), std::string::npos) << log;
  EXPECT_NE(suite("MEMGATE_SNAPSHOTS=sometimes", nullptr, &log), 0);
  EXPECT_NE(log.find("MEMGATE_SNAPSHOTS: expected failing or off, got 'sometimes'"), std::string::npos) << log;
}

// A distributed probe's failing component is one rank's: that rank's history is left, named for the rank.
TEST_F(GateTest, AFailingRankLeavesThatRanksSnapshot) {
  fs::copy_file(testing::source_dir() + "/fixtures/models/vit_tiny_fsdp.yaml", tree / "fixtures/models/gate_fsdp.yaml");
  testing::write_file(tree / "fixtures/suites/cpu.yaml", "device: cpu\nfixtures:\n  - {fixture: gate_fsdp, batch_sizes: [1]}\n");
  std::string log;
  ASSERT_EQ(suite("MEMGATE_UPDATE_BASELINES=1", nullptr, &log), 0) << log;
  auto j = nlohmann::json::parse(testing::read_file(baseline("gate_fsdp")));
  auto& activations = j["probes"][0]["ranks"][1]["components"]["activations"];
  activations = activations.get<std::int64_t>() / 2;
  testing::write_file(baseline("gate_fsdp"), j.dump(2) + "\n");
  const auto snapshots = tree.path() / "snapshots";
  std::vector<std::string> failed;
  EXPECT_NE(suite("MEMGATE_SNAPSHOTS=failing MEMGATE_SNAPSHOT_DIR=" + snapshots.string(), &failed, &log), 0);
  EXPECT_EQ(failed, std::vector<std::string>{"Cpu/ComponentTest.StaysWithinBaseline/gate_fsdp_bs1_rank1_activations"})
      << log;
  const auto file = snapshots / "cpu" / "gate_fsdp_bs1_rank1.pickle";
  ASSERT_TRUE(fs::exists(file)) << log;
  EXPECT_GT(fs::file_size(file), 1000U);
  EXPECT_FALSE(fs::exists(snapshots / "cpu" / "gate_fsdp_bs1_rank0.pickle")) << "rank 0 passed";
  EXPECT_NE(log.find("memory_viz snapshot of this probe: " + file.string()), std::string::npos) << log;
}

TEST_F(GateTest, ShrinkingPassesWithANoticeAndFailsInStrictMode) {
  ASSERT_EQ(record_baselines(), 0);
  auto j = nlohmann::json::parse(testing::read_file(baseline("gate_a")));
  auto& params = j["probes"][0]["components"]["params"];
  params = params.get<std::int64_t>() * 2;
  testing::write_file(baseline("gate_a"), j.dump(2) + "\n");
  std::string log;
  EXPECT_EQ(suite("", nullptr, &log), 0) << log;
  EXPECT_NE(log.find("the baseline is stale"), std::string::npos) << log;
  std::vector<std::string> failed;
  EXPECT_NE(suite("MEMGATE_STRICT=1", &failed), 0);
  EXPECT_EQ(failed, std::vector<std::string>{"Cpu/ComponentTest.StaysWithinBaseline/gate_a_bs2_params"});
}

// MEMGATE_STRICT=maybe is neither on nor off: each test program says so, naming the variable and the words it takes,
// and exits 2 before any test runs (no crash, no test that passes on a lenient reading).
TEST_F(GateTest, AStrictModeNeitherOnNorOffStopsEachTestProgramNamingTheVariable) {
  std::vector<std::string> failed;
  std::string log;
  EXPECT_NE(suite("MEMGATE_STRICT=maybe", &failed, &log), 0) << log;
  EXPECT_FALSE(failed.empty()) << log;
  EXPECT_NE(log.find("memgate: MEMGATE_STRICT=maybe: expected 1, true, yes or on to turn it on, or 0, false, no or off"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("terminate called"), std::string::npos) << log;
  EXPECT_EQ(log.find("SEGFAULT"), std::string::npos) << log;
}

TEST_F(GateTest, AChangedFixtureFailsUntilTheBaselinesAreUpdated) {
  ASSERT_EQ(record_baselines(), 0);
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

// The opt-in host kernels (oneDNN as PyTorch runs it on this CPU) record and check baselines of their own per CPU
// class, baselines/cpu-<class>/, beside the portable ones; a runner of another class finds none of its class, is
// told how to record them, and never compares against another class's bytes. Two classes are made on this CPU by
// capping oneDNN (on x86; elsewhere the class is the machine's).
TEST_F(GateTest, HostKernelsKeepBaselinesPerCpuClass) {
  const bool x86 = !describe_device(c10::Device(c10::DeviceType::CPU)).cpu_isa.empty();
  const std::string recorder = x86 ? "ONEDNN_MAX_CPU_ISA=AVX2 " : "";
  const std::string host = "MEMGATE_CPU_KERNELS=host ";
  // The class this CPU falls in under a cap (on a CPU without AVX2, AVX2 caps nothing: its own class).
  auto cls = [&](const std::string& cap) {
    DeviceInfo d;
    d.cpu_isa = onednn_cpu_isa(testing::host_cpu_flags(), cap);
    set_cpu_kernels(d, CpuKernels::kHost);
    return d.slug;
  };
  const auto recorded_class = cls(x86 ? "AVX2" : "");
  std::string log;
  ASSERT_EQ(suite(host + recorder + "MEMGATE_UPDATE_BASELINES=1", nullptr, &log), 0) << log;
  const auto file = tree / ("baselines/" + recorded_class + "/gate_a.json");
  ASSERT_TRUE(fs::exists(file)) << log;
  EXPECT_FALSE(fs::exists(tree / "baselines/cpu")) << "the portable baselines are not the host's";
  const auto recorded = nlohmann::json::parse(testing::read_file(file));
  const auto& provenance = recorded["probes"][0]["provenance"];
  EXPECT_EQ(provenance["cpu_kernels"], "host");
  EXPECT_TRUE(provenance.contains("cpu_isa") && provenance.contains("cpu_features") && provenance.contains("device"))
      << provenance.dump();
  EXPECT_EQ(recorded["device"]["slug"], recorded_class);

  std::vector<std::string> failed;
  EXPECT_EQ(suite(host + recorder + "MEMGATE_STRICT=1", &failed, &log), 0) << log;
  EXPECT_TRUE(failed.empty()) << log;
  // The portable kernels have no baselines here: skipped, with the command that records them.
  EXPECT_EQ(suite("", nullptr, &log), 0) << log;
  EXPECT_NE(log.find("no baseline"), std::string::npos) << log;
  if (!x86) return;
  // A runner of another class: none of its class, so missing (failing in strict mode), with the command that
  // records them in host mode and the folder to commit, never the AVX2 class's bytes.
  EXPECT_EQ(suite(host + "ONEDNN_MAX_CPU_ISA=SSE41", nullptr, &log), 0) << log;
  EXPECT_NE(suite(host + "ONEDNN_MAX_CPU_ISA=SSE41 MEMGATE_STRICT=1", &failed, &log), 0) << log;
  EXPECT_EQ(failed.size(), 16U) << log;
  ASSERT_NE(cls("SSE41"), recorded_class);
  EXPECT_NE(log.find("no baseline " + (tree.path() / "baselines" / cls("SSE41") / "gate_a.json").string() +
                     " for device " + cls("SSE41")),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("MEMGATE_CPU_KERNELS=host ctest --preset update-baselines (then commit baselines/" + cls("SSE41") +
                     "/)"),
            std::string::npos)
      << log;
  EXPECT_FALSE(fs::exists(tree.path() / "baselines" / cls("SSE41"))) << "judging records nothing";
}

TEST_F(GateTest, NoBaselinesSkipWithTheCommandAndFailInStrictMode) {
  std::string log;
  EXPECT_EQ(suite("", nullptr, &log), 0) << log;
  EXPECT_NE(log.find("ctest --preset update-baselines"), std::string::npos) << log;
  EXPECT_NE(suite("MEMGATE_STRICT=1"), 0);
}

TEST_F(GateTest, ACorruptBaselineFailsNamingTheFile) {
  ASSERT_EQ(record_baselines(), 0);
  testing::write_file(baseline("gate_a"), "{ not json");
  std::string log;
  std::vector<std::string> failed;
  EXPECT_NE(suite("", &failed, &log), 0);
  EXPECT_NE(log.find("gate_a.json: not valid JSON"), std::string::npos) << log;
  // Every component of gate_a fails naming the file; gate_b, measured in the same process, is judged and passes.
  ASSERT_EQ(failed.size(), 8U) << log;
  for (const auto& name : failed) {
    EXPECT_NE(name.find("ComponentTest.StaysWithinBaseline/gate_a_bs2_"), std::string::npos) << name;
  }
  EXPECT_NE(log.find("gate_a could not be judged"), std::string::npos) << log;
}

// A suite that does not load fails the listing with the reason, naming the file (an empty reason left CTest with
// a failing placeholder and no explanation).
TEST_F(GateTest, ABrokenSuiteFailsTheListingWithItsReason) {
  testing::write_file(tree / "fixtures/suites/cpu.yaml", "device: cpu\nfixtures:\n  - no_such_fixture\n");
  std::string out;
  EXPECT_NE(testing::run(kCleanEnv + "MEMGATE_SOURCE_DIR=" + tree.path().string() + " " + MEMGATE_MEMORY_SUITE +
                             " --memgate_ctest_list --memgate_verdict_binary=x",
                         &out),
            0);
  EXPECT_NE(out.find("cpu.yaml"), std::string::npos) << out;
  EXPECT_NE(out.find("no_such_fixture"), std::string::npos) << out;
}

// What ctest runs as it starts (cmake/MemgateListMemoryTests.cmake, as memgate_add_memory_suite's include script
// runs it): the suite program's listing, kept while the files it read are unchanged, listed again when a suite, a
// fixture of one or the GPUs change, and never kept when it fails.
class ListingTest : public GateTest {
 protected:
  void SetUp() override {
    GateTest::SetUp();
    fs::create_directories(dir);
    testing::write_file(
        dir / "CTestTestfile.cmake",
        fmt::format("set(memgate_list_target gate)\nset(memgate_list_cmake [==[{}]==])\n"
                    "set(memgate_list_program [==[{}]==])\nset(memgate_list_verdict_program [==[{}]==])\n"
                    "set(memgate_list_environment [==[MEMGATE_PROJECT_DIR={};MEMGATE_SUITES=]==])\n"
                    "set(memgate_list_verdicts [==[{}]==])\nset(memgate_list_file [==[{}]==])\n"
                    "set(memgate_list_caller [==[{}]==])\ninclude([==[{}/cmake/MemgateListMemoryTests.cmake]==])\n",
                    MEMGATE_CMAKE, MEMGATE_MEMORY_SUITE, MEMGATE_VERDICT_TESTS, tree.path().string(),
                    tree / "verdicts", list.string(), (dir / "CTestTestfile.cmake").string(),
                    testing::source_dir()));
  }

  // The tests ctest registers (-N), and its output.
  int registered(const std::string& env = "", std::string* out = nullptr) {
    std::string log;
    testing::run(kCleanEnv + env + " " + MEMGATE_CTEST + " --test-dir " + dir.string() + " -N", &log);
    if (out != nullptr) *out = log;
    std::smatch m;
    const std::regex total(R"(Total Tests: (\d+))");
    return std::regex_search(log, m, total) ? std::stoi(m[1].str()) : -1;
  }
  fs::file_time_type listed_at() { return fs::last_write_time(list); }

  fs::path dir = tree / "listing", list = dir / "tests.cmake";
};

TEST_F(ListingTest, IsKeptUntilASuiteAFixtureOrTheGpusChange) {
  const int first = registered();
  ASSERT_GT(first, 0);
  ASSERT_TRUE(fs::exists(fs::path(list.string() + ".inputs")));
  const auto at = listed_at();
  EXPECT_EQ(registered(), first);
  EXPECT_EQ(listed_at(), at) << "nothing changed: the listing is kept";

  // A batch size more in the CPU suite: 8 component tests more.
  testing::write_file(tree / "fixtures/suites/cpu.yaml",
                      "device: cpu\nfixtures:\n  - {fixture: gate_a, batch_sizes: [2, 4]}\n"
                      "  - {fixture: gate_b, batch_sizes: [2]}\n");
  EXPECT_EQ(registered(), first + 8);
  // A batch size less in the fixture the GPU suite probes at its own batch sizes (1, 2, 4, 8): 8 fewer.
  testing::write_file(tree / "fixtures/models/gate_a.yaml",
                      std::regex_replace(testing::tiny_vit_yaml("  trainable: all\n"), std::regex(R"(, 8\])"), "]"));
  EXPECT_EQ(registered(), first);
  // Other GPUs: listed again (the same tests on this machine).
  const auto before = listed_at();
  EXPECT_EQ(registered("CUDA_VISIBLE_DEVICES=7"), first);
  EXPECT_NE(listed_at(), before) << "listed again for other GPUs";
}

TEST_F(ListingTest, AFailedListingIsNeverKept) {
  testing::write_file(tree / "fixtures/suites/cpu.yaml", "device: cpu\nfixtures:\n  - no_such_fixture\n");
  std::string out;
  EXPECT_EQ(registered("", &out), 1) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("gate_cannot_list_suites"));
  EXPECT_FALSE(fs::exists(fs::path(list.string() + ".inputs")));
  EXPECT_EQ(registered(), 1) << "still the failure, listed again";
  testing::write_file(tree / "fixtures/suites/cpu.yaml", "device: cpu\nfixtures:\n  - gate_a\n");
  EXPECT_GT(registered(), 1);
}

TEST_F(GateTest, OneComponentTestRunsItsMeasurementFirst) {
  ASSERT_EQ(record_baselines(), 0);
  memgate::remove_tree(tree / "verdicts");
  std::string log;
  std::vector<std::string> failed;
  ASSERT_EQ(suite("", &failed, &log, "-R '^Cpu/.*gate_a_bs2_params$'"), 0) << log;
  EXPECT_NE(log.find("Cpu/MeasureTest.Probes/cpu_suite"), std::string::npos) << log;
  EXPECT_NE(log.find("Cpu/ComponentTest.StaysWithinBaseline/gate_a_bs2_params"), std::string::npos) << log;
  EXPECT_NE(log.find("0 tests failed out of 2"), std::string::npos) << "the measuring test, then the one component\n"
                                                                     << log;
}

// The component tests' executable on its own: it reports what a verdict file says and fails when it cannot.
class VerdictBinaryTest : public ::testing::Test {
 protected:
  int run(const std::string& file, const std::string& what, std::string* out, const std::string& env = "") {
    return testing::run(kCleanEnv + env + " " + MEMGATE_VERDICT_TESTS + std::string(" --memgate_verdicts=") + file +
                            " --memgate_test=Cpu/ComponentTest.StaysWithinBaseline/x_bs2_" + what +
                            " --memgate_batch=2 --memgate_component=" + what,
                        out);
  }
  void write(const std::string& status, const std::string& message) {
    testing::write_file(tree / "v.json", R"({"format": "memgate-verdicts", "version": 1, "suite": "cpu", "fixture": "x",
      "device": "cpu", "budgets": [], "components": [{"status": ")" + status + R"(", "fixture": "x", "batch_size": 2,
      "component": "activations", "message": ")" + message + R"(", "baseline": 100, "measured": 200, "allowed": 0}]})");
  }
  testing::TempDir tree;
};

TEST_F(VerdictBinaryTest, ReportsEachStatus) {
  std::string out;
  write("ok", "");
  EXPECT_EQ(run(tree / "v.json", "activations", &out), 0) << out;
  write("regression", "x at batch 2: activations grew");
  EXPECT_EQ(run(tree / "v.json", "activations", &out), 1) << out;
  EXPECT_NE(out.find("x at batch 2: activations grew"), std::string::npos) << out;
  write("missing", "no baseline here");
  EXPECT_EQ(run(tree / "v.json", "activations", &out), 0) << out;
  EXPECT_NE(out.find("[  SKIPPED ]"), std::string::npos) << out;
  write("stale", "the baseline is stale");
  EXPECT_EQ(run(tree / "v.json", "activations", &out), 0) << out;
  EXPECT_NE(out.find("[ NOTICE   ] the baseline is stale"), std::string::npos) << out;
  EXPECT_EQ(run(tree / "v.json", "activations", &out, "MEMGATE_STRICT=1"), 1) << out;
  write("missing", "no baseline here");
  EXPECT_EQ(run(tree / "v.json", "activations", &out, "MEMGATE_STRICT=1"), 1) << out;
  testing::write_file(tree / "v.json", R"({"format": "memgate-verdicts", "version": 1, "suite": "gpu", "fixture": "x",
      "device": "", "skipped": "no GPU on this machine", "budgets": [], "components": []})");
  EXPECT_EQ(run(tree / "v.json", "activations", &out), 0) << out;
  EXPECT_NE(out.find("no GPU on this machine"), std::string::npos) << out;
}

TEST_F(VerdictBinaryTest, FailsWhenTheVerdictCannotBeFound) {
  std::string out;
  EXPECT_EQ(run(tree / "absent.json", "activations", &out), 1) << out;
  EXPECT_NE(out.find("absent.json: no such file"), std::string::npos) << out;
  write("ok", "");
  EXPECT_EQ(run(tree / "v.json", "params", &out), 1) << out;
  EXPECT_NE(out.find("has no verdict for params at batch 2"), std::string::npos) << out;
  testing::write_file(tree / "v.json", "{\"format\": \"memgate-verdicts\", \"version\": 1}");
  EXPECT_EQ(run(tree / "v.json", "activations", &out), 1) << out;
  EXPECT_NE(out.find("`suite`: expected a string"), std::string::npos) << out;
  EXPECT_EQ(testing::run(MEMGATE_VERDICT_TESTS + std::string(" --memgate_batch=0"), &out), 2) << out;
  EXPECT_NE(out.find("--memgate_batch=<N >= 1>"), std::string::npos) << out;
}

// After a profile, the fits-on table says what its numbers are: a GPU that fits every batch size profiled fits "that
// or more", with the command that finds how much more; a CUDA profile says that its components count the caching
// allocator's blocks (why gradients can differ between batch sizes).
TEST(ProfileTextTest, TheFitsTableSaysWhatItKnows) {
  Profile profile;
  profile.device.name = "cpu";
  profile.device.slug = "cpu";
  profile.device.device = c10::Device(c10::DeviceType::CPU);
  profile.fixture = "f";
  for (const std::int64_t b : {1, 2, 4}) {
    ProbeResult p;
    p.batch_size = b;
    p.components.step_peak_reserved = b * 1'000'000'000LL;
    profile.probes.push_back(p);
  }
  GpuSpec big{.id = "big", .name = "Big GPU", .memory_bytes = 100'000'000'000LL, .usable_fraction = 1.0};
  GpuSpec mid{.id = "mid", .name = "Mid GPU", .memory_bytes = 2'500'000'000LL, .usable_fraction = 1.0};
  GpuSpec tiny{.id = "tiny", .name = "Tiny GPU", .memory_bytes = 500'000'000LL, .usable_fraction = 1.0};
  auto text = format_profile(profile, {big, mid, tiny});
  EXPECT_THAT(text, ::testing::HasSubstr("->  bs 4 or more (every batch size measured fits)")) << text;
  EXPECT_THAT(text, ::testing::HasSubstr("->  bs 2\n")) << text;
  EXPECT_THAT(text, ::testing::HasSubstr("->  none of the measured")) << text;
  EXPECT_THAT(text, ::testing::HasSubstr("memgate estimate --gpu <id> finds it by estimate"));
  EXPECT_THAT(text, ::testing::Not(::testing::HasSubstr("caching allocator's blocks")));
  profile.device.device = c10::Device(c10::DeviceType::CUDA, 0);
  text = format_profile(profile, {mid});
  EXPECT_THAT(text, ::testing::HasSubstr("on CUDA each component counts the caching allocator's blocks"));
  EXPECT_THAT(text, ::testing::Not(::testing::HasSubstr("or more")));
}

}  // namespace
}  // namespace memgate
