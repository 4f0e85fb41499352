// The memory regression suites: one GoogleTest per fixture x batch size x component, from fixtures/suites/*.yaml,
// asserted against baselines/<device>/<fixture>.json, and one per budget. A probe is measured once per process.
#include "memgate/gate/baseline.h"
#include "memgate/gate/budget.h"
#include "memgate/measure/device.h"
#include "memgate/base/error.h"
#include "memgate/gate/fixture.h"
#include "memgate/measure/memory_backend.h"
#include "memgate/measure/probe.h"
#include "memgate/gate/suite.h"
#include "memgate/gate/verdict.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>

namespace memgate {
namespace {

struct ComponentCase {
  ProbeCase probe;
  std::string component;
  bool gpu = false;
  [[nodiscard]] std::string name() const { return probe.name() + "_" + component; }
};

std::string suites_dir() { return source_dir() + "/fixtures/suites"; }
std::string fixtures_dir() { return source_dir() + "/fixtures/models"; }

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

std::vector<ComponentCase> component_cases(const std::string& suite_name) {
  std::vector<ComponentCase> out;
  const auto suite = suite_or_empty(suite_name);
  for (const auto& probe : suite.probes) {
    for (const auto& info : kComponentTable) {
      out.push_back({probe, std::string(info.name), suite.device == SuiteDevice::kCuda});
    }
  }
  return out;
}

std::vector<BudgetCase> budget_cases(const std::string& suite_name) { return suite_or_empty(suite_name).budgets; }

// The GPU CTest handed this test (CTEST_RESOURCE_GROUP_0_GPUS="id:N,slots:1"), else GPU 0 when it is the only one.
c10::Device gpu_for_test() {
  if (const char* spec = std::getenv("CTEST_RESOURCE_GROUP_0_GPUS")) {
    std::string s = spec;
    auto id = s.find("id:");
    if (id != std::string::npos) return {c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(std::stoi(s.substr(id + 3)))};
  }
  if (torch::cuda::device_count() > 1) {
    throw Error("several GPUs are visible and CTest assigned none to this test: run the `gpu` test preset (it "
                "passes a resource spec file), or set CUDA_VISIBLE_DEVICES to one GPU");
  }
  return {c10::DeviceType::CUDA, 0};
}

// One measurement per probe per process, shared by its component tests.
const ProbeResult& measured(const Fixture& fixture, std::int64_t batch_size, c10::Device device) {
  static std::mutex mutex;
  static std::map<std::string, ProbeResult> cache;
  std::lock_guard lock(mutex);
  const auto key = device.str() + "/" + fixture.name + "/" + std::to_string(batch_size);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, run_probe(fixture, batch_size, device)).first;
  return it->second;
}

const Fixture& fixture_at(const std::string& path) {
  static std::map<std::string, Fixture> cache;
  auto it = cache.find(path);
  if (it == cache.end()) it = cache.emplace(path, load_fixture(path)).first;
  return it->second;
}

const DeviceInfo& device_info(c10::Device device, const Fixture& fixture) {
  static std::map<std::string, DeviceInfo> cache;
  const auto key = device.str() + "/" + fixture.training.allocator;
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, describe_probe_device(device, fixture)).first;
  return it->second;
}

// One line per test into $MEMGATE_RESULTS (JSON lines), for `memgate summary`.
void record_result(const nlohmann::json& row) {
  const char* path = std::getenv("MEMGATE_RESULTS");
  if (path == nullptr || *path == '\0') return;
  std::ofstream out(path, std::ios::app);
  out << row.dump() << "\n";
}

class ComponentTest : public ::testing::TestWithParam<ComponentCase> {};

