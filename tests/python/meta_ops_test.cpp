// Every op that plain PyTorch runs on the Meta device is estimated (issue 59): 2-D cross-entropy (nll_loss2d),
// mse_loss_backward (task: regress), PReLU, GroupNorm and its backward, ReLU6's backward (hardtanh), integer abs and
// roll have no Meta kernel in LibTorch's C++; the estimate's Python process keeps torch's Python ones for them
// (python/memgate/_meta.py) and counts their outputs as the CPU's kernels allocate them. Each py_meta_* fixture (small
// nets of these ops, and timm's ResNet with its GroupNorm and ReLU6) is estimated for the CPU and measured on it,
// component by component; so are grouped and depthwise convolutions (timm's ConvNeXt, a ResNeXt- and MobileNet-style
// net), which the CPU without oneDNN runs one group at a time. An op with no Meta kernel anywhere is an error
// naming the op and the module whose forward called it. And `memgate profile` reports a batch size that fails as
// failed, measuring and writing the others.
#include "memgate/base/components.h"
#include "memgate/base/files.h"
#include "memgate/gate/fixture.h"
#include "memgate/launch/estimate.h"
#include "memgate/launch/run.h"
#include "estimate_check.h"
#include "fixture_util.h"
#include "cli_fork.h"
#include "test_util.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <span>
#include <stdexcept>
#include <iostream>
#include <string>
#include <vector>

