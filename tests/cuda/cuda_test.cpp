// The CUDA unit tests: labelled `gpu`, so the `gpu` preset runs them on a GPU runner; without a GPU they skip.
#include "memgate/base/files.h"
#include "memgate/gate/advise.h"
#include "memgate/gate/baseline.h"
#include "memgate/gate/fixture.h"
#include "memgate/gate/suite.h"
#include "memgate/measure/estimate.h"
#include "memgate/measure/device.h"
#include "memgate/measure/probe.h"
#include "memgate/models/model.h"
#include "fixture_util.h"
#include "probe_order.h"
#include "test_util.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <iostream>
#include <string>

namespace memgate {
namespace {

using testing::fixture_from;
using testing::tiny_vit_yaml;

const c10::Device kCpu(c10::DeviceType::CPU);

// The CUDA backend end to end: allocated bytes repeat, reserved covers allocated, params are the tensors' bytes
// rounded up to the caching allocator's 512-byte blocks.
TEST(CudaProbeTest, MeasuresOnCudaRepeatably) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU on this machine: the CUDA backend is tested on a GPU runner";
  const auto gpu = gpu_for_test();
  const auto f = fixture_from(tiny_vit_yaml("  trainable: lora\n", "  lora: {rank: 4}\n"));
  const auto a = run_probe(f, 4, gpu), b = run_probe(f, 4, gpu);
  ASSERT_FALSE(a.oom) << a.error;
  EXPECT_EQ(a.components.params, b.components.params);
  EXPECT_EQ(a.components.activations, b.components.activations);
  EXPECT_EQ(a.components.step_peak, b.components.step_peak);
  EXPECT_GE(a.components.step_peak_reserved, a.components.step_peak);
  auto model = build_model(f.model, kCpu);
  EXPECT_GE(a.components.params, parameter_and_buffer_bytes(model->module()));
  EXPECT_EQ(a.components.gradients % 512, 0);
  EXPECT_EQ(a.library_workspace_bytes, b.library_workspace_bytes);
  // The context and the modules loaded so far: more than nothing, less than a GB with lazy loading.
  EXPECT_GT(a.outside_allocator_bytes, 0);
  EXPECT_LT(a.outside_allocator_bytes, std::int64_t{1} << 30);
  std::cout << "outside the allocator: " << a.outside_allocator_bytes << " bytes; library workspaces: "
            << a.library_workspace_bytes << " bytes\n";
}

// The caching allocator's own history, through torch::cuda::_record_memory_history: recording changes no byte, and
// the pickle reads back in Python as memory_viz reads it.
TEST(CudaSnapshotTest, RecordsTheCachingAllocatorsHistoryForMemoryViz) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU on this machine: CUDA snapshots are tested on a GPU runner";
  const auto gpu = gpu_for_test();
  const auto f = fixture_from(tiny_vit_yaml());
  const auto plain = run_probe(f, 4, gpu);
  ProbeOptions options;
  options.snapshot = SnapshotOptions{};
  const auto recorded = run_probe(f, 4, gpu, options);
  ASSERT_FALSE(recorded.oom) << recorded.error;
  EXPECT_EQ(recorded.components, plain.components) << "recording must not change what is measured";
  ASSERT_GT(recorded.snapshot.size(), 100U);
  testing::TempDir dir;
  write_file_atomically(dir / "cuda.pickle", recorded.snapshot);
  std::string out;
  EXPECT_EQ(testing::run(std::string("'") + MEMGATE_TEST_PYTHON + "' '" + testing::source_dir() +
                             "/tests/measure/check_memory_snapshot.py' '" + (dir / "cuda.pickle") + "'",
                         &out),
            0)
      << out;
}

TEST(CudaProbeTest, BytesDoNotDependOnTheOrderOfProbes) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU on this machine: the CUDA order is tested on a GPU runner";
  testing::expect_order_independent(MEMGATE_CLI, gpu_for_test().str());
}