TEST_P(ComponentTest, StaysWithinBaseline) {
  const auto& c = GetParam();
  if (c.gpu && !cuda_available()) GTEST_SKIP() << "no GPU on this machine: GPU memory tests run on a GPU runner";
  const auto device = c.gpu ? gpu_for_test() : c10::Device(c10::DeviceType::CPU);
  const auto& fixture = fixture_at(c.probe.fixture_path);
  const auto& info = device_info(device, fixture);
  const auto path = baseline_path(source_dir() + "/baselines", info.slug, fixture.name);
  const auto test_name = std::string(c.gpu ? "Gpu" : "Cpu") + "/ComponentTest.StaysWithinBaseline/" + c.name();
  nlohmann::json row = {{"test", test_name}, {"fixture", fixture.name}, {"batch_size", c.probe.batch_size},
                        {"component", c.component}, {"device", info.slug}};

  if (update_mode()) {
    const auto& probe = measured(fixture, c.probe.batch_size, device);
    ASSERT_FALSE(probe.oom) << fixture.name << " at batch " << c.probe.batch_size
                            << " ran out of memory: there is nothing to record.\n" << probe.error;
    const bool changed = update_baseline(path, fixture, info, {probe}, source_commit(source_dir()));
    std::cout << (changed ? "recorded " : "unchanged ") << path << " (batch " << c.probe.batch_size << ")\n";
    return;
  }
  std::optional<Baseline> baseline;
  if (std::filesystem::exists(path)) baseline = load_baseline(path);
  // A missing or changed baseline is judged before anything is measured: it needs no probe.
  const auto* recorded = baseline ? baseline->find(c.probe.batch_size) : nullptr;
  ProbeResult unmeasured;
  unmeasured.batch_size = c.probe.batch_size;
  const bool measure = recorded != nullptr && recorded->fixture_hash() == fixture.hash;
  const auto& probe = measure ? measured(fixture, c.probe.batch_size, device) : unmeasured;
  const auto v = evaluate_component(fixture, probe, c.component, baseline ? &*baseline : nullptr, path, info);
  row["status"] = std::string(name_of(kStatusNames, v.status));
  if (v.baseline) row["baseline"] = *v.baseline;
  if (v.measured) row["measured"] = *v.measured;
  if (v.allowed) row["allowed"] = *v.allowed;
  record_result(row);
  if (v.baseline) RecordProperty("baseline_bytes", std::to_string(*v.baseline));
  if (v.measured) RecordProperty("measured_bytes", std::to_string(*v.measured));
  const bool strict = strict_mode();
  switch (v.status) {
    case Status::kOk: break;
    case Status::kMissing:
      if (strict) FAIL() << v.message << " (strict mode)";
      GTEST_SKIP() << v.message;
    case Status::kStale:
      if (strict) ADD_FAILURE() << v.message << "\n  (MEMGATE_STRICT=1 fails stale baselines)";
      else std::cout << "[ NOTICE   ] " << v.message << "\n";
      break;
    default: ADD_FAILURE() << v.message;
  }
}

// A case prints as its name in GoogleTest's messages (not as 112 bytes of hex).
void PrintTo(const ComponentCase& c, std::ostream* os) { *os << c.name(); }

std::string case_name(const ::testing::TestParamInfo<ComponentCase>& info) { return info.param.name(); }

INSTANTIATE_TEST_SUITE_P(Cpu, ComponentTest, ::testing::ValuesIn(component_cases("cpu")), case_name);

class BudgetTest : public ::testing::TestWithParam<BudgetCase> {
 protected:
  const GpuSpec& gpu() {
    static const auto gpus = load_gpus(source_dir() + "/fixtures/gpus");
    return find_gpu(gpus, GetParam().gpu);
  }
};

// The measured step (reserved bytes + what lives outside the allocator) fits the GPU's usable memory.
TEST_P(BudgetTest, FitsGpu) {
  const auto& b = GetParam();
  const auto& target = gpu();
  if (!cuda_available()) GTEST_SKIP() << "no GPU on this machine: budgets are measured on a GPU runner";
  const auto& fixture = fixture_at(b.fixture_path);
  const auto& probe = measured(fixture, b.batch_size, gpu_for_test());
  ASSERT_FALSE(probe.oom) << b.fixture << " at batch " << b.batch_size << " ran out of memory on this GPU";
  const auto check = check_budget(probe.components.step_peak_reserved, target);
  EXPECT_TRUE(check.fits()) << b.fixture << " at batch " << b.batch_size << " does not fit " << target.name
                            << ": needs " << check.required << " bytes (step_peak_reserved "
                            << probe.components.step_peak_reserved << " + outside the allocator "
                            << target.outside_allocator_bytes << "), usable " << check.available << " ("
                            << target.usable_fraction << " x " << target.memory_bytes << "); over by "
                            << -check.headroom() << " bytes";
}