namespace memgate {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::kCpu;

struct MetaCase {
  std::string name;     ///< the test's
  std::string fixture;  ///< fixtures/models/<fixture>.yaml
  std::vector<std::int64_t> batches;
};

void PrintTo(const MetaCase& c, std::ostream* os) { *os << c.fixture; }

class MetaOpsEstimateTest : public ::testing::TestWithParam<MetaCase> {};

// The estimate runs (before, it failed on the first of these ops) and equals the measurement: the model's states
// exactly, the activations and every peak within 1%.
TEST_P(MetaOpsEstimateTest, EstimatesWithinOnePercentOfTheMeasurementOnEveryComponent) {
  const auto& c = GetParam();
  const auto f = load_fixture(testing::source_dir() + "/fixtures/models/" + c.fixture + ".yaml");
  for (const auto& [batch, m, e] : testing::measure_and_estimate_for_cpu(f, c.batches)) {
    const auto at = fmt::format("{} at batch {}", c.fixture, batch);
    EXPECT_EQ(e.components.keeps_ema, m.components.keeps_ema) << at;
    for (const auto& info : kComponentTable) {
      if (!has_component(m.components, info)) continue;  // `ema`: these fixtures keep none
      const auto want = m.components.*info.member, got = e.components.*info.member;
      const double signed_pct = want == 0 ? 0.0 : 100.0 * static_cast<double>(got - want) / static_cast<double>(want);
      std::cout << fmt::format("[ ESTIMATE ] {} {:<19} estimated {:>9} measured {:>9} ({:+.2f}%)\n", at, info.name,
                               got, want, signed_pct);
      EXPECT_GT(want, 0) << at << ": " << info.name << " measured nothing";
      EXPECT_LE(testing::error_pct(got, want), 1.0) << at << ": " << info.name;
    }
    for (const auto* exact : {"params", "gradients", "optimizer_state"}) {
      EXPECT_EQ(e.components.get(exact), m.components.get(exact)) << at << ": " << exact;
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<MetaCase>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(
    Ops, MetaOpsEstimateTest,
    ::testing::Values(MetaCase{"SegmentationCrossEntropy2dGroupNormPreluRelu6RollIntegerAbs", "py_meta_seg_ce2d", {2, 4}},
                      MetaCase{"RegressionMseWithAPerFeaturePrelu", "py_meta_regress", {2, 8}},
                      MetaCase{"TimmResNetWithGroupNormAndRelu6", "py_meta_timm_resnet_gn", {2, 4}},
                      // Grouped and depthwise convolutions: without oneDNN the CPU runs them a group at a time.
                      MetaCase{"TimmConvNeXtDepthwise7x7", "py_meta_timm_convnext", {2, 4}},
                      MetaCase{"GroupedAndDepthwiseConvolutions", "py_meta_grouped_conv", {2, 4}},
                      MetaCase{"DilatedTransposed1dAndChannelsLastGroupedConvolutions",
                               "py_meta_grouped_conv_variants", {2, 3}},
                      // torch.autocast(device_type=x.device.type, ...) in a loss: "meta" in an estimate (issue 68).
                      MetaCase{"SsimLossWithAutocastOffForItsDevice", "py_meta_ssim_autocast", {2, 8}},
                      MetaCase{"SsimLossWithAutocastOnForItsDevice", "py_meta_ssim_autocast_on", {2, 8}},
                      // Found on libraries memgate was not tuned to (issue 68, second set): the CPU's Slow3d columns
                      // (a video net), CTC loss with its lengths on the CPU (a speech model).
                      MetaCase{"Conv3dSlow3dColumnsGroupsAndPointwise", "py_meta_conv3d", {2, 4}},
                      MetaCase{"CtcLossWithItsLengthsOnTheCpu", "py_meta_ctc", {2, 4}}),
    case_name);

// A fixture folder of its own: f.yaml (a Python fixture over models.py:build, inputs [B, 4]) and models.py.
struct FixtureFolder {
  testing::TempDir dir;
  FixtureFolder(const std::string& code, const std::string& batch_sizes) {
    testing::write_file(dir / "f.yaml", "model:\n  arch: python\n  entry: models.py:build\n  inputs:\n"
                                        "    - {shape: [B, 4], dtype: float32}\n  task: sum\n"
                                        "training: {optimizer: adamw, trainable: all}\nbatch_sizes: " +
                                            batch_sizes + "\n");
    testing::write_file(dir / "models.py", code);
  }
  [[nodiscard]] std::string memgate(const std::string& args) const {
    return fmt::format("env -u CI -u MEMGATE_STRICT {} {}", MEMGATE_CLI, args);
  }
};

// An op defined with torch.library and a CPU kernel alone (as an extension's custom op is) has no Meta kernel, in
// LibTorch or in Python: the estimate fails naming the op and the module whose forward called it, and says to
// measure instead; the measurement runs it.
TEST(MetaOpsEstimateTest, AnOpWithNoMetaKernelIsAnErrorNamingTheOpAndTheModule) {
  // Defined once per process (each build imports models.py anew), kept alive on torch.
  FixtureFolder p("import torch\n\n"
            "if not hasattr(torch, '_memgate_test_lib'):\n"
            "    torch._memgate_test_lib = torch.library.Library('memgate_test', 'DEF')\n"
            "    torch._memgate_test_lib.define('twice(Tensor x) -> Tensor')\n"
            "    torch._memgate_test_lib.impl('twice', lambda x: x * 2, 'CPU')\n\n"
            "class Inner(torch.nn.Module):\n"
            "    def forward(self, x):\n        return torch.ops.memgate_test.twice(x)\n\n"
            "class Net(torch.nn.Module):\n"
            "    def __init__(self):\n        super().__init__()\n        self.lin = torch.nn.Linear(4, 4)\n"
            "        self.block = torch.nn.Sequential(torch.nn.ReLU(), Inner())\n\n"
            "    def forward(self, x):\n        return self.block(self.lin(x))\n\n"
            "def build():\n    return Net()\n",
            "[2]");
  std::string out;
  EXPECT_EQ(testing::run_dev(p.memgate(fmt::format("estimate --config {} --for cpu", p.dir / "f.yaml")), &out), 3)
      << out;
  EXPECT_THAT(out, HasSubstr("f.yaml at batch 2")) << out;
  EXPECT_THAT(out, HasSubstr("the op memgate_test::twice has no Meta kernel")) << out;
  EXPECT_THAT(out, HasSubstr("called in the forward of 'block.1' (Inner)")) << out;
  EXPECT_THAT(out, HasSubstr("measure the fixture instead")) << out;
  EXPECT_THAT(out, Not(HasSubstr("Traceback"))) << out;
  EXPECT_EQ(testing::run_dev(p.memgate(fmt::format("profile --config {} --device cpu", p.dir / "f.yaml")), &out), 0)
      << out;
}

// CTC loss whose lengths were made on the model's device: measured on the CPU; on the Meta device the lengths hold no
// values, and log_alpha's size is the longest target's, so the estimate refuses it with memgate's message naming the
// op and saying to measure it (before: "_ctc_loss.Tensor has no Meta kernel", whatever device the lengths were on).
TEST(MetaOpsEstimateTest, CtcLossWithItsLengthsOnTheMetaDeviceIsRefusedNamingTheOp) {
  const auto error = testing::measured_but_estimate_refused(
      load_fixture(testing::source_dir() + "/fixtures/models/py_meta_ctc_device_lengths.yaml"), 2);
  EXPECT_THAT(error, HasSubstr("the estimate cannot run aten::ctc_loss")) << error;
  EXPECT_THAT(error, HasSubstr("measure it instead")) << error;
  EXPECT_THAT(error, Not(HasSubstr("has no Meta kernel"))) << error;
}

// The same ops in a TorchScript fixture, whose estimate runs in C++ alone, without torch's Python Meta kernels: memgate's
// own (meta_kernels.cpp) for PReLU and its backward, GroupNorm and its backward, ReLU6's backward, roll and integer
// abs. The estimate for the CPU equals the measurement within 1% on every component, the model states exactly (before,
// it stopped at _prelu_kernel: "has no Meta kernel").
TEST(MetaOpsEstimateTest, TheseOpsInATorchScriptFixtureAreEstimatedInCpp) {
  testing::TempDir dir;
  std::string out;
  ASSERT_EQ(testing::run(fmt::format("{} -c \"import sys; sys.path.insert(0, '{}/fixtures/models/python'); "
                                     "import meta_ops; meta_ops.save_scripted_seg_head('{}')\"",
                                     MEMGATE_TORCH_PYTHON, testing::source_dir(), dir / "seg.pt"),
                         &out),
            0)
      << out;
  testing::write_file(dir / "seg.yaml", "model:\n  arch: torchscript\n  path: seg.pt\n  inputs:\n"
                                        "    - {shape: [B, 3, 16, 16], dtype: float32}\n  task: classify\n"
                                        "  num_classes: 3\ntraining: {optimizer: adamw, trainable: all}\n"
                                        "batch_sizes: [2]\n");
  const auto f = load_fixture(dir / "seg.yaml");
  const std::vector<std::int64_t> batches{2, 4};
  const auto measured = run_probes(f, batches, kCpu);
  const auto estimated = estimate_profile(f, batches, EstimateTarget::kCpu).probes;
  ASSERT_EQ(measured.size(), 2U);
  ASSERT_EQ(estimated.size(), 2U);
  for (std::size_t i = 0; i < batches.size(); ++i) {
    ASSERT_TRUE(measured[i].measured()) << measured[i].error;
    ASSERT_TRUE(estimated[i].measured()) << estimated[i].error;
    for (const auto& info : kComponentTable) {
      if (!has_component(measured[i].components, info)) continue;
      const auto want = measured[i].components.*info.member, got = estimated[i].components.*info.member;
      std::cout << fmt::format("[ ESTIMATE ] TorchScript SegNet at batch {} {:<19} estimated {:>9} measured {:>9}\n",
                               batches[i], info.name, got, want);
      EXPECT_LE(testing::error_pct(got, want), 1.0) << "batch " << batches[i] << ": " << info.name;
    }
    for (const auto* exact : {"params", "gradients", "optimizer_state"}) {
      EXPECT_EQ(estimated[i].components.get(exact), measured[i].components.get(exact)) << exact;
    }
  }
}

// The model raises at batch 4 alone (a size limit of its own): batches 2 and 8 are measured and written, batch 4 is
// reported as failed with its error, in the printed report and in the JSON; the exit code says an error happened.
// The probes run in one Python process, which goes on after the failed batch size.
TEST(ProfileFailedBatchTest, AModelErrorAtOneBatchSizeIsReportedAndTheOthersAreMeasuredAndWritten) {
  FixtureFolder p("import torch\n\n"
            "class Net(torch.nn.Linear):\n"
            "    def forward(self, x):\n"
            "        if x.shape[0] == 4:\n            raise ValueError('no batch of four, please')\n"
            "        return super().forward(x)\n\n"
            "def build():\n    return Net(4, 2)\n",
            "[2, 4, 8]");
  std::string out;
  EXPECT_EQ(testing::run_dev(p.memgate(fmt::format("profile --config {} --device cpu --output {}", p.dir / "f.yaml",
                                                   p.dir / "p.json")),
                             &out),
            3)
      << out;
  EXPECT_THAT(out, HasSubstr("batch size 4 failed")) << out;
  EXPECT_THAT(out, HasSubstr("ValueError: no batch of four, please")) << out;
  EXPECT_THAT(out, HasSubstr("failed (not measured):")) << out;
  const auto profile = nlohmann::json::parse(testing::read_file(p.dir / "p.json"));
  ASSERT_EQ(profile["probes"].size(), 3U) << profile.dump(2);
  EXPECT_EQ(profile["probes"][0]["batch_size"], 2);
  EXPECT_EQ(profile["probes"][0]["components"]["params"], 40);
  EXPECT_GT(profile["probes"][0]["components"]["step_peak"].get<std::int64_t>(), 0);
  EXPECT_EQ(profile["probes"][1]["batch_size"], 4);
  EXPECT_EQ(profile["probes"][1].value("failed", false), true) << profile["probes"][1].dump();
  EXPECT_THAT(profile["probes"][1].value("error", ""), HasSubstr("ValueError: no batch of four, please"));
  EXPECT_FALSE(profile["probes"][1].contains("components"));
  EXPECT_EQ(profile["probes"][2]["batch_size"], 8);
  EXPECT_EQ(profile["probes"][2]["components"]["params"], 40);
  EXPECT_GT(profile["probes"][2]["components"]["forward_peak"], profile["probes"][0]["components"]["forward_peak"]);
  // memgate report reads the file back, the failed batch size as such.
  EXPECT_EQ(testing::run(p.memgate(fmt::format("report {} --output {}", p.dir / "p.json", p.dir / "r.html")), &out), 0)
      << out;
  EXPECT_THAT(testing::read_file(p.dir / "r.html"), HasSubstr("bs 4: failed: ")) << out;
}

// The probe's process dies at batch 4 (a crash in the model's code, as a bad extension's): batches 2 and 8 are still
// measured, the one after it in a process of its own.
TEST(ProfileFailedBatchTest, AProcessThatDiesAtOneBatchSizeLeavesTheOthersMeasured) {
  FixtureFolder p("import os, signal\nimport torch\n\n"
            "class Net(torch.nn.Linear):\n"
            "    def forward(self, x):\n"
            "        if x.shape[0] == 4:\n            os.kill(os.getpid(), signal.SIGKILL)\n"
            "        return super().forward(x)\n\n"
            "def build():\n    return Net(4, 2)\n",
            "[2, 4, 8]");
  std::string out;
  EXPECT_EQ(testing::run_dev(p.memgate(fmt::format("profile --config {} --device cpu --output {}", p.dir / "f.yaml",
                                                   p.dir / "p.json")),
                             &out),
            3)
      << out;
  EXPECT_THAT(out, HasSubstr("batch size 4 failed")) << out;
  EXPECT_THAT(out, HasSubstr("signal 9")) << out;
  const auto profile = nlohmann::json::parse(testing::read_file(p.dir / "p.json"));
  ASSERT_EQ(profile["probes"].size(), 3U) << profile.dump(2);
  EXPECT_EQ(profile["probes"][0]["components"]["params"], 40);
  EXPECT_EQ(profile["probes"][1].value("failed", false), true) << profile["probes"][1].dump();
  EXPECT_EQ(profile["probes"][2]["batch_size"], 8);
  EXPECT_EQ(profile["probes"][2]["components"]["params"], 40);
}

// Batch sizes probed one by one (a zoo fixture's, a distributed one's): under keep_going the error one throws is
// that batch size's result and the next still run; without it (the gate, advise) the error stops the profile.
TEST(ProfileFailedBatchTest, CollectProfileReportsAThrownErrorAsThatBatchSizesUnderKeepGoingAlone) {
  const std::vector<std::int64_t> sizes = {1, 2, 3};
  std::vector<std::int64_t> probed;
  const auto probe = [&](std::span<const std::int64_t> batch) {
    probed.push_back(batch.front());
    if (batch.front() == 2) throw std::runtime_error("no batch of two");
    ProbeResult r;
    r.batch_size = batch.front();
    r.components.params = 100 * batch.front();
    return std::vector<ProbeResult>{r};
  };
  const auto profile = collect_profile(sizes, false, probe, {}, Profile{}, /*keep_going=*/true);
  ASSERT_EQ(profile.probes.size(), 3U);
  EXPECT_EQ(probed, sizes);
  EXPECT_TRUE(profile.probes[0].measured());
  EXPECT_EQ(profile.probes[0].components.params, 100);
  EXPECT_TRUE(profile.probes[1].failed);
  EXPECT_FALSE(profile.probes[1].oom);
  EXPECT_EQ(profile.probes[1].batch_size, 2);
  EXPECT_EQ(profile.probes[1].error, "no batch of two");
  EXPECT_TRUE(profile.probes[2].measured());
  EXPECT_EQ(profile.probes[2].components.params, 300);
  probed.clear();
  EXPECT_THROW((void)collect_profile(sizes, false, probe, {}, Profile{}), std::runtime_error);
  EXPECT_EQ(probed, (std::vector<std::int64_t>{1, 2})) << "without keep_going the error ends the profile";
}

}  // namespace
}  // namespace memgate
