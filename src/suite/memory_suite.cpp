// The memory regression suites' measuring side, with main(): the library memgate::memory_suite, which every
// memory-suite executable links (memgate's own and a downstream project's, through memgate_add_memory_suite, with
// the project's registered architectures beside it). One test per suite fixture (per CPU suite) measures each batch
// size once, judges every component against <baselines>/<device>/<fixture>.json and every budget against its GPU,
// and writes the verdicts for the component tests (verdicts_main.cpp), which report them without LibTorch. In update
// mode (MEMGATE_UPDATE_BASELINES=1) it records the baselines instead. `--memgate_ctest_list` prints the CTest
// registration of both sides.
//
// What it reads, from the environment (which the CTest registration sets):
//   MEMGATE_PROJECT_DIR    the project (default: the working folder; MEMGATE_SOURCE_DIR is its older name)
//   MEMGATE_SUITES         suite files separated by ':' (default: every <project>/fixtures/suites/*.yaml); a suite's
//                          fixtures are <its folder>/../models/<name>.yaml
//   MEMGATE_BASELINES_DIR  the baselines (default: <project>/baselines)
//   MEMGATE_DATA_DIR       memgate's own data, for GPU fixtures a project lacks (default: beside the executable)
//   MEMGATE_SNAPSHOTS      `failing` (the default on a GPU): record each probe's allocator history and write it, for
//                          memory_viz, when a component of that probe fails; `off` (the default on the CPU)
//   MEMGATE_SNAPSHOT_DIR   where those go (default: snapshots/ beside the verdicts), <device>/<fixture>_bs<N>.pickle
//                          (a distributed probe: <fixture>_bs<N>_rank<r>.pickle, the failing rank's)
#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/base/process.h"
#include "memgate/base/status.h"
#include "memgate/base/verdict_file.h"
#include "memgate/gate/baseline.h"
#include "memgate/gate/budget.h"
#include "memgate/gate/fixture.h"
#include "memgate/child/rank.h"
#include "memgate/gate/suite.h"
#include "memgate/gate/verdict.h"
#include "memgate/backend/device.h"
#include "memgate/backend/memory_backend.h"
#include "memgate/measure/probe.h"
#include "memgate/launch/run.h"
#include "memgate/report/check_report.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <vector>

