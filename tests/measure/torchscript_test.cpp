// TorchScript models (arch: torchscript): a timm ViT and a torchvision ResNet exported by
// tools/make_torchscript_models.py measure as memgate's own fixtures of the same architecture, on the CPU's exact
// counting allocator; the module's own parameter names drive trainable patterns; bad input is named.
#include "memgate/base/error.h"
#include "memgate/gate/fixture.h"
#include "memgate/gate/suite.h"
#include "memgate/launch/estimate.h"
#include "memgate/measure/probe.h"
#include "fixture_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

namespace memgate {
namespace {

using ::testing::HasSubstr;

using testing::kCpu;

Fixture repo_fixture(const std::string& name) { return load_fixture(testing::source_dir() + "/fixtures/models/" + name + ".yaml"); }

std::set<std::string> parameter_names(const Fixture& f) {
  auto model = build_model(f.model, kCpu);
  std::set<std::string> names;
  for (const auto& p : model->module().named_parameters()) names.insert(p.key());
  return names;
}

TEST(TorchScriptTest, TimmVitHasTheZooVitsParametersUnderTheSameNames) {
  const auto scripted = repo_fixture("ts_vit_tiny_timm");
  const auto zoo = repo_fixture("vit_tiny_full");
  EXPECT_EQ(workload_param_counts(scripted).total, workload_param_counts(zoo).total);
  EXPECT_EQ(parameter_names(scripted), parameter_names(zoo));
}

// Byte for byte, but for one explained difference: in an eval forward (no autograd) the TorchScript interpreter
// frees each value at its last use, so attention's q, k, v (one [B, N, 3C] fp32 buffer) are gone before the
// output projection; eager code (memgate's C++ modules, and timm run from Python) keeps them as locals until
// forward() returns. In training autograd saves them anyway, so every other component is equal.
TEST(TorchScriptTest, TimmVitMeasuresAsTheZoosVit) {
  const auto scripted = repo_fixture("ts_vit_tiny_timm");
  const auto zoo = repo_fixture("vit_tiny_full");
  const std::int64_t tokens = (40 / 8) * (40 / 8) + 1, width = 64;
  for (const auto bs : zoo.batch_sizes) {
    const auto a = run_probe(scripted, bs, kCpu);
    const auto b = run_probe(zoo, bs, kCpu);
    ASSERT_FALSE(a.oom || b.oom) << a.error << b.error;
    for (const auto& c : kComponentTable) {
      if (c.name == "eval_peak") continue;
      EXPECT_EQ(a.components.*c.member, b.components.*c.member) << "bs " << bs << " " << c.name;
    }
    // The TorchScript interpreter frees each value at its last use; eager timm, which the zoo's ViT follows to the
    // byte (tools/timm_reference.py), holds a value until the Python call or variable that holds it ends: at the
    // eval forward's peak that is two [B, N, C] fp32 tensors more.
    EXPECT_EQ(b.components.eval_peak - a.components.eval_peak, bs * tokens * 2 * width * 4) << "bs " << bs;
  }
}

TEST(TorchScriptTest, TorchvisionResNetMeasuresAsTheZoosResNetByteForByte) {
  const auto scripted = repo_fixture("ts_resnet18_w8_torchvision");
  const auto zoo = repo_fixture("resnet_tiny_classify");
  EXPECT_EQ(workload_param_counts(scripted).total, workload_param_counts(zoo).total);
  for (const auto bs : zoo.batch_sizes) {
    const auto a = run_probe(scripted, bs, kCpu);
    const auto b = run_probe(zoo, bs, kCpu);
    ASSERT_FALSE(a.oom || b.oom) << a.error << b.error;
    EXPECT_EQ(a.components, b.components) << "bs " << bs;
  }
}

std::string scripted_vit_yaml(const std::string& model_extra, const std::string& training) {
  return "model:\n  arch: torchscript\n  path: " + testing::source_dir() + "/fixtures/models/torchscript/vit_tiny_timm.pt\n" +
         model_extra + "training:\n  optimizer: adamw\n" + training + "batch_sizes: [2]\n";
}

const std::string kImages = "  inputs:\n    - {shape: [B, 3, 40, 40], dtype: float32}\n";

// torch.jit.trace keeps the Python numbers a model computes with as tensor constants of its graph (the width an
// RMSNorm divides by, the 2 of a view into pairs, as 0-dim tensors). Loaded straight onto the Meta device they lose
// their values and the load fails (the loader compares constants); an estimate reads the module onto the CPU and
// moves only its parameters and buffers, so a traced model estimates as it measures, also at a batch size it was
// not traced at.
TEST(TorchScriptTest, ATracedModelEstimatesOnMetaAsItMeasuresOnTheCpu) {
  const auto traced = repo_fixture("ts_token_lm_traced");
  for (const std::int64_t bs : {2, 4}) {
    const auto measured = run_probe(traced, bs, kCpu);
    const auto estimated = estimate_probe(traced, bs, EstimateTarget::kCpu);
    ASSERT_FALSE(measured.oom || estimated.oom) << measured.error << estimated.error;
    for (const auto& c : kComponentTable) {
      EXPECT_EQ(estimated.components.*c.member, measured.components.*c.member) << "bs " << bs << " " << c.name;
    }
    const auto cuda = estimate_probe(traced, bs, EstimateTarget::kCuda);
    ASSERT_FALSE(cuda.oom) << cuda.error;
    EXPECT_GE(cuda.components.step_peak, measured.components.step_peak) << "512-byte blocks hold at least as much";
  }
}

TEST(TorchScriptTest, PatternsSelectTheModulesOwnParametersExactly) {
  const auto f = testing::fixture_from(
      scripted_vit_yaml(kImages + "  task: classify\n  num_classes: 5\n",
                        "  trainable: {train: [\"head.*\", \"blocks.3.*\"]}\n"));
  const std::int64_t d = 64, hidden = 256, classes = 5;
  const std::int64_t block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (hidden * d + hidden) + (d * hidden + d);
  const auto counts = workload_param_counts(f);
  EXPECT_EQ(counts.trainable, d * classes + classes + block);
  EXPECT_EQ(counts.total, 214'469);
  const auto r = run_probe(f, 2, kCpu);
  ASSERT_FALSE(r.oom) << r.error;
  EXPECT_EQ(r.components.gradients, counts.trainable * 4) << "only the selected parameters get gradients";
}

TEST(TorchScriptTest, RegressAndSumTasksTrain) {
  for (const std::string task : {"regress", "sum"}) {
    const auto f = testing::fixture_from(scripted_vit_yaml(kImages + "  task: " + task + "\n", "  trainable: all\n"));
    const auto r = run_probe(f, 2, kCpu);
    ASSERT_FALSE(r.oom) << r.error;
    EXPECT_EQ(r.components.gradients, 214'469 * 4) << task;
    EXPECT_GT(r.components.activations, 0) << task;
  }
}

std::string load_error(const std::string& yaml) {
  try {
    (void)testing::fixture_from(yaml, "ts");
  } catch (const Error& e) {
    return e.what();
  }
  return "(loaded)";
}

TEST(TorchScriptTest, BadFixturesNameTheKey) {
  const std::string classify = "  task: classify\n  num_classes: 5\n";
  auto missing = scripted_vit_yaml(kImages + classify, "");
  missing.replace(missing.find("vit_tiny_timm.pt"), 16, "nothing_here.pt");
  EXPECT_THAT(load_error(missing), HasSubstr("model.path: expected a TorchScript file"));
  EXPECT_THAT(load_error(missing), HasSubstr("not there"));
  EXPECT_THAT(load_error(scripted_vit_yaml("  inputs:\n    - {shape: [B, C, 40, 40]}\n" + classify, "")),
              HasSubstr("model.inputs[0].shape: expected B (the batch size) or integers >= 1, got 'C'"));
  EXPECT_THAT(load_error(scripted_vit_yaml("  inputs:\n    - {shape: [2, 3, 40, 40]}\n" + classify, "")),
              HasSubstr("model.inputs: expected B (the batch size) in the shape of at least one input"));
  EXPECT_THAT(load_error(scripted_vit_yaml("  inputs:\n    - {shape: [B, 3, 40, 40], dtype: float64}\n" + classify, "")),
              HasSubstr("model.inputs[0].dtype"));
  EXPECT_THAT(load_error(scripted_vit_yaml(kImages, "")), HasSubstr("model.task: expected"));
  EXPECT_THAT(load_error(scripted_vit_yaml(kImages + "  task: sum\n  num_classes: 5\n", "")), HasSubstr("num_classes"));
  EXPECT_THAT(load_error(scripted_vit_yaml(kImages + classify, "  trainable: lora\n")),
              HasSubstr("training.trainable: expected all or {train: [patterns]} for a TorchScript model"));
  EXPECT_THAT(load_error(scripted_vit_yaml(kImages + classify, "  gradient_checkpointing: true\n")),
              HasSubstr("training.gradient_checkpointing"));
}

TEST(TorchScriptTest, WrongOutputAndNotAModuleAreNamedAtTheProbe) {
  const auto wrong_classes = testing::fixture_from(scripted_vit_yaml(kImages + "  task: classify\n  num_classes: 7\n", ""));
  EXPECT_THAT([&] { (void)run_probe(wrong_classes, 1, kCpu); },
              ::testing::ThrowsMessage<Error>(HasSubstr("expects an output of shape [B, 7] (num_classes), got [1, 5]")));
  testing::TempDir dir;
  testing::write_file(dir / "garbage.pt", "not a zip archive");
  testing::write_file(dir / "m.yaml", "model:\n  arch: torchscript\n  path: garbage.pt\n" + kImages +
                                          "  task: sum\nbatch_sizes: [1]\n");
  const auto garbage = load_fixture(dir / "m.yaml");
  EXPECT_THAT([&] { (void)run_probe(garbage, 1, kCpu); },
              ::testing::ThrowsMessage<Error>(HasSubstr("garbage.pt: cannot load a TorchScript module")));
}

TEST(TorchScriptTest, TheModulesBytesArePartOfTheHash) {
  testing::TempDir dir;
  const auto yaml = "model:\n  arch: torchscript\n  path: m.pt\n" + kImages + "  task: sum\nbatch_sizes: [1]\n";
  testing::write_file(dir / "f.yaml", yaml);
  testing::write_file(dir / "m.pt", testing::read_file(testing::source_dir() + "/fixtures/models/torchscript/vit_tiny_timm.pt"));
  const auto before = load_fixture(dir / "f.yaml").hash;
  testing::write_file(dir / "m.pt", testing::read_file(testing::source_dir() + "/fixtures/models/torchscript/resnet18_w8_torchvision.pt"));
  EXPECT_NE(load_fixture(dir / "f.yaml").hash, before) << "a re-exported module must ask for new baselines";
}

}  // namespace
}  // namespace memgate