// With the caching allocator capped at the GPU's usable memory, the budgeted batch trains; twice the batch does
// not (it runs out of memory or exceeds the budget).
TEST_P(BudgetTest, HoldsUnderAllocatorCap) {
  const auto& b = GetParam();
  const auto& target = gpu();
  if (!cuda_available()) GTEST_SKIP() << "no GPU on this machine: allocator caps are confirmed on a GPU runner";
  const auto device = gpu_for_test();
  const auto& fixture = fixture_at(b.fixture_path);
  const auto info = describe_device(device);
  const auto cap = target.usable_bytes() - target.outside_allocator_bytes;
  ASSERT_GT(info.total_memory, cap) << "this GPU is smaller than " << target.name << ": cannot emulate it";
  auto backend = make_memory_backend(device);
  backend->set_memory_fraction(static_cast<double>(cap) / static_cast<double>(info.total_memory));
  const auto fits = run_probe(fixture, b.batch_size, device);
  const auto above = run_probe(fixture, 2 * b.batch_size, device);
  backend->set_memory_fraction(1.0);
  EXPECT_FALSE(fits.oom) << b.fixture << " at batch " << b.batch_size << " ran out of memory under a "
                         << cap << "-byte cap (" << target.name << "):\n" << fits.error;
  EXPECT_TRUE(above.oom || !check_budget(above.components.step_peak_reserved, target).fits())
      << b.fixture << " at batch " << 2 * b.batch_size << " fit " << target.name
      << " too: the budget at batch " << b.batch_size << " is not tight";
}

std::string budget_name(const ::testing::TestParamInfo<BudgetCase>& info) { return info.param.name(); }

INSTANTIATE_TEST_SUITE_P(Gpu, ComponentTest, ::testing::ValuesIn(component_cases("gpu")), case_name);
INSTANTIATE_TEST_SUITE_P(Gpu, BudgetTest, ::testing::ValuesIn(budget_cases("gpu")), budget_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BudgetTest);

TEST(SuiteTest, LoadsEverySuite) {
  (void)component_cases("cpu");
  (void)component_cases("gpu");
  for (const auto& e : load_errors()) ADD_FAILURE() << e;
}

// `--memgate_ctest_list`: prints the CTest registration of every test, with labels and GPU resource groups.
void print_ctest_registration(const std::string& binary) {
  auto quote = [](const std::string& s) { return "[==[" + s + "]==]"; };
  auto emit = [&](const std::string& test, const std::string& labels, bool gpu) {
    std::cout << "add_test(" << quote(test) << " " << quote(binary) << " " << quote("--gtest_filter=" + test) << ")\n";
    std::cout << "set_tests_properties(" << quote(test) << " PROPERTIES LABELS " << quote(labels)
              << " SKIP_REGULAR_EXPRESSION [==[\\[  SKIPPED \\]]==] ENVIRONMENT "
              << quote("MEMGATE_SOURCE_DIR=" + source_dir()) << (gpu ? " RESOURCE_GROUPS gpus:1" : "")
              << " TIMEOUT 1800)\n";
  };
  for (const auto& suite : {std::string("cpu"), std::string("gpu")}) {
    const bool gpu = suite == "gpu";
    for (const auto& c : component_cases(suite)) {
      emit(std::string(gpu ? "Gpu" : "Cpu") + "/ComponentTest.StaysWithinBaseline/" + c.name(),
           std::string(gpu ? "gpu" : "cpu") + ";memory;" + c.probe.fixture + ";" + c.component, gpu);
    }
  }
  for (const auto& b : budget_cases("gpu")) {
    for (const auto* test : {"FitsGpu", "HoldsUnderAllocatorCap"}) {
      emit(std::string("Gpu/BudgetTest.") + test + "/" + b.name(), "gpu;budget;" + b.fixture + ";" + b.gpu, true);
    }
  }
  emit("SuiteTest.LoadsEverySuite", "cpu;memory", false);
}

}  // namespace
}  // namespace memgate

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--memgate_ctest_list") {
      memgate::print_ctest_registration(std::filesystem::absolute(argv[0]).string());
      return memgate::load_errors().empty() ? 0 : 1;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