// The environment a PyTorch user's process has, set before the first CUDA call.
TEST(CudaProbeTest, ContextLoadsModulesLazily) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU on this machine";
  const auto info = describe_device(gpu_for_test());
  EXPECT_EQ(info.cuda_module_loading, "LAZY");
}

// advise on a GPU: the caching allocator's memory fraction is the cap.
TEST(CudaAdviseTest, AdvisesUnderTheCachingAllocatorsCap) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU on this machine: advise on CUDA is tested on a GPU runner";
  const auto gpu = gpu_for_test();
  const auto f = fixture_from(tiny_vit_yaml("  trainable: all\n"));
  const std::int64_t usable = std::int64_t{256} << 20;
  const auto advice = advise(f, {{"capacity", "256 MiB", usable}}, gpu);
  const auto& t = advice.targets.front();
  ASSERT_TRUE(t.batch_size.has_value());
  EXPECT_FALSE(run_probe_capped(f, *t.batch_size, gpu, usable).oom);
  EXPECT_TRUE(run_probe_capped(f, *t.batch_size + 1, gpu, usable).oom);
  std::cout << "advised batch " << *t.batch_size << " for 256 MiB in " << t.probes << " probes\n";
}

// Estimates for CUDA against the baselines this GPU recorded (baselines/<slug>/, written by the
// update-baselines-gpu workflow): within 3% on step_peak and 5% on step_peak_reserved, for every GPU-suite fixture
// and batch size that has one.
TEST(CudaEstimateTest, MatchesThisGpusBaselines) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU on this machine: estimates are checked against a GPU's baselines";
  const auto slug = describe_device(gpu_for_test()).slug;
  const auto root = testing::source_dir() + "/baselines";
  if (!std::filesystem::is_directory(root + "/" + slug)) {
    GTEST_SKIP() << "no baselines recorded for " << slug << " yet: cmake --workflow --preset update-baselines-gpu";
  }
  const auto suite_path = testing::source_dir() + "/fixtures/suites/gpu.yaml";
  int compared = 0;
  double worst_step = 0.0, worst_reserved = 0.0;
  for (const auto& f : suite_fixtures(load_suite(suite_path, suite_models_dir(suite_path)))) {
    const auto path = baseline_path(root, slug, f.name);
    if (!std::filesystem::exists(path)) continue;
    const auto baseline = load_baseline(path, f.name, slug);
    const auto fixture = load_fixture(f.path);
    for (const auto& recorded : baseline.probes) {
      const auto e = estimate_probe(fixture, recorded.batch_size, EstimateTarget::kCuda).components;
      const auto& m = recorded.components;
      const auto pct = [](std::int64_t a, std::int64_t b) {
        return b == 0 ? 0.0 : 100.0 * std::abs(static_cast<double>(a - b)) / static_cast<double>(b);
      };
      const auto step = pct(e.step_peak, m.step_peak), reserved = pct(e.step_peak_reserved, m.step_peak_reserved);
      EXPECT_LE(step, 3.0) << f.name << " at batch " << recorded.batch_size << ": step_peak " << e.step_peak
                           << " estimated, " << m.step_peak << " measured";
      EXPECT_LE(reserved, 5.0) << f.name << " at batch " << recorded.batch_size << ": step_peak_reserved "
                               << e.step_peak_reserved << " estimated, " << m.step_peak_reserved << " measured";
      std::cout << fmt::format("[ ESTIMATE ] {} bs {}: step_peak {:.2f}% off, step_peak_reserved {:.2f}% off\n",
                               f.name, recorded.batch_size, step, reserved);
      worst_step = std::max(worst_step, step);
      worst_reserved = std::max(worst_reserved, reserved);
      ++compared;
    }
  }
  EXPECT_GT(compared, 0) << "baselines/" << slug << " holds none of the GPU suite's fixtures";
  std::cout << fmt::format("[ ESTIMATE ] {} probes on {}: largest error step_peak {:.2f}%, reserved {:.2f}%\n",
                           compared, slug, worst_step, worst_reserved);
}

}  // namespace
}  // namespace memgate
