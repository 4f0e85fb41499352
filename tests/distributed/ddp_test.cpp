// DistributedDataParallel per rank: real rank processes over Gloo through LibTorch's c10d::Reducer, against what DDP
// must keep, and the Meta device's estimate against the measurement, rank by rank, at 2 and 4 ranks.
#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/gate/fixture.h"
#include "memgate/launch/estimate.h"
#include "memgate/measure/probe.h"
#include "fixture_util.h"
#include "test_util.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <torch/cuda.h>

#include <cstdlib>
#include <string>

namespace memgate {
namespace {

using ::testing::HasSubstr;

using testing::kCpu;

// The CPU suite's DDP twin with `world_size` ranks, written beside the test (its ranks load it from there).
Fixture ddp_twin(const testing::TempDir& dir, std::int64_t world_size) {
  auto yaml = read_text_file(testing::source_dir() + "/fixtures/models/vit_tiny_ddp.yaml", "a fixture");
  const std::string from = "world_size: 2";
  yaml.replace(yaml.find(from), from.size(), "world_size: " + std::to_string(world_size));
  const auto path = dir / "vit_tiny_ddp.yaml";
  write_file_atomically(path, yaml);
  return load_fixture(path);
}

TEST(DdpTest, EachRankKeepsAReplicaAndBucketsHoldingEveryGradient) {
  testing::TempDir dir;
  const auto fixture = ddp_twin(dir, 2);
  const auto probe = run_probe(fixture, 2, kCpu);
  ASSERT_FALSE(probe.oom) << probe.error;
  ASSERT_EQ(probe.ranks.size(), 2U);
  const auto trainable_bytes = workload_param_counts(fixture).trainable * 4;  // fp32
  for (const auto& r : probe.ranks) {
    EXPECT_EQ(r.components.params, trainable_bytes) << "rank " << r.rank << ": a whole replica";
    EXPECT_EQ(r.comm_buffer_bytes, trainable_bytes) << "rank " << r.rank << ": buckets hold every gradient";
    EXPECT_GT(r.comm_buffers, 1) << "rank " << r.rank << ": rebuilt into 0.25 MB buckets after the first iteration";
    EXPECT_EQ(r.components.gradients, 0) << "rank " << r.rank << ": gradients are views into the buckets";
    EXPECT_EQ(r.components, probe.ranks.front().components) << "DDP's ranks run the same program";
  }
  EXPECT_EQ(probe.components, max_over_ranks(probe.ranks));
  EXPECT_EQ(probe.comm_buffer_bytes, trainable_bytes);
  // A step keeps the buckets: the step's peak holds a replica, its buckets and AdamW's two moments at least.
  EXPECT_GT(probe.components.step_peak, 4 * trainable_bytes);
}

// A probe's ranks are forked from a fork server of the rank program (launch/fork_server.h), which loaded LibTorch
// once: each rank of DDP and of FSDP measures to the byte what a rank started directly measures (every component,
// its buckets, its communicator), twice in a row (the server's second ranks too).
TEST(ForkServerTest, ForkedRanksMeasureAsRanksStartedDirectly) {
  for (const auto* name : {"vit_tiny_ddp", "vit_tiny_fsdp"}) {
    const auto fixture = load_fixture(testing::source_dir() + "/fixtures/models/" + name + ".yaml");
    const auto forked = run_probe(fixture, 2, kCpu), again = run_probe(fixture, 2, kCpu);
    ::setenv("MEMGATE_FORK_SERVER", "0", 1);
    const auto direct = run_probe(fixture, 2, kCpu);
    ::unsetenv("MEMGATE_FORK_SERVER");
    ASSERT_FALSE(forked.oom || again.oom || direct.oom) << forked.error << again.error << direct.error;
    ASSERT_EQ(forked.ranks.size(), 2U);
    ASSERT_EQ(direct.ranks.size(), 2U);
    for (const auto* probe : {&forked, &again}) {
      for (std::size_t r = 0; r < 2; ++r) {
        const auto& f = probe->ranks[r];
        const auto& d = direct.ranks[r];
        EXPECT_EQ(f.components, d.components) << name << " rank " << r;
        EXPECT_EQ(f.comm_buffer_bytes, d.comm_buffer_bytes) << name << " rank " << r;
        EXPECT_EQ(f.comm_buffers, d.comm_buffers) << name << " rank " << r;
        EXPECT_EQ(f.communicator_bytes, d.communicator_bytes) << name << " rank " << r;
      }
    }
  }
}

class DdpEstimateTest : public ::testing::TestWithParam<int> {};

TEST_P(DdpEstimateTest, EqualsEachRanksMeasurement) {
  testing::TempDir dir;
  const auto fixture = ddp_twin(dir, GetParam());
  for (const std::int64_t batch : {1, 2}) {
    const auto measured = run_probe(fixture, batch, kCpu);
    const auto estimated = estimate_probe(fixture, batch, EstimateTarget::kCpu);
    ASSERT_FALSE(measured.oom || estimated.oom);
    ASSERT_EQ(measured.ranks.size(), static_cast<std::size_t>(GetParam()));
    ASSERT_EQ(estimated.ranks.size(), measured.ranks.size());
    for (std::size_t r = 0; r < measured.ranks.size(); ++r) {
      const auto& m = measured.ranks[r];
      const auto& e = estimated.ranks[r];
      const auto at = fmt::format("rank {} at batch {}", r, batch);
      EXPECT_EQ(e.components.params, m.components.params) << at;
      EXPECT_EQ(e.components.gradients, m.components.gradients) << at;
      EXPECT_EQ(e.components.optimizer_state, m.components.optimizer_state) << at;
      EXPECT_EQ(e.comm_buffer_bytes, m.comm_buffer_bytes) << at;
      EXPECT_EQ(e.comm_buffers, m.comm_buffers) << at << ": the same rebuilt buckets";
      for (const auto* peak : {"activations", "forward_peak", "eval_peak", "step_peak"}) {
        EXPECT_LE(testing::error_pct(e.components.get(peak), m.components.get(peak)), 1.0)
            << at << ": " << peak << " " << e.components.get(peak) << " vs " << m.components.get(peak);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, DdpEstimateTest, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& p) { return "world" + std::to_string(p.param); });

// A TorchScript LM (fixtures/models/torchscript/token_lm_traced.pt: token embedding, attention, a SwiGLU MLP, a head;
// trained on the logits' sum) under DDP with its gradients as views into the buckets, at 2 and 4 ranks and batches 1
// and 3: every component of the estimate equals each rank's measurement. The sum's gradient is ones expanded
// (strides 0): the CPU's mm clones it whole in both of the head's backward products (addmm_impl_cpu_), which the
// estimate did not, and with bucket views that clone is the step's peak (2,048 B low on every rank).
TEST(DdpEstimateTest, EqualsEachRanksMeasurementForATorchScriptLmWithBucketViews) {
  testing::TempDir dir;
  for (const int world : {2, 4}) {
    const auto path = dir / fmt::format("ts_lm_ddp{}.yaml", world);
    write_file_atomically(path, testing::torchscript_lm_ddp_yaml(world));
    const auto fixture = load_fixture(path);
    for (const std::int64_t batch : {1, 3}) {
      const auto measured = run_probe(fixture, batch, kCpu);
      const auto estimated = estimate_probe(fixture, batch, EstimateTarget::kCpu);
      ASSERT_FALSE(measured.oom || estimated.oom) << measured.error << estimated.error;
      ASSERT_EQ(measured.ranks.size(), static_cast<std::size_t>(world));
      ASSERT_EQ(estimated.ranks.size(), measured.ranks.size());
      for (std::size_t r = 0; r < measured.ranks.size(); ++r) {
        const auto at = fmt::format("{} ranks, rank {} at batch {}", world, r, batch);
        for (const auto* c : {"params", "gradients", "optimizer_state", "activations", "forward_peak", "eval_peak",
                              "step_peak"}) {
          EXPECT_EQ(estimated.ranks[r].components.get(c), measured.ranks[r].components.get(c)) << at << ": " << c;
        }
        EXPECT_EQ(estimated.ranks[r].comm_buffer_bytes, measured.ranks[r].comm_buffer_bytes) << at;
      }
    }
  }
}

TEST(DdpTest, ARankThatFailsIsNamedWithWhatItPrinted) {
  testing::TempDir dir;
  const auto fixture = ddp_twin(dir, 2);
  ::setenv("MEMGATE_RANK_EXECUTABLE", "/bin/false", 1);
  try {
    (void)run_probe(fixture, 1, kCpu);
    ADD_FAILURE() << "a probe whose ranks fail must not return";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("vit_tiny_ddp.yaml at batch 1"));
    EXPECT_THAT(e.what(), HasSubstr("of 2 exited with status 1"));
  }
  ::unsetenv("MEMGATE_RANK_EXECUTABLE");
}

// The ABI of LibTorch's ProcessGroupNCCL as memgate is compiled against it, checked without a GPU: the NCCL version
// LibTorch runs is nccl.h's, and ProcessGroupNCCL::Options built by LibTorch's own constructor read back as memgate's
// headers lay them out. join_nccl_group refuses to start a GPU rank otherwise.
TEST(NcclTest, LibTorchsProcessGroupNcclIsLaidOutAsCompiled) {
  if (!nccl_available()) GTEST_SKIP() << "this build has no CUDA LibTorch or no nccl.h: its ranks run on the CPU only";
  EXPECT_EQ(nccl_layout_problem(), "");
  EXPECT_EQ(communicator_bytes(), 0) << "no NCCL group was joined in this process";
}

// A distributed probe on GPUs needs one per rank; where the machine has fewer, it says so before starting any rank.
TEST(DdpTest, OnGpusAProbeWithoutAGpuPerRankSaysHowManyItNeeds) {
  testing::TempDir dir;
  const auto gpus = static_cast<int>(torch::cuda::device_count());
  const auto fixture = ddp_twin(dir, gpus + 1);
  ::setenv("MEMGATE_RANK_EXECUTABLE", "/bin/false", 1);  // a rank started anyway would fail with another message
  try {
    (void)run_probe(fixture, 1, c10::Device(c10::DeviceType::CUDA, 0));
    ADD_FAILURE() << "a probe of " << gpus + 1 << " ranks on " << gpus << " GPUs must not return";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(nccl_available() ? fmt::format("{} ranks need a GPU each, cuda:0 to cuda:{}, and "
                                                                   "this process sees {} CUDA device(s)",
                                                                   gpus + 1, gpus, gpus)
                                                     : std::string("built without NCCL")));
  }
  ::unsetenv("MEMGATE_RANK_EXECUTABLE");
}

// The memory suite's GPU assignment, CTest's resource groups, given to the probe: as many GPUs as ranks, or an error.
TEST(DdpTest, OnGpusTheRanksGpusMustBeOnePerRank) {
  testing::TempDir dir;
  const auto fixture = ddp_twin(dir, 2);
  if (!nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  ProbeOptions options;
  options.rank_devices = {0};
  try {
    (void)run_probe(fixture, 1, c10::Device(c10::DeviceType::CUDA, 0), options);
    ADD_FAILURE() << "two ranks on one given GPU must not start";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("1 GPUs given for 2 ranks: expected one per rank"));
  }
}

}  // namespace
}  // namespace memgate
