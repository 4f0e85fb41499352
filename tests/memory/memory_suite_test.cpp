// The memory regression suites' measuring side (fixtures/suites/*.yaml): one test per suite fixture measures each
// of its batch sizes once, judges every component against baselines/<device>/<fixture>.json and every budget
// against its GPU, and writes the verdicts for the component tests (tests/memory/verdict_test_main.cpp), which
// report them without LibTorch. In update mode (MEMGATE_UPDATE_BASELINES=1) it records the baselines instead.
// `--memgate_ctest_list` prints the CTest registration of both sides.
#include "memgate/base/error.h"
#include "memgate/base/verdict_file.h"
#include "memgate/gate/baseline.h"
#include "memgate/gate/budget.h"
#include "memgate/gate/fixture.h"
#include "memgate/gate/suite.h"
#include "memgate/gate/verdict.h"
#include "memgate/measure/device.h"
#include "memgate/measure/memory_backend.h"
#include "memgate/measure/probe.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <ostream>
#include <string>
#include <vector>

namespace memgate {
namespace {

/// One fixture of a suite: the batch sizes its components are gated at and the budgets it is held to.
struct MeasureCase {
  std::string suite;  ///< cpu, gpu
  std::string fixture;
  std::string fixture_path;
  std::vector<std::int64_t> batch_sizes;
  std::vector<BudgetCase> budgets;
  [[nodiscard]] bool gpu() const { return suite == "gpu"; }
  [[nodiscard]] std::string prefix() const { return gpu() ? "Gpu" : "Cpu"; }
};

/// The fixtures one measuring test measures, in one process. On the CPU, the whole suite: LibTorch's start
/// (about 0.35 s) costs more than most tiny twins' probes, so one process measures them all (about 1.7 s for the
/// CPU suite). On a GPU, one fixture each: each holds a GPU (CTest resource groups) and `ctest -R` on one
/// component measures only its fixture.
struct MeasureGroup {
  std::string suite;
  std::string name;  ///< `cpu_suite`, or the fixture's name on a GPU
  std::vector<MeasureCase> fixtures;
  [[nodiscard]] bool gpu() const { return suite == "gpu"; }
  [[nodiscard]] std::string prefix() const { return gpu() ? "Gpu" : "Cpu"; }
  [[nodiscard]] std::string test_name() const { return prefix() + "/MeasureTest.Probes/" + name; }
  /// The CTest fixture its component tests require.
  [[nodiscard]] std::string ctest_fixture() const { return "memgate/" + suite + "/" + name; }
};

// A case prints as its name in GoogleTest's messages.
void PrintTo(const MeasureGroup& g, std::ostream* os) { *os << g.suite << "/" << g.name; }

std::string suites_dir() { return source_dir() + "/fixtures/suites"; }
std::string fixtures_dir() { return source_dir() + "/fixtures/models"; }

// Where the measuring tests leave their verdicts: set by the CTest registration, else beside the working folder.
std::string verdicts_dir() {
  const char* dir = std::getenv("MEMGATE_VERDICTS_DIR");
  return dir != nullptr && *dir != '\0' ? dir : "memgate-verdicts";
}

std::string verdict_path(const std::string& dir, const MeasureCase& c) {
  return dir + "/" + c.suite + "/" + c.fixture + ".json";
}

// A suite that fails to load must fail the run, not silently register no tests.
std::vector<std::string>& load_errors() {
  static std::vector<std::string> errors;
  return errors;
}

Suite suite_or_empty(const std::string& name) {
  try {
    return load_suite(suites_dir() + "/" + name + ".yaml", fixtures_dir());
  } catch (const std::exception& e) {
    load_errors().push_back(e.what());
    return {};
  }
}

std::vector<MeasureCase> measure_cases(const std::string& suite_name) {
  std::vector<MeasureCase> out;
  for (auto& f : suite_fixtures(suite_or_empty(suite_name))) {
    out.push_back({suite_name, std::move(f.name), std::move(f.path), std::move(f.batch_sizes), std::move(f.budgets)});
  }
  return out;
}

std::vector<MeasureGroup> measure_groups(const std::string& suite_name) {
  auto cases = measure_cases(suite_name);
  if (suite_name != "gpu") {
    if (cases.empty()) return {};
    return {{suite_name, suite_name + "_suite", std::move(cases)}};
  }
  std::vector<MeasureGroup> out;
  for (auto& c : cases) out.push_back({suite_name, c.fixture, {std::move(c)}});
  return out;
}

std::vector<BudgetCase> budget_cases(const std::string& suite_name) { return suite_or_empty(suite_name).budgets; }

const GpuSpec& gpu_spec(const std::string& id) {
  static const auto gpus = load_gpus(source_dir() + "/fixtures/gpus");
  return find_gpu(gpus, id);
}

class MeasureTest : public ::testing::TestWithParam<MeasureGroup> {};

// Records the baselines of one fixture (update mode).
void record(const MeasureCase& c, c10::Device device) {
  const auto fixture = load_fixture(c.fixture_path);
  std::vector<ProbeResult> probes;
  for (const auto batch_size : c.batch_sizes) {
    probes.push_back(run_probe(fixture, batch_size, device));
    if (probes.back().oom) {
      throw Error(fmt::format("{} at batch {} ran out of memory: there is nothing to record.\n{}", fixture.name,
                              batch_size, probes.back().error));
    }
  }
  if (probes.empty()) return;
  const auto info = describe_probe_device(device, fixture);
  const auto path = baseline_path(source_dir() + "/baselines", info.slug, fixture.name);
  const bool changed = update_baseline(path, fixture, info, probes, source_commit(source_dir()));
  std::cout << (changed ? "recorded " : "unchanged ") << path << "\n";
}

// Judges one fixture into `file`.
void judge(const MeasureCase& c, c10::Device device, VerdictFile& file) {
  const auto fixture = load_fixture(c.fixture_path);
  std::vector<std::int64_t> budget_sizes;
  for (const auto& b : c.budgets) budget_sizes.push_back(b.batch_size);
  const auto judged = judge_fixture(fixture, c.batch_sizes, device, source_dir() + "/baselines", budget_sizes);
  file.device = judged.device.slug;
  file.components = judged.components;
  for (const auto& b : c.budgets) {
    file.budgets.push_back(evaluate_budget(fixture, *find_probe(judged, b.batch_size), gpu_spec(b.gpu)));
  }
  std::map<Status, int> counts;
  for (const auto& v : file.components) ++counts[v.status];
  std::string line;
  for (const auto& [status, n] : counts) line += fmt::format(", {} {}", n, name_of(kStatusNames, status));
  std::cout << fmt::format("{}: {} probes measured on {}{}\n", fixture.name, judged.probes.size(), judged.device.slug,
                           line);
}

// Measures each batch size of each fixture once and leaves every verdict for the component tests. A fixture that
// cannot be judged (a fixture or baseline that does not load) fails its own component tests with the reason, and
// the others are judged; a regression fails the component that grew. In update mode it records the baselines, and
// fails for each fixture it could not record.
TEST_P(MeasureTest, Probes) {
  const auto& g = GetParam();
  const auto dir = verdicts_dir();
  for (const auto& c : g.fixtures) std::filesystem::remove(verdict_path(dir, c));  // never an earlier run's
  if (g.gpu() && !cuda_available()) {
    const std::string reason = "no GPU on this machine: GPU memory tests run on a GPU runner";
    for (const auto& c : g.fixtures) {
      write_verdict_file(verdict_path(dir, c), {.suite = c.suite, .fixture = c.fixture, .skipped = reason});
    }
    GTEST_SKIP() << reason;
  }
  const auto device = g.gpu() ? gpu_for_test() : c10::Device(c10::DeviceType::CPU);
  for (const auto& c : g.fixtures) {
    if (update_mode()) {
      try {
        record(c, device);
      } catch (const std::exception& e) {
        ADD_FAILURE() << c.fixture << ": " << e.what();
      }
      continue;
    }
    VerdictFile file{.suite = c.suite, .fixture = c.fixture};
    try {
      judge(c, device, file);
    } catch (const std::exception& e) {
      file = {.suite = c.suite, .fixture = c.fixture};
      file.error = e.what();
      std::cout << c.fixture << ": cannot be judged: " << e.what() << "\n";
    }
    write_verdict_file(verdict_path(dir, c), file);
  }
}

std::string measure_name(const ::testing::TestParamInfo<MeasureGroup>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(Cpu, MeasureTest, ::testing::ValuesIn(measure_groups("cpu")), measure_name);
INSTANTIATE_TEST_SUITE_P(Gpu, MeasureTest, ::testing::ValuesIn(measure_groups("gpu")), measure_name);

class BudgetTest : public ::testing::TestWithParam<BudgetCase> {};

// With the caching allocator capped at the GPU's usable memory, the budgeted batch trains; twice the batch does
// not (it runs out of memory or exceeds the budget). It measures under its own cap, so it measures for itself.
TEST_P(BudgetTest, HoldsUnderAllocatorCap) {
  const auto& b = GetParam();
  const auto& target = gpu_spec(b.gpu);
  if (!cuda_available()) GTEST_SKIP() << "no GPU on this machine: allocator caps are confirmed on a GPU runner";
  const auto device = gpu_for_test();
  const auto fixture = load_fixture(b.fixture_path);
  const auto info = describe_device(device);
  const auto cap = target.usable_bytes() - target.outside_allocator_bytes;
  ASSERT_GT(info.total_memory, cap) << "this GPU is smaller than " << target.name << ": cannot emulate it";
  auto backend = make_memory_backend(device);
  ProbeResult fits, above;
  {
    const MemoryFractionScope capped(*backend, static_cast<double>(cap) / static_cast<double>(info.total_memory));
    fits = run_probe(fixture, b.batch_size, device);
    above = run_probe(fixture, 2 * b.batch_size, device);
  }
  EXPECT_FALSE(fits.oom) << b.fixture << " at batch " << b.batch_size << " ran out of memory under a "
                         << cap << "-byte cap (" << target.name << "):\n" << fits.error;
  EXPECT_TRUE(above.oom || !check_budget(above.components.step_peak_reserved, target).fits())
      << b.fixture << " at batch " << 2 * b.batch_size << " fit " << target.name
      << " too: the budget at batch " << b.batch_size << " is not tight";
}

std::string budget_name(const ::testing::TestParamInfo<BudgetCase>& info) { return info.param.name(); }

INSTANTIATE_TEST_SUITE_P(Gpu, BudgetTest, ::testing::ValuesIn(budget_cases("gpu")), budget_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(MeasureTest);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BudgetTest);

TEST(SuiteTest, LoadsEverySuite) {
  (void)measure_groups("cpu");
  (void)measure_groups("gpu");
  for (const auto& e : load_errors()) ADD_FAILURE() << e;
}

// `--memgate_ctest_list`: the CTest registration of every test. Measuring tests (label `measure`) set up one CTest
// fixture each and hold the GPU; the component tests (run by `verdict_binary`) require it, so that `ctest -R` on
// one of them measures first, and a measuring test that fails marks them not run.
void print_ctest_registration(const std::string& binary, const std::string& verdict_binary,
                              const std::string& verdicts) {
  auto quote = [](const std::string& s) { return "[==[" + s + "]==]"; };
  const auto skip = std::string(" SKIP_REGULAR_EXPRESSION [==[\\[  SKIPPED \\]]==]");
  const auto environment = quote("MEMGATE_SOURCE_DIR=" + source_dir() + ";MEMGATE_VERDICTS_DIR=" + verdicts);
  auto add = [&](const std::string& test, const std::string& command) {
    std::cout << "add_test(" << quote(test) << " " << command << ")\n";
  };
  for (const auto& suite : {std::string("cpu"), std::string("gpu")}) {
    for (const auto& g : measure_groups(suite)) {
      add(g.test_name(), quote(binary) + " " + quote("--gtest_filter=" + g.test_name()));
      std::string fixtures;
      for (const auto& c : g.fixtures) fixtures += ";" + c.fixture;
      std::cout << "set_tests_properties(" << quote(g.test_name()) << " PROPERTIES LABELS "
                << quote(suite + ";memory;measure" + fixtures) << " FIXTURES_SETUP " << quote(g.ctest_fixture())
                << skip << " ENVIRONMENT " << environment << (g.gpu() ? " RESOURCE_GROUPS gpus:1" : "")
                << " TIMEOUT 3600)\n";
      for (const auto& c : g.fixtures) {
        const auto file = quote("--memgate_verdicts=" + verdict_path(verdicts, c));
        auto add_verdict = [&](const std::string& test, std::int64_t batch_size, const std::string& what,
                               const std::string& labels) {
          add(test, quote(verdict_binary) + " " + file + " " + quote("--memgate_test=" + test) + " " +
                        quote("--memgate_batch=" + std::to_string(batch_size)) + " " + quote(what));
          std::cout << "set_tests_properties(" << quote(test) << " PROPERTIES LABELS " << quote(labels)
                    << " FIXTURES_REQUIRED " << quote(g.ctest_fixture()) << skip << " ENVIRONMENT " << environment
                    << " TIMEOUT 60)\n";
        };
        for (const auto batch_size : c.batch_sizes) {
          for (const auto& info : kComponentTable) {
            const auto name = fmt::format("{}_bs{}_{}", c.fixture, batch_size, info.name);
            add_verdict(c.prefix() + "/ComponentTest.StaysWithinBaseline/" + name, batch_size,
                        "--memgate_component=" + std::string(info.name),
                        suite + ";memory;" + c.fixture + ";" + std::string(info.name));
          }
        }
        for (const auto& b : c.budgets) {
          add_verdict("Gpu/BudgetTest.FitsGpu/" + b.name(), b.batch_size, "--memgate_budget=" + b.gpu,
                      "gpu;budget;" + b.fixture + ";" + b.gpu);
        }
      }
    }
  }
  for (const auto& b : budget_cases("gpu")) {
    const auto test = "Gpu/BudgetTest.HoldsUnderAllocatorCap/" + b.name();
    add(test, quote(binary) + " " + quote("--gtest_filter=" + test));
    std::cout << "set_tests_properties(" << quote(test) << " PROPERTIES LABELS "
              << quote("gpu;budget;" + b.fixture + ";" + b.gpu) << skip << " ENVIRONMENT " << environment
              << " RESOURCE_GROUPS gpus:1 TIMEOUT 3600)\n";
  }
  add("SuiteTest.LoadsEverySuite", quote(binary) + " " + quote("--gtest_filter=SuiteTest.LoadsEverySuite"));
  std::cout << "set_tests_properties([==[SuiteTest.LoadsEverySuite]==] PROPERTIES LABELS [==[cpu;memory]==] "
               "ENVIRONMENT " << environment << ")\n";
}

}  // namespace
}  // namespace memgate

int main(int argc, char** argv) {
  bool list = false;
  std::string verdict_binary;
  std::string verdicts = "memgate-verdicts";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--memgate_ctest_list") list = true;
    if (arg.starts_with("--memgate_verdict_binary=")) verdict_binary = arg.substr(arg.find('=') + 1);
    if (arg.starts_with("--memgate_verdicts_dir=")) verdicts = arg.substr(arg.find('=') + 1);
  }
  if (list) {
    if (verdict_binary.empty()) {
      std::cerr << "--memgate_ctest_list needs --memgate_verdict_binary=<the component tests' executable>\n";
      return 2;
    }
    memgate::print_ctest_registration(std::filesystem::absolute(argv[0]).string(), verdict_binary, verdicts);
    // The reason goes to CTest, which shows it as the failing `cannot_list_suites` test.
    for (const auto& e : memgate::load_errors()) std::cerr << e << "\n";
    return memgate::load_errors().empty() ? 0 : 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
