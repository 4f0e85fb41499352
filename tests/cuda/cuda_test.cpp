// The CUDA unit tests: labelled `gpu`, so the `gpu` preset runs them on a GPU runner; without a GPU they skip.
#include "memgate/base/files.h"
#include "memgate/advise/advise.h"
#include "memgate/gate/baseline.h"
#include "memgate/gate/fixture.h"
#include "memgate/gate/suite.h"
#include "memgate/launch/estimate.h"
#include "memgate/launch/run.h"
#include "memgate/backend/device.h"
#include "memgate/measure/probe.h"
#include "memgate/models/model.h"
#include "estimate_check.h"
#include "fixture_util.h"
#include "probe_order.h"
#include "test_util.h"
#include "twins.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <iostream>
#include <string>

namespace memgate {
namespace {

using testing::fixture_from;
using testing::tiny_vit_yaml;

using testing::kCpu;

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

// A distributed twin over NCCL, one rank per GPU from cuda:0 on (`world` of them), with the twin's world size set to
// `world`; skips where the machine has fewer GPUs or this build has no NCCL.
ProbeResult nccl_probe(const std::string& fixture_yaml, int world, std::int64_t batch, Fixture* out = nullptr) {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("memgate-nccl-{}", ::getpid());
  std::filesystem::create_directories(dir);
  auto yaml = read_text_file(testing::source_dir() + "/fixtures/models/" + fixture_yaml, "a fixture");
  const std::string from = "world_size: 2";
  yaml.replace(yaml.find(from), from.size(), "world_size: " + std::to_string(world));
  const auto path = dir / fixture_yaml;
  write_file_atomically(path, yaml);
  const auto fixture = load_fixture(path);
  if (out != nullptr) *out = fixture;
  return run_probe(fixture, batch, c10::Device(c10::DeviceType::CUDA, 0));
}

// One rank over NCCL on one GPU (a communicator of one): its group connects on the rank's GPU, the communicator's
// memory is measured outside the allocator, and the rank's model states are those of the estimate for CUDA.
TEST(CudaDistributedTest, OneNcclRankOnOneGpuMeasuresItsCommunicator) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU on this machine: NCCL ranks are tested on a GPU runner";
  if (!nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  for (const auto* twin : {"vit_tiny_ddp.yaml", "vit_tiny_fsdp.yaml"}) {
    Fixture fixture;
    const auto probe = nccl_probe(twin, 1, 2, &fixture);
    ASSERT_FALSE(probe.oom) << twin << ": " << probe.error;
    ASSERT_EQ(probe.ranks.size(), 1U) << twin;
    const auto& r = probe.ranks.front();
    EXPECT_GT(r.communicator_bytes, 0) << twin << ": NCCL's buffers live outside the caching allocator";
    EXPECT_GE(r.outside_allocator_bytes, r.communicator_bytes) << twin;
    const auto estimated = estimate_probe(fixture, 2, EstimateTarget::kCuda);
    ASSERT_EQ(estimated.ranks.size(), 1U);
    for (const auto* exact : {"params", "gradients", "optimizer_state"}) {
      EXPECT_EQ(r.components.get(exact), estimated.ranks.front().components.get(exact)) << twin << ": " << exact;
    }
    std::cout << twin << ": one rank's NCCL communicator " << r.communicator_bytes << " bytes, outside the allocator "
              << r.outside_allocator_bytes << " bytes\n";
  }
}

// The DDP and FSDP twins over NCCL, one rank per GPU: every rank connects its communicator; DDP's ranks run one
// program; model states and DDP's buckets are the estimate's for CUDA to the byte, the peaks within 2%; a second run
// gives the same allocated bytes.
TEST(CudaDistributedTest, TwinsOverNcclMatchTheEstimateForCudaRankByRank) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU on this machine: NCCL ranks are tested on a GPU runner";
  if (!nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "two ranks over NCCL need two GPUs (one is not shared)";
  for (const auto* twin : {"vit_tiny_ddp.yaml", "vit_tiny_fsdp.yaml"}) {
    Fixture fixture;
    const auto a = nccl_probe(twin, 2, 2, &fixture);
    const auto b = nccl_probe(twin, 2, 2);
    ASSERT_FALSE(a.oom || b.oom) << twin << ": " << a.error << b.error;
    const auto estimated = estimate_probe(fixture, 2, EstimateTarget::kCuda);
    ASSERT_EQ(a.ranks.size(), 2U);
    ASSERT_EQ(estimated.ranks.size(), 2U);
    for (std::size_t k = 0; k < 2; ++k) {
      const auto& m = a.ranks[k];
      const auto& e = estimated.ranks[k];
      const auto at = fmt::format("{} rank {}", twin, k);
      EXPECT_GT(m.communicator_bytes, 0) << at;
      EXPECT_EQ(m.components, b.ranks[k].components) << at << ": the same allocated bytes run to run";
      for (const auto* exact : {"params", "gradients", "optimizer_state"}) {
        EXPECT_EQ(m.components.get(exact), e.components.get(exact)) << at << ": " << exact;
      }
      EXPECT_EQ(m.comm_buffer_bytes, e.comm_buffer_bytes) << at;
      for (const auto* peak : {"activations", "forward_peak", "eval_peak", "step_peak"}) {
        EXPECT_LE(testing::error_pct(e.components.get(peak), m.components.get(peak)), 2.0)
            << at << ": " << peak << " " << e.components.get(peak) << " vs " << m.components.get(peak);
      }
      std::cout << at << ": NCCL communicator " << m.communicator_bytes << " bytes, step_peak "
                << m.components.step_peak << ", step_peak_reserved " << m.components.step_peak_reserved << "\n";
    }
  }
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
                             "/tests/backend/check_memory_snapshot.py' '" + (dir / "cuda.pickle") + "'",
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

// A user's Python model on CUDA, through memgate's extension in a Python process: torchvision's ResNet equals its
// zoo twin to the byte on every component, as on the CPU (PythonFixtureTest). On the H200 machine, whose GCC linked
// libstdc++ statically, the extension carried a copy of its own and every Python probe crashed (SIGSEGV).
TEST(CudaPythonTest, TorchvisionResNetEqualsItsZooTwin) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU on this machine: Python fixtures on CUDA are tested on a GPU runner";
#ifndef MEMGATE_TEST_PYTHON_EXTENSION
  GTEST_SKIP() << "memgate's Python extension is not built (MEMGATE_PYTHON_EXTENSION=OFF)";
#else
  testing::expect_twins("py_resnet_tiny_torchvision", "resnet_tiny_classify", {1, 4}, gpu_for_test());
#endif
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
// and batch size that has one, with the known gaps of estimate_check.h.
TEST(CudaEstimateTest, MatchesThisGpusBaselines) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU on this machine: estimates are checked against a GPU's baselines";
  const auto slug = describe_device(gpu_for_test()).slug;
  const auto root = testing::source_dir() + "/baselines";
  if (!std::filesystem::is_directory(root + "/" + slug)) {
    GTEST_SKIP() << "no baselines recorded for " << slug << " yet: cmake --workflow --preset update-baselines-gpu";
  }
  testing::expect_cuda_estimates_match_baselines(slug);
}

}  // namespace
}  // namespace memgate
