// A builder that reads a value it computed (issue 59: MONAI's SwinUNETR, `dpr = [x.item() for x in
// torch.linspace(0, drop_path_rate, sum(depths))]`) builds on the Meta device: memgate counts a model's parameters there
// before its probe, and an estimate runs the whole protocol there, where a tensor has no value ("Tensor.item() cannot
// be called on meta tensors": the profile failed before it measured anything). memgate._meta.building_on keeps the
// values of small tensors made from numbers on the side, and a read of one reads them.
#include "memgate/base/components.h"
#include "memgate/gate/fixture.h"
#include "memgate/launch/estimate.h"
#include "memgate/launch/run.h"
#include "memgate/measure/probe.h"
#include "estimate_check.h"
#include "fixture_util.h"
#include "cli_fork.h"
#include "test_util.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace memgate {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// What such builders read, all in one: a drop-path schedule (linspace, item), a head count through int(), a window's
// sizes (arange, tolist, a comparison's bool), a relative-position index buffer computed from them; the forward uses
// the buffer. Its parameters and buffers are counted on the Meta device, the probe measures it on the CPU, and its
// estimate for the CPU equals the measurement: the model states exactly, every other component within 1%.
TEST(BuildReadsValuesTest, ABuilderThatReadsWhatItComputedIsCountedMeasuredAndEstimated) {
  const auto f = load_fixture(testing::source_dir() + "/fixtures/models/py_build_reads_values.yaml");
  for (const auto& [batch, measured, estimated] : testing::measure_and_estimate_for_cpu(f, {2, 4})) {
    // Counted on the Meta device before the probe, as the model builds on the CPU.
    ASSERT_TRUE(measured.param_counts.has_value());
    // The embedding (3 x 32 x 2 x 2 + 32), three blocks (LayerNorm 64, qkv 32 x 96 + 96, proj 32 x 32 + 32, a table
    // of 7 x 7 positions x 2 heads) and the head (32 x 3 + 3).
    EXPECT_EQ(measured.param_counts->total, 416 + 3 * (64 + 3168 + 1056 + 98) + 99);
    EXPECT_EQ(measured.param_counts->trainable, measured.param_counts->total);
    const auto at = fmt::format("batch {}", batch);
    for (const auto& info : kComponentTable) {
      if (!has_component(measured.components, info)) continue;
      const auto want = measured.components.*info.member, got = estimated.components.*info.member;
      EXPECT_GT(want, 0) << at << ": " << info.name;
      EXPECT_LE(testing::error_pct(got, want), 1.0) << at << ": " << info.name << " estimated " << got << ", measured "
                                                    << want;
    }
    for (const auto* exact : {"params", "gradients", "optimizer_state"}) {
      EXPECT_EQ(estimated.components.get(exact), measured.components.get(exact)) << at << ": " << exact;
    }
  }
}

// A value the build drew at random (a parameter's initial weights) has no twin: reading it on the Meta device stays an
// error, named as the build's, and the same builder measures on the CPU.
TEST(BuildReadsValuesTest, ReadingARandomParametersValueOnMetaIsStillAnError) {
  testing::TempDir dir;
  testing::write_file(dir / "f.yaml", "model:\n  arch: python\n  entry: models.py:build\n  inputs:\n"
                                      "    - {shape: [B, 4], dtype: float32}\n  task: sum\n"
                                      "training: {optimizer: adamw, trainable: all}\nbatch_sizes: [2]\n");
  testing::write_file(dir / "models.py",
                      "import torch\n\n"
                      "def build():\n"
                      "    lin = torch.nn.Linear(4, 4)\n"
                      "    scale = float(lin.weight.abs().max())  # a value of the random initialisation\n"
                      "    return torch.nn.Sequential(lin, torch.nn.Dropout(min(scale, 0.5)))\n");
  std::string out;
  const auto memgate = [&](const std::string& args) {
    return fmt::format("env -u CI -u MEMGATE_STRICT {} {}", MEMGATE_CLI, args);
  };
  EXPECT_EQ(testing::run_dev(memgate(fmt::format("estimate --config {} --for cpu", dir / "f.yaml")), &out), 3) << out;
  EXPECT_THAT(out, HasSubstr("model.entry models.py:build")) << out;
  EXPECT_THAT(out, Not(HasSubstr("Traceback"))) << out;
  EXPECT_EQ(testing::run_dev(memgate(fmt::format("profile --config {} --device cpu", dir / "f.yaml")), &out), 0) << out;
}

}  // namespace
}  // namespace memgate