namespace memgate {
namespace {

/// One fixture of a suite: the batch sizes its components are gated at and the budgets it is held to.
struct MeasureCase {
  std::string suite;  ///< the suite file's stem: cpu, gpu
  std::string fixture;
  std::string fixture_path;
  std::vector<std::int64_t> batch_sizes;
  std::vector<BudgetCase> budgets;
  bool on_gpu = false;  ///< the suite's device is cuda
  /// A distributed fixture's ranks (its components are gated per rank), 0 for one device.
  std::int64_t world_size = 0;
  /// A Python fixture: its probes run in a Python process of its own.
  bool python = false;
  /// Whether it keeps an EMA copy (training.ema), and so has the component `ema`.
  bool keeps_ema = false;
  /// Whether it offloads activations (training.activation_offload), and so has the component `host_activations`.
  bool offloads_activations = false;
  [[nodiscard]] bool gpu() const { return on_gpu; }
  [[nodiscard]] std::string prefix() const { return gpu() ? "Gpu" : "Cpu"; }
};

/// The fixtures one measuring test measures, in one process. On the CPU, the whole suite but its distributed and
/// Python fixtures (a test each: they start processes of their own): LibTorch's start (about 0.4 s) costs more than
/// most tiny twins' probes, so one process measures them all. On a GPU, one fixture each: each holds a GPU (CTest resource groups) and `ctest -R` on one
/// component measures only its fixture.
struct MeasureGroup {
  std::string suite;
  std::string name;  ///< `<suite>_suite` on the CPU (cpu_suite), or the fixture's name (a GPU's, a distributed or a
                     ///< Python fixture's)
  std::vector<MeasureCase> fixtures;
  bool on_gpu = false;
  std::int64_t world_size = 0;  ///< a distributed fixture's measuring test starts this many rank processes
  [[nodiscard]] bool gpu() const { return on_gpu; }
  [[nodiscard]] std::string prefix() const { return gpu() ? "Gpu" : "Cpu"; }
  [[nodiscard]] std::string test_name() const { return prefix() + "/MeasureTest.Probes/" + name; }
  /// The CTest fixture its component tests require.
  [[nodiscard]] std::string ctest_fixture() const { return "memgate/" + suite + "/" + name; }
};

// A case prints as its name in GoogleTest's messages.
void PrintTo(const MeasureGroup& g, std::ostream* os) { *os << g.suite << "/" << g.name; }

std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

// The suite files: $MEMGATE_SUITES, else every YAML file of <project>/fixtures/suites, sorted.
std::vector<std::string> suite_files() {
  std::vector<std::string> out;
  if (auto list = environment("MEMGATE_SUITES"); !list.empty()) {
    std::size_t start = 0;
    while (start <= list.size()) {
      const auto end = std::min(list.find(':', start), list.size());
      if (end > start) out.push_back(list.substr(start, end - start));
      start = end + 1;
    }
    return out;
  }
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(project_dir() + "/fixtures/suites", ec)) {
    if (entry.path().extension() == ".yaml") out.push_back(entry.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string baselines_dir() {
  auto dir = environment("MEMGATE_BASELINES_DIR");
  return dir.empty() ? project_dir() + "/baselines" : dir;
}

// Where the measuring tests leave their verdicts: set by the CTest registration, else beside the working folder.
std::string verdicts_dir() {
  const char* dir = std::getenv("MEMGATE_VERDICTS_DIR");
  return dir != nullptr && *dir != '\0' ? dir : "memgate-verdicts";
}

// Whether probes record their allocator's history, to be written when one of their components fails.
bool snapshots_of_failures(bool gpu) {
  const auto mode = environment("MEMGATE_SNAPSHOTS");
  if (mode.empty()) return gpu;
  if (mode == "failing") return true;
  if (mode == "off") return false;
  throw Error("MEMGATE_SNAPSHOTS: expected failing or off, got '" + mode + "'");
}

std::string snapshots_dir() {
  const auto dir = environment("MEMGATE_SNAPSHOT_DIR");
  return dir.empty() ? (std::filesystem::path(verdicts_dir()).parent_path() / "memgate-snapshots").string() : dir;
}

std::string verdict_path(const std::string& dir, const MeasureCase& c) {
  return dir + "/" + c.suite + "/" + c.fixture + ".json";
}

// A suite that fails to load must fail the run, not silently register no tests.
std::vector<std::string>& load_errors() {
  static std::vector<std::string> errors;
  return errors;
}

// Every suite, loaded once; one that does not load is an error of the run (and left out).
const std::vector<Suite>& suites() {
  static const auto loaded = [] {
    std::vector<Suite> out;
    const auto files = suite_files();
    if (files.empty()) {
      load_errors().push_back("no suite files: neither MEMGATE_SUITES nor " + project_dir() +
                              "/fixtures/suites/*.yaml names one");
    }
    for (const auto& file : files) {
      try {
        out.push_back(load_suite(file, suite_models_dir(file)));
      } catch (const std::exception& e) {
        load_errors().push_back(e.what());
      }
    }
    return out;
  }();
  return loaded;
}

// What decides where a fixture measures: a distributed fixture's world size (0 for one device), and whether it is a
// Python fixture (its probes run in a Python process of its own). A fixture that does not load is neither: its
// measuring test says why.
struct FixtureKind {
  std::int64_t world_size = 0;
  bool python = false;
  bool keeps_ema = false;
  bool offloads_activations = false;
};

// Whether a fixture did not load while the tests were listed: its measuring test says why, and the listing is not
// kept for the next ctest (what the fixture is decides the tests; see write_listing_inputs).
bool& a_fixture_did_not_load() {
  static bool failed = false;
  return failed;
}

FixtureKind fixture_kind(const std::string& fixture_path) {
  try {
    const auto fixture = load_fixture(fixture_path);
    return {fixture.training.distributed.enabled() ? fixture.training.distributed.world_size : 0,
            fixture.model.arch == Arch::kPython, fixture.training.ema_decay > 0.0,
            fixture.training.activation_offload != ActivationOffload::kNone};
  } catch (const std::exception&) {
    a_fixture_did_not_load() = true;
    return {};
  }
}

std::int64_t distributed_world_size(const std::string& fixture_path) { return fixture_kind(fixture_path).world_size; }

// The measuring tests of the CPU suites (gpu = false: one per suite) or the GPU suites (one per fixture). Two
// measuring tests of one name (a fixture in two GPU suites, two CPU suites of one stem) are an error.
std::vector<MeasureGroup> measure_groups(bool gpu) {
  std::vector<MeasureGroup> out;
  for (const auto& suite : suites()) {
    const bool on_gpu = suite.device == SuiteDevice::kCuda;
    if (on_gpu != gpu) continue;
    std::vector<MeasureCase> cases;
    for (auto& f : suite_fixtures(suite)) {
      const auto kind = fixture_kind(f.path);
      cases.push_back({suite.name, std::move(f.name), std::move(f.path), std::move(f.batch_sizes),
                       std::move(f.budgets), on_gpu, kind.world_size, kind.python, kind.keeps_ema,
                       kind.offloads_activations});
    }
    if (!gpu) {
      // A distributed fixture measures in a test of its own, which starts its ranks (CTest PROCESSORS); so does a
      // Python fixture, whose probes wait on a Python process (its imports take seconds): ctest -j runs them beside
      // the rest of the suite, whose bytes do not depend on it.
      std::vector<MeasureCase> together;
      for (auto& c : cases) {
        if (c.world_size > 0 || c.python) {
          const auto ranks = c.world_size;
          out.push_back({suite.name, c.fixture, {std::move(c)}, false, ranks});
        } else {
          together.push_back(std::move(c));
        }
      }
      if (!together.empty()) out.push_back({suite.name, suite.name + "_suite", std::move(together), false});
      continue;
    }
    for (auto& c : cases) {
      const auto ranks = c.world_size;
      out.push_back({suite.name, c.fixture, {std::move(c)}, true, ranks});
    }
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (out[i].name == out[j].name) {
        load_errors().push_back(fmt::format("two measuring tests named {}: suites {} and {} (a GPU fixture may be in "
                                            "one GPU suite only, suite files need distinct names)",
                                            out[i].test_name(), out[j].suite, out[i].suite));
      }
    }
  }
  return out;
}

std::vector<BudgetCase> gpu_budget_cases() {
  std::vector<BudgetCase> out;
  for (const auto& suite : suites()) {
    if (suite.device == SuiteDevice::kCuda) out.insert(out.end(), suite.budgets.begin(), suite.budgets.end());
  }
  return out;
}

const GpuSpec& gpu_spec(const std::string& id) {
  static const auto gpus = load_gpus(gpus_dir(project_dir()));
  return find_gpu(gpus, id);
}

class MeasureTest : public ::testing::TestWithParam<MeasureGroup> {};

// A case's fixture with the CPU kernels the run asks for (MEMGATE_CPU_KERNELS).
Fixture load_case_fixture(const MeasureCase& c) {
  auto fixture = load_fixture(c.fixture_path);
  override_cpu_kernels(fixture, environment("MEMGATE_CPU_KERNELS"), "MEMGATE_CPU_KERNELS");
  return fixture;
}

// The GPUs a distributed fixture's ranks have on this machine: fewer than its ranks need, or CTest's assignment.
int visible_gpus() { return cuda_available() ? static_cast<int>(torch::cuda::device_count()) : 0; }

// The probe options of a fixture's measuring test: on GPUs, a distributed fixture's ranks on the GPUs CTest gave it.
ProbeOptions measure_options(const MeasureGroup& g) {
  ProbeOptions options;
  if (g.gpu() && g.world_size > 0) options.rank_devices = gpus_for_test(static_cast<int>(g.world_size));
  return options;
}

// Records the baselines of one fixture (update mode).
void record(const MeasureCase& c, c10::Device device, const ProbeOptions& options) {
  const auto fixture = load_case_fixture(c);
  if (c.batch_sizes.empty()) return;
  const auto recorded = record_fixture(fixture, c.batch_sizes, device, baselines_dir(), options);
  std::cout << (recorded.changed ? "recorded " : "unchanged ") << recorded.path << "\n";
}

// Writes the allocator history of each probe with a failing component where memory_viz opens it, and says where in
// those components' messages.
// A distributed probe's failing component is a rank's (rank1_step_peak): its rank's history, <fixture>_bs<N>_rank<r>.
void write_failure_snapshots(const FixtureVerdicts& judged, std::vector<ComponentVerdict>& verdicts) {
  std::map<std::pair<std::int64_t, int>, std::string> written;  // (batch size, rank or -1) -> file
  for (auto& v : verdicts) {
    if (!fails(v.status, strict_mode())) continue;
    const auto* probe = find_probe(judged, v.batch_size);
    if (probe == nullptr) continue;
    int rank = -1;
    const std::string* snapshot = &probe->snapshot;
    if (!probe->rank_snapshots.empty()) {
      const auto parsed = parse_rank_component(v.component);
      if (!parsed || parsed->first < 0 || static_cast<std::size_t>(parsed->first) >= probe->rank_snapshots.size()) {
        continue;
      }
      rank = parsed->first;
      snapshot = &probe->rank_snapshots[static_cast<std::size_t>(rank)];
    }
    if (snapshot->empty()) continue;
    auto [at, added] = written.try_emplace({v.batch_size, rank});
    if (added) {
      at->second = fmt::format("{}/{}/{}_bs{}{}.pickle", snapshots_dir(), judged.device.slug, v.fixture, v.batch_size,
                               rank < 0 ? "" : fmt::format("_rank{}", rank));
      std::filesystem::create_directories(std::filesystem::path(at->second).parent_path());
      write_file_atomically(at->second, *snapshot);
      std::cout << fmt::format("{} at batch {}{}: wrote the allocator's history to {}\n", v.fixture, v.batch_size,
                               rank < 0 ? "" : fmt::format(", rank {}", rank), at->second);
    }
    v.message += fmt::format("\n  memory_viz snapshot of this probe: {} (drag it onto https://pytorch.org/memory_viz)",
                             std::filesystem::absolute(at->second).string());
  }
}

// Judges one fixture into `file`.
void judge(const MeasureCase& c, c10::Device device, ProbeOptions options, VerdictFile& file) {
  const auto fixture = load_case_fixture(c);
  std::vector<std::int64_t> budget_sizes;
  for (const auto& b : c.budgets) budget_sizes.push_back(b.batch_size);
  if (snapshots_of_failures(device.is_cuda())) options.snapshot = SnapshotOptions{};
  const auto judged = judge_fixture(fixture, c.batch_sizes, device, baselines_dir(), budget_sizes, options);
  file.device = judged.device.slug;
  file.components = judged.components;
  write_failure_snapshots(judged, file.components);
  for (const auto& b : c.budgets) {
    file.budgets.push_back(evaluate_budget(fixture, *find_probe(judged, b.batch_size), gpu_spec(b.gpu)));
  }
  std::cout << render_judged_fixture_line(fixture.name, judged.probes.size(), judged.device.slug,
                                          compared_components(file.components), file.components);
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
  if (g.gpu() && g.world_size > visible_gpus()) {
    const auto reason = fmt::format("{} ranks need a GPU each (NCCL) and this runner has {}: measure it on a runner "
                                    "with {} GPUs; its budgets are checked by estimate (memgate estimate --suite)",
                                    g.world_size, visible_gpus(), g.world_size);
    for (const auto& c : g.fixtures) {
      write_verdict_file(verdict_path(dir, c), {.suite = c.suite, .fixture = c.fixture, .skipped = reason});
    }
    GTEST_SKIP() << reason;
  }
  const auto options = measure_options(g);
  // On GPUs: the test's GPU, or a distributed fixture's rank 0's (the GPU its baselines are recorded for).
  const auto device = !g.gpu()                ? c10::Device(c10::DeviceType::CPU)
                      : options.rank_devices.empty() ? gpu_for_test()
                                                     : c10::Device(c10::DeviceType::CUDA, options.rank_devices.front());
  for (const auto& c : g.fixtures) {
    if (update_mode()) {
      try {
        record(c, device, options);
      } catch (const std::exception& e) {
        ADD_FAILURE() << c.fixture << ": " << e.what();
      }
      continue;
    }
    VerdictFile file{.suite = c.suite, .fixture = c.fixture};
    try {
      judge(c, device, options, file);
    } catch (const std::exception& e) {
      file = {.suite = c.suite, .fixture = c.fixture};
      file.error = e.what();
      std::cout << c.fixture << ": cannot be judged: " << e.what() << "\n";
      // A fixture without batch sizes (one that did not load, so its own are unknown) has no component tests to
      // say so: this test does.
      if (c.batch_sizes.empty()) ADD_FAILURE() << c.fixture << " cannot be judged: " << e.what();
    }
    write_verdict_file(verdict_path(dir, c), file);
  }
}

std::string measure_name(const ::testing::TestParamInfo<MeasureGroup>& info) { return info.param.name; }

// GoogleTest evaluates these when main() registers the tests, after every static initialiser: a downstream
// program's register_architecture calls have run by then, so its fixtures load.
INSTANTIATE_TEST_SUITE_P(Cpu, MeasureTest, ::testing::ValuesIn(measure_groups(false)), measure_name);
INSTANTIATE_TEST_SUITE_P(Gpu, MeasureTest, ::testing::ValuesIn(measure_groups(true)), measure_name);

class BudgetTest : public ::testing::TestWithParam<BudgetCase> {};

// With the caching allocator capped at the GPU's usable memory, the budgeted batch trains; twice the batch does
// not (it runs out of memory or exceeds the budget). It measures under its own cap, so it measures for itself.
TEST_P(BudgetTest, HoldsUnderAllocatorCap) {
  const auto& b = GetParam();
  const auto& target = gpu_spec(b.gpu);
  if (!cuda_available()) GTEST_SKIP() << "no GPU on this machine: allocator caps are confirmed on a GPU runner";
  const auto ranks = static_cast<int>(distributed_world_size(GetParam().fixture_path));
  if (ranks > visible_gpus()) {
    GTEST_SKIP() << ranks << " ranks need a GPU each (NCCL) and this runner has " << visible_gpus()
                 << ": memgate estimate --suite checks this budget";
  }
  // A distributed fixture's ranks each on a GPU CTest gave it, each rank's allocator capped (run_probe_capped).
  ProbeOptions options;
  if (ranks > 0) options.rank_devices = gpus_for_test(ranks);
  const auto device = ranks > 0 ? c10::Device(c10::DeviceType::CUDA, options.rank_devices.front()) : gpu_for_test();
  const auto fixture = load_fixture(b.fixture_path);
  const auto info = describe_device(device);
  const auto cap = target.usable_bytes();
  ASSERT_GT(info.total_memory, cap) << "this GPU is smaller than " << target.name << ": cannot emulate it";
  const auto fits = run_probe_capped(fixture, b.batch_size, device, cap, options);
  const auto above = run_probe_capped(fixture, 2 * b.batch_size, device, cap, options);
  EXPECT_FALSE(fits.oom) << b.fixture << " at batch " << b.batch_size << " ran out of memory under a "
                         << cap << "-byte cap (" << target.name << "):\n" << fits.error;
  EXPECT_TRUE(above.oom || !check_budget(above.components.step_peak_reserved, target).fits())
      << b.fixture << " at batch " << 2 * b.batch_size << " fit " << target.name
      << " too: the budget at batch " << b.batch_size << " is not tight";
}

std::string budget_name(const ::testing::TestParamInfo<BudgetCase>& info) { return info.param.name(); }

INSTANTIATE_TEST_SUITE_P(Gpu, BudgetTest, ::testing::ValuesIn(gpu_budget_cases()), budget_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(MeasureTest);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BudgetTest);

TEST(SuiteTest, LoadsEverySuite) {
  (void)measure_groups(false);
  (void)measure_groups(true);
  for (const auto& e : load_errors()) ADD_FAILURE() << e;
}

// `--memgate_ctest_list`: the CTest registration of every test. Measuring tests (label `measure`) set up one CTest
// fixture each and hold the GPU; the component tests (run by `verdict_binary`) require it, so that `ctest -R` on one of
// them measures first, and a measuring test that fails marks them not run.
// The resources a test holds: a GPU, or on the CPU one processor per two ranks. A CPU probe's ranks wait on each other
// at every collective: the CPU suite's two-rank probes kept 0.85 of a core busy (CPU time over wall time, measured
// alone), and a test that claimed two cores idled one while it ran and waited until two came free together. Their bytes
// do not depend on how busy the cores are. A distributed fixture on GPUs holds a GPU per rank
// (RESOURCE_GROUPS N,gpus:1) where the runner has that many (the listing runs on the runner, when ctest starts); where
// it has fewer, it holds none and skips, so that the runner still passes its suite (CTest would not run it:
// "insufficient resources").
std::string gpu_resources(std::int64_t world_size) {
  if (world_size == 0) return " RESOURCE_GROUPS gpus:1";
  return world_size <= visible_gpus() ? fmt::format(" RESOURCE_GROUPS {},gpus:1", world_size) : std::string();
}

std::string resources(const MeasureGroup& g) {
  if (g.gpu()) return gpu_resources(g.world_size);
  return g.world_size > 1 ? fmt::format(" PROCESSORS {}", (g.world_size + 1) / 2) : std::string();
}

void print_ctest_registration(const std::string& binary, const std::string& verdict_binary,
                              const std::string& verdicts) {
  auto quote = [](const std::string& s) { return "[==[" + s + "]==]"; };
  const auto skip = std::string(" SKIP_REGULAR_EXPRESSION [==[\\[  SKIPPED \\]]==]");
  // What this listing read, so that each test reads the same (and not the environment ctest happens to run in).
  std::string suites_list;
  for (const auto& s : suites()) suites_list += (suites_list.empty() ? "" : ":") + s.path;
  std::string env = "MEMGATE_PROJECT_DIR=" + project_dir() + ";MEMGATE_SUITES=" + suites_list +
                    ";MEMGATE_BASELINES_DIR=" + baselines_dir() + ";MEMGATE_VERDICTS_DIR=" + verdicts;
  if (auto data = environment("MEMGATE_DATA_DIR"); !data.empty()) env += ";MEMGATE_DATA_DIR=" + data;
  const auto environment = quote(env);
  auto add = [&](const std::string& test, const std::string& command) {
    std::cout << "add_test(" << quote(test) << " " << command << ")\n";
  };
  for (const bool gpu : {false, true}) {
    for (const auto& g : measure_groups(gpu)) {
      add(g.test_name(), quote(binary) + " " + quote("--gtest_filter=" + g.test_name()));
      std::string fixtures;
      for (const auto& c : g.fixtures) fixtures += ";" + c.fixture;
      std::cout << "set_tests_properties(" << quote(g.test_name()) << " PROPERTIES LABELS "
                << quote(std::string(gpu ? "gpu" : "cpu") + ";memory;measure" + fixtures) << " FIXTURES_SETUP " << quote(g.ctest_fixture())
                << skip << " ENVIRONMENT " << environment << resources(g) << " TIMEOUT 3600)\n";
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
          // A distributed fixture's components per rank: <fixture>_bs<N>_rank<R>_<component>.
          for (std::int64_t r = 0; r < std::max<std::int64_t>(c.world_size, 1); ++r) {
            for (const auto& info : kComponentTable) {
              if (info.present == &Components::keeps_ema && !c.keeps_ema) continue;
              if (info.present == &Components::offloads_activations && !c.offloads_activations) continue;
              if (info.present == &Components::offloads_state) continue;  // estimated for CUDA only
              const auto component = c.world_size > 0 ? rank_component_name(static_cast<int>(r), info.name)
                                                      : std::string(info.name);
              const auto name = fmt::format("{}_bs{}_{}", c.fixture, batch_size, component);
              add_verdict(c.prefix() + "/ComponentTest.StaysWithinBaseline/" + name, batch_size,
                          "--memgate_component=" + component,
                          std::string(gpu ? "gpu" : "cpu") + ";memory;" + c.fixture + ";" + std::string(info.name) +
                              (c.world_size > 0 ? ";distributed;rank" + std::to_string(r) : ""));
            }
          }
        }
        for (const auto& b : c.budgets) {
          add_verdict("Gpu/BudgetTest.FitsGpu/" + b.name(), b.batch_size, "--memgate_budget=" + b.gpu,
                      "gpu;budget;" + b.fixture + ";" + b.gpu);
        }
      }
    }
  }
  for (const auto& b : gpu_budget_cases()) {
    const auto test = "Gpu/BudgetTest.HoldsUnderAllocatorCap/" + b.name();
    add(test, quote(binary) + " " + quote("--gtest_filter=" + test));
    std::cout << "set_tests_properties(" << quote(test) << " PROPERTIES LABELS "
              << quote("gpu;budget;" + b.fixture + ";" + b.gpu) << skip << " ENVIRONMENT " << environment
              << gpu_resources(distributed_world_size(b.fixture_path)) << " TIMEOUT 3600)\n";
  }
  add("SuiteTest.LoadsEverySuite", quote(binary) + " " + quote("--gtest_filter=SuiteTest.LoadsEverySuite"));
  std::cout << "set_tests_properties([==[SuiteTest.LoadsEverySuite]==] PROPERTIES LABELS [==[cpu;memory]==] "
               "ENVIRONMENT " << environment << ")\n";
}

// The files and folders the listing read, one absolute path a line, into `path`: the suite files (and their folder
// where no MEMGATE_SUITES names them), each suite's fixtures and their folders, the GPUs' folder and its files. The
// next ctest reuses the listing while none of them is newer than it (cmake/MemgateListMemoryTests.cmake): a folder's
// time changes as a file in it is added, removed or renamed. `path` is removed, and nothing written, when a suite or a
// fixture did not load: each ctest then lists again and says why.
void write_listing_inputs(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::remove(path, ec);
  if (!load_errors().empty() || a_fixture_did_not_load()) return;
  std::set<std::string> inputs;
  auto add = [&](const fs::path& p) { inputs.insert(fs::absolute(p, ec).lexically_normal().string()); };
  auto add_with_folder = [&](const fs::path& file) {
    add(file);
    add(fs::absolute(file, ec).parent_path());
  };
  if (environment("MEMGATE_SUITES").empty()) add(project_dir() + "/fixtures/suites");
  for (const auto& suite : suites()) {
    add_with_folder(suite.path);
    add(suite_models_dir(suite.path));
    for (const auto& f : suite_fixtures(suite)) add_with_folder(f.path);
  }
  const fs::path gpus = gpus_dir(project_dir());
  add(gpus);
  for (const auto& entry : fs::directory_iterator(gpus, ec)) add(entry.path());
  std::string text;
  for (const auto& input : inputs) text += input + "\n";
  write_file_atomically(path, text);
}

}  // namespace
}  // namespace memgate

namespace {

int suite_main(int argc, char** argv) {
  // A rank of a distributed fixture's probe: this executable, so that the project's architectures are there.
  if (memgate::is_rank_command(argc, argv)) return memgate::rank_main(argc, argv);
  bool list = false;
  std::string verdict_binary;
  std::string verdicts = "memgate-verdicts";
  std::string inputs;  // --memgate_ctest_inputs=<file>: where the listing says what it read
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--memgate_ctest_list") list = true;
    if (arg.starts_with("--memgate_verdict_binary=")) verdict_binary = arg.substr(arg.find('=') + 1);
    if (arg.starts_with("--memgate_verdicts_dir=")) verdicts = arg.substr(arg.find('=') + 1);
    if (arg.starts_with("--memgate_ctest_inputs=")) inputs = arg.substr(arg.find('=') + 1);
  }
  if (list) {
    if (verdict_binary.empty()) {
      std::cerr << "--memgate_ctest_list needs --memgate_verdict_binary=<the component tests' executable>\n";
      return 2;
    }
    memgate::print_ctest_registration(std::filesystem::absolute(argv[0]).string(), verdict_binary, verdicts);
    // The reason goes to CTest, which shows it as the failing `cannot_list_suites` test.
    for (const auto& e : memgate::load_errors()) std::cerr << e << "\n";
    if (!inputs.empty()) memgate::write_listing_inputs(inputs);
    return memgate::load_errors().empty() ? 0 : 1;
  }
  try {
    memgate::check_env_switches();  // MEMGATE_STRICT=maybe: said once, as the program's error, before any test
  } catch (const memgate::Error& e) {
    std::cerr << "memgate: " << e.what() << "\n";
    return 2;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

}  // namespace

// Without LibTorch's static destructors (base/process.h): each of the suite's CTest tests is a process of this.
int main(int argc, char** argv) { memgate::exit_fast(suite_main(argc, argv)); }
