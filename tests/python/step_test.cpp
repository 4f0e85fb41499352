// A Python fixture's own training step (issue 57; docs/fixtures.md, "Your own training step"): its batch callable, its
// compute_loss, inputs passed as keywords and filled, a loss with its target, torch.optim optimizers made from a class
// or a callable and stepped in Python, clipping, an EMA copy (timm's ModelEmaV3 in the reference). Each pattern's fixture (fixtures/models/py_step_*.yaml) is measured by
// memgate and by tools/step_reference.py, which runs the same callables in the loop a user writes with plain PyTorch
// and reads torch.profiler's allocation events: every component is compared. Bad keys and steps memgate does not
// measure (a GAN's two optimizers) are errors naming the fixture.
#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/gate/fixture.h"
#include "memgate/launch/estimate.h"
#include "memgate/launch/run.h"
#include "checkpoint_reference.h"
#include "fixture_util.h"
#include "twins.h"
#include "test_util.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace memgate {
namespace {

using ::testing::HasSubstr;
using testing::kCpu;

constexpr const char* kCompared[] = {"params",    "gradients", "optimizer_state", "activations", "forward_peak",
                                     "eval_peak", "step_peak", "ema"};

struct Pattern {
  std::string name;     ///< the test's
  std::string fixture;  ///< fixtures/models/<fixture>.yaml
  std::vector<std::int64_t> batches;
};

void PrintTo(const Pattern& p, std::ostream* os) { *os << p.fixture; }

std::string fixture_path(const Pattern& p) {
  return testing::source_dir() + "/fixtures/models/" + p.fixture + ".yaml";
}

// The patterns, each a fixture of fixtures/models with the batch sizes it is compared at.
const std::vector<Pattern>& patterns() {
  static const std::vector<Pattern> all = {
      Pattern{"TwoViewsOneBackboneVicLoss", "py_step_vic", {2, 4}},
      Pattern{"StudentAndTeacherOnSeveralCrops", "py_step_dino", {2, 4}},
      Pattern{"DeepSupervisionWithClipping", "py_step_deep_supervision", {2, 4}},
      Pattern{"TransformersFromADictBatchWithLabels", "py_step_hf_dict", {1, 2}},
      Pattern{"RmspropWithTwoParameterGroupsAndAKeywordInput", "py_step_rmsprop_groups", {2, 4}},
      Pattern{"SegmentationDiceLossOnAMaskTarget", "py_step_seg_dice", {2, 4}},
      Pattern{"AnEmaCopyUpdatedAfterEachStep", "py_step_ema", {2, 4}}};
  return all;
}

// vit_tiny_lora and its timm twin (py_vit_tiny_lora_timm, a Python fixture) with `training_line` added to their
// training sections, written to `dir` as <name>_<suffix>.yaml: the twin's path and the zoo fixture.
std::pair<std::string, Fixture> zoo_and_twin_with(const testing::TempDir& dir, const std::string& training_line,
                                                  const std::string& suffix) {
  const auto models = testing::source_dir() + "/fixtures/models/";
  for (const auto* name : {"py_vit_tiny_lora_timm", "vit_tiny_lora"}) {
    auto text = read_text_file(models + name + std::string(".yaml"), "a fixture");
    text.replace(text.find("  precision: fp32\n"), 18, "  precision: fp32\n" + training_line);
    if (const auto at = text.find("entry: python/"); at != std::string::npos) text.replace(at, 14, "entry: " + models + "python/");
    write_file_atomically(dir / (std::string(name) + "_" + suffix + ".yaml"), text);
  }
  return {dir / ("py_vit_tiny_lora_timm_" + suffix + ".yaml"), load_fixture(dir / ("vit_tiny_lora_" + suffix + ".yaml"))};
}

// The twins that ClipGradNormTest and EmaTest compare (zoo_and_twin_with's, with max_grad_norm 0.5 and with an EMA
// of decay 0.9998), at batches 1 and 4.
const std::vector<std::pair<std::string, std::string>> kTwinSettings{{"clip", "  max_grad_norm: 0.5\n"},
                                                                     {"ema", "  ema: {decay: 0.9998}\n"}};

// The reference's documents (each with its fixture and one JSON object per batch size) of every pattern, in their
// order, then of the twins of kTwinSettings, in theirs: one run of tools/step_reference.py for StepReferenceTest,
// ClipGradNormTest and EmaTest (one CTest test, GROUPS), each fixture run as in a run of its own; torch, timm, PEFT
// and transformers imported once for the nine (a run for the patterns and one for the twins was 4.5 s of CPU more).
// Made by the first test that asks; `error` says why there are none.
struct References {
  nlohmann::json docs;
  std::string error;
};

const References& references() {
  static const References all = [] {
    testing::TempDir dir;
    std::string configs;
    for (const auto& p : patterns()) {
      std::string sizes;
      for (const auto b : p.batches) sizes += (sizes.empty() ? "" : ",") + std::to_string(b);
      configs += fmt::format(" --config {} --batch-sizes {}", fixture_path(p), sizes);
    }
    for (const auto& [name, line] : kTwinSettings) {
      configs += fmt::format(" --config {} --batch-sizes 1,4", zoo_and_twin_with(dir, line, name).first);
    }
    std::string out;
    const int rc = testing::run(fmt::format("({} {}/tools/step_reference.py{} 2>{}) > {}", MEMGATE_TORCH_PYTHON,
                                            testing::source_dir(), configs, dir / "err.txt", dir / "ref.json"),
                                &out);
    if (rc != 0) return References{{}, fmt::format("exit {}: {}{}", rc, out, testing::read_file(dir / "err.txt"))};
    auto docs = nlohmann::json::parse(read_text_file(dir / "ref.json", "the reference's JSON"));
    if (!docs.is_array() || docs.size() != patterns().size() + kTwinSettings.size()) {
      return References{{}, "expected a document per --config, got " + docs.dump()};
    }
    return References{std::move(docs), ""};
  }();
  return all;
}

// The reference's probes of pattern `p`: one JSON object per batch size.
nlohmann::json reference(const Pattern& p) {
  const auto& all = references();
  EXPECT_TRUE(all.error.empty()) << "tools/step_reference.py: " << all.error;
  if (!all.error.empty()) return nlohmann::json::array();
  for (std::size_t i = 0; i < patterns().size(); ++i) {
    if (all.docs[i].at("fixture") == fixture_path(p)) return all.docs[i].at("probes");
  }
  ADD_FAILURE() << "tools/step_reference.py made no document of " << fixture_path(p);
  return nlohmann::json::array();
}

class StepReferenceTest : public ::testing::TestWithParam<Pattern> {};

// memgate's measurement of the fixture equals the plain-PyTorch loop's, component by component, at each batch size.
TEST_P(StepReferenceTest, MeasuresWhatThePlainPyTorchLoopAllocates) {
  const auto& p = GetParam();
  const auto f = load_fixture(fixture_path(p));
  const auto ref = reference(p);
  ASSERT_EQ(ref.size(), p.batches.size());
  for (std::size_t i = 0; i < p.batches.size(); ++i) {
    const auto b = p.batches[i];
    const auto m = run_probe(f, b, kCpu);
    ASSERT_FALSE(m.oom) << m.error;
    // `ema` where the fixture keeps one: memgate has the component exactly where the reference made an EMA.
    EXPECT_EQ(m.components.keeps_ema, ref[i].contains("ema")) << p.fixture;
    for (const auto* c : kCompared) {
      if (!ref[i].contains(c)) continue;
      const auto want = ref[i].at(c).get<std::int64_t>();
      const auto got = m.components.get(c);
      std::cout << fmt::format("[ STEP     ] {} bs{} {:<16} memgate {:>9} reference {:>9} ({:+d})\n", p.fixture, b, c,
                               got, want, got - want);
      EXPECT_EQ(got, want) << p.fixture << " at batch " << b << ": " << c;
    }
  }
}

std::string pattern_name(const ::testing::TestParamInfo<Pattern>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(Patterns, StepReferenceTest, ::testing::ValuesIn(patterns()), pattern_name);

// The Meta-device estimate runs the same callables (the batch made on Meta with a CPU generator, compute_loss, the
// Python optimizer, the clipping): model states exact, activations and peaks within 1% of the measurement.
class StepEstimateTest : public ::testing::TestWithParam<Pattern> {};

TEST_P(StepEstimateTest, EstimatesTheStepWithinOnePercentOfItsMeasurement) {
  const auto& p = GetParam();
  const auto f = load_fixture(testing::source_dir() + "/fixtures/models/" + p.fixture + ".yaml");
  const auto measured = run_probes(f, p.batches, kCpu);
  const auto estimated = estimate_profile(f, p.batches, EstimateTarget::kCpu).probes;
  ASSERT_EQ(measured.size(), p.batches.size());
  ASSERT_EQ(estimated.size(), p.batches.size());
  for (std::size_t i = 0; i < p.batches.size(); ++i) {
    const auto& m = measured[i];
    const auto& e = estimated[i];
    ASSERT_FALSE(m.oom || e.oom) << m.error << e.error;
    const auto at = fmt::format("{} at batch {}", p.fixture, p.batches[i]);
    EXPECT_EQ(e.components.keeps_ema, m.components.keeps_ema) << at;
    for (const auto* c : kCompared) {
      std::cout << fmt::format("[ ESTIMATE ] {} {:<16} estimated {:>9} measured {:>9} ({:+.2f}%)\n", at, c,
                               e.components.get(c), m.components.get(c),
                               testing::error_pct(e.components.get(c), m.components.get(c)));
    }
    for (const auto* c : {"params", "gradients", "optimizer_state", "ema"}) {
      EXPECT_EQ(e.components.get(c), m.components.get(c)) << at << ": " << c;
    }
    for (const auto* c : {"activations", "forward_peak", "eval_peak", "step_peak"}) {
      EXPECT_LE(testing::error_pct(e.components.get(c), m.components.get(c)), 1.0) << at << ": " << c;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Patterns, StepEstimateTest, ::testing::ValuesIn(patterns()), pattern_name);

// --- Bad keys: the file, the key and what was expected --------------------------------------------------------------

struct BadStep {
  std::string name;
  std::string model;     ///< the model: section's keys after arch and entry
  std::string training;  ///< the training: section
  std::vector<std::string> says;
};

void PrintTo(const BadStep& c, std::ostream* os) { *os << c.name; }

class BadStepFixtureTest : public ::testing::TestWithParam<BadStep> {};

TEST_P(BadStepFixtureTest, NamesTheFileTheKeyAndWhatWasExpected) {
  const auto& c = GetParam();
  testing::TempDir dir;
  testing::write_file(dir / "models.py", "def build():\n    pass\n\ndef batch(b, d, g):\n    pass\n\n"
                                         "def loss(m, b):\n    pass\n");
  testing::write_file(dir / "f.yaml", "model:\n  arch: python\n  entry: models.py:build\n" + c.model +
                                          "training:\n" + c.training + "batch_sizes: [1]\n");
  try {
    (void)load_fixture(dir / "f.yaml");
    ADD_FAILURE() << c.name << ": no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("f.yaml")) << c.name;
    for (const auto& s : c.says) EXPECT_THAT(e.what(), HasSubstr(s)) << c.name;
  }
}

const std::string kIn = "  inputs:\n    - {shape: [B, 4], dtype: float32}\n";

INSTANTIATE_TEST_SUITE_P(
    Catalogue, BadStepFixtureTest,
    ::testing::Values(
        BadStep{"batch_and_inputs", "  batch: models.py:batch\n" + kIn + "  compute_loss: models.py:loss\n", "",
                {"model.inputs", "no inputs with a batch: callable"}},
        BadStep{"batch_with_classify", "  batch: models.py:batch\n  task: classify\n  num_classes: 3\n", "",
                {"model.task", "sum, or a compute_loss: callable"}},
        BadStep{"batch_with_loss", "  batch: models.py:batch\n  loss: models.py:loss\n", "",
                {"model.loss", "compute_loss"}},
        BadStep{"compute_loss_with_task", kIn + "  compute_loss: models.py:loss\n  task: sum\n", "",
                {"model.task", "no task with a compute_loss: callable"}},
        BadStep{"compute_loss_not_a_callable", kIn + "  compute_loss: models.py\n", "",
                {"model.compute_loss", "<file.py or dotted.module>:<callable>"}},
        BadStep{"batch_file_missing", "  batch: nothere.py:batch\n  compute_loss: models.py:loss\n", "",
                {"model.batch", "not there"}},
        BadStep{"target_without_loss", kIn + "  task: sum\n  target: {shape: [B], dtype: int64, high: 3}\n", "",
                {"model.target", "a loss: callable beside it"}},
        BadStep{"values_reversed", "  inputs:\n    - {shape: [B, 4], dtype: float32, values: [1.0, 0.0]}\n  task: sum\n",
                "", {"values", "[low, high]"}},
        BadStep{"values_on_integers", "  inputs:\n    - {shape: [B, 4], dtype: int64, values: [0, 3]}\n  task: sum\n", "",
                {"values", "ones or zeros", "high: N"}},
        BadStep{"kwarg_not_a_name", "  inputs:\n    - {shape: [B, 4], kwarg: 2x}\n  task: sum\n", "",
                {"kwarg", "a Python keyword"}},
        BadStep{"positional_after_kwarg",
                "  inputs:\n    - {shape: [B, 4], kwarg: x}\n    - {shape: [B, 4]}\n  task: sum\n", "",
                {"model.inputs", "positional inputs before"}},
        BadStep{"input_unknown_key", "  inputs:\n    - {shape: [B, 4], fill: ones}\n  task: sum\n", "", {"fill"}},
        BadStep{"optimizer_class_not_dotted", kIn + "  task: sum\n", "  optimizer: {class: RMSprop}\n",
                {"training.optimizer.class", "a dotted class name"}},
        BadStep{"optimizer_params_given", kIn + "  task: sum\n", "  optimizer: {class: torch.optim.SGD, params: []}\n",
                {"training.optimizer.params", "parameter groups"}},
        BadStep{"lr_beside_a_python_optimizer", kIn + "  task: sum\n",
                "  optimizer: {class: torch.optim.SGD}\n  lr: 0.1\n", {"training.lr", "no lr beside a Python optimizer"}},
        BadStep{"optimizer_word_unknown", kIn + "  task: sum\n", "  optimizer: rmsprop\n",
                {"training.optimizer", "adamw"}},
        BadStep{"max_grad_norm_zero", kIn + "  task: sum\n", "  max_grad_norm: 0\n", {"training.max_grad_norm"}},
        BadStep{"ema_decay_one", kIn + "  task: sum\n", "  ema: {decay: 1.0}\n",
                {"training.ema.decay", "between 0 and 1, both excluded"}},
        BadStep{"ema_without_decay", kIn + "  task: sum\n", "  ema: {}\n", {"decay"}},
        BadStep{"ema_unknown_key", kIn + "  task: sum\n", "  ema: {decay: 0.99, warmup: true}\n", {"warmup"}},
        BadStep{"ema_not_a_map", kIn + "  task: sum\n", "  ema: 0.999\n", {"training.ema"}},
        BadStep{"ema_with_fsdp", kIn + "  task: sum\n",
                "  ema: {decay: 0.99}\n  distributed: {strategy: fsdp, world_size: 2, units: root}\n",
                {"training.ema", "no EMA copy under FSDP"}},
        BadStep{"python_optimizer_with_fsdp", kIn + "  task: sum\n",
                "  optimizer: {class: torch.optim.SGD, lr: 0.1}\n  distributed: {strategy: fsdp, world_size: 2, units: root}\n",
                {"training.distributed", "a Python optimizer"}}),
    [](const ::testing::TestParamInfo<BadStep>& info) { return info.param.name; });

// A Python optimizer on a zoo model is refused where the fixture is read.
TEST(BadStepFixtureTest, APythonOptimizerOnAZooModelIsRefused) {
  testing::TempDir dir;
  auto yaml = testing::tiny_vit_yaml();
  yaml.replace(yaml.find("  optimizer: adamw\n"), 18, "  optimizer: {class: torch.optim.SGD, lr: 0.1}\n");
  testing::write_file(dir / "f.yaml", yaml);
  try {
    (void)load_fixture(dir / "f.yaml");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("training.optimizer"));
    EXPECT_THAT(e.what(), HasSubstr("adamw or sgd for a model that is not arch: python"));
  }
}

// --- Steps memgate does not measure: refused, naming the fixture ---------------------------------------------------

std::string probe_error(const std::string& yaml_text) {
  testing::TempDir dir;
  const auto models = testing::source_dir() + "/fixtures/models/python/step_models.py";
  testing::write_file(dir / "step_models.py", read_text_file(models, "a Python file") +
                                                  "\n\ndef two_losses(model, batch):\n"
                                                  "    out = model(*batch.inputs)\n"
                                                  "    return out.sum(), out.mean()\n\n"
                                                  "def own_backward(model, batch):\n"
                                                  "    loss = model(*batch.inputs).sum()\n"
                                                  "    loss.backward()\n"
                                                  "    return loss.detach()\n");
  testing::write_file(dir / "gan.yaml", yaml_text);
  try {
    (void)run_probe(load_fixture(dir / "gan.yaml"), 2, kCpu);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

const std::string kMlp = "model:\n  arch: python\n  entry: step_models.py:mlp\n  inputs:\n    - {shape: [B, 32]}\n";

TEST(StepRefusalTest, TwoOptimizersAreRefusedNamingTheFixture) {
  const auto message =
      probe_error(kMlp + "  task: sum\ntraining:\n  optimizer: step_models.py:two_optimizers\nbatch_sizes: [2]\n");
  EXPECT_THAT(message, HasSubstr("gan.yaml"));
  EXPECT_THAT(message, HasSubstr("training.optimizer"));
  EXPECT_THAT(message, HasSubstr("several optimizers (a GAN's generator and discriminator)"));
}

TEST(StepRefusalTest, ACallableReturningTwoLossesIsRefusedNamingTheFixture) {
  const auto message = probe_error(kMlp + "  compute_loss: step_models.py:two_losses\nbatch_sizes: [2]\n");
  EXPECT_THAT(message, HasSubstr("gan.yaml"));
  EXPECT_THAT(message, HasSubstr("model.compute_loss"));
  EXPECT_THAT(message, HasSubstr("expected one scalar loss"));
}

TEST(StepRefusalTest, ACallableRunningBackwardItselfIsRefusedNamingTheFixture) {
  const auto message = probe_error(kMlp + "  compute_loss: step_models.py:own_backward\nbatch_sizes: [2]\n");
  EXPECT_THAT(message, HasSubstr("gan.yaml"));
  EXPECT_THAT(message, HasSubstr("ran backward itself"));
}

// --- Clipping on the zoo: torch's clip_grad_norm_ allocates scalars only ------------------------------------------

// max_grad_norm on a zoo fixture: the same parameters, gradients, state and activations; the step's peak grows by
// no more than clip_grad_norm_'s scalars (one norm per gradient, their stack, the total and the coefficients).
TEST(ClipGradNormTest, ClippingAZooModelAddsOnlyItsScalarsToTheStep) {
  const auto plain = testing::fixture_from(testing::tiny_vit_yaml());
  const auto clipped = testing::fixture_from(testing::tiny_vit_yaml("  max_grad_norm: 1.0\n"));
  ASSERT_EQ(clipped.training.max_grad_norm, 1.0);
  EXPECT_NE(plain.hash, clipped.hash);
  const auto a = run_probe(plain, 2, kCpu);
  const auto b = run_probe(clipped, 2, kCpu);
  ASSERT_FALSE(a.oom || b.oom);
  for (const auto* c : {"params", "gradients", "optimizer_state", "activations", "forward_peak", "eval_peak"}) {
    EXPECT_EQ(a.components.get(c), b.components.get(c)) << c;
  }
  EXPECT_GE(b.components.step_peak, a.components.step_peak);
  const auto tensors = testing::trainable_tensors(clipped);
  EXPECT_LE(b.components.step_peak - a.components.step_peak, 4 * (2 * tensors + 8));
}

// The reference's probes of `suffix`'s twin ("clip" or "ema"), the same file the test writes (references()).
nlohmann::json twin_reference(const std::string& suffix) {
  const auto& all = references();
  EXPECT_TRUE(all.error.empty()) << "tools/step_reference.py: " << all.error;
  for (std::size_t i = 0; i < kTwinSettings.size() && all.error.empty(); ++i) {
    if (kTwinSettings[i].first != suffix) continue;
    const auto& doc = all.docs[patterns().size() + i];
    EXPECT_TRUE(doc.at("fixture").get<std::string>().ends_with("py_vit_tiny_lora_timm_" + suffix + ".yaml")) << doc;
    return doc.at("probes");
  }
  return nlohmann::json::array();
}

// At batches 1 and 4: the twin equals the plain-PyTorch loop running its callables (tools/step_reference.py), and the
// zoo equals the twin, on every component the reference reports (`ema` exactly where the zoo keeps an EMA copy).
void expect_zoo_twin_and_torch_agree(const std::string& twin_path, const Fixture& zoo, const std::string& suffix) {
  const auto python = load_fixture(twin_path);
  const std::vector<std::int64_t> batches{1, 4};
  const auto ref = twin_reference(suffix);
  ASSERT_EQ(ref.size(), batches.size());
  for (std::size_t i = 0; i < batches.size(); ++i) {
    const auto p = run_probe(python, batches[i], kCpu);
    const auto z = run_probe(zoo, batches[i], kCpu);
    ASSERT_FALSE(p.oom || z.oom) << p.error << z.error;
    ASSERT_EQ(ref[i].contains("ema"), zoo.training.ema_decay > 0.0);
    for (const auto* c : kCompared) {
      if (!ref[i].contains(c)) continue;  // `ema`: the fixture keeps none
      EXPECT_EQ(p.components.get(c), ref[i].at(c).get<std::int64_t>()) << "the twin against torch at batch "
                                                                        << batches[i] << ": " << c;
      EXPECT_EQ(z.components.get(c), p.components.get(c)) << "the zoo against its twin at batch " << batches[i] << ": "
                                                           << c;
    }
  }
}

// The zoo's clipping is torch's, to the byte: vit_tiny_lora with max_grad_norm equals its timm twin with it (a Python
// fixture whose clipping is memgate's C++ too), and that twin equals the plain-PyTorch loop calling
// torch.nn.utils.clip_grad_norm_ (tools/step_reference.py).
TEST(ClipGradNormTest, TheZoosClippingAllocatesWhatTorchsClipGradNormDoes) {
  testing::TempDir dir;
  const auto [twin, zoo] = zoo_and_twin_with(dir, kTwinSettings[0].second, "clip");
  ASSERT_EQ(zoo.training.max_grad_norm, 0.5);
  expect_zoo_twin_and_torch_agree(twin, zoo, "clip");
}

// --- An EMA copy on the zoo: a clone of every parameter and buffer, in every peak ---------------------------------

// training.ema on a zoo fixture: `ema` is the parameters' and buffers' bytes again; the step's other components are
// those of the same fixture without it, and every absolute peak holds the copy.
TEST(EmaTest, AZooModelsEmaCopyIsItsParametersAgainAndInEveryPeak) {
  const auto plain = testing::fixture_from(testing::tiny_vit_yaml());
  const auto kept = testing::fixture_from(testing::tiny_vit_yaml("  ema: {decay: 0.999}\n"));
  ASSERT_EQ(kept.training.ema_decay, 0.999);
  EXPECT_NE(plain.hash, kept.hash);
  const auto a = run_probe(plain, 2, kCpu);
  const auto b = run_probe(kept, 2, kCpu);
  ASSERT_FALSE(a.oom || b.oom) << a.error << b.error;
  EXPECT_FALSE(a.components.keeps_ema);
  ASSERT_TRUE(b.components.keeps_ema);
  EXPECT_EQ(b.components.ema, a.components.params);
  for (const auto* c : {"params", "gradients", "optimizer_state", "activations", "forward_peak"}) {
    EXPECT_EQ(a.components.get(c), b.components.get(c)) << c;
  }
  for (const auto* c : {"eval_peak", "step_peak"}) {
    EXPECT_EQ(b.components.get(c) - a.components.get(c), b.components.ema) << c;
  }
}

// The zoo's EMA is timm's, to the byte: vit_tiny_lora with an EMA equals its timm twin with one (a Python fixture whose
// copy is copy.deepcopy of the module), and that twin equals the plain-PyTorch loop with timm's own ModelEmaV3.
TEST(EmaTest, TheZoosEmaAllocatesWhatTimmsModelEmaV3Does) {
  testing::TempDir dir;
  const auto [twin, zoo] = zoo_and_twin_with(dir, kTwinSettings[1].second, "ema");
  ASSERT_EQ(zoo.training.ema_decay, 0.9998);
  expect_zoo_twin_and_torch_agree(twin, zoo, "ema");
}

// copy.deepcopy of a module on the CPU: a buffer's copy is made by torch.UntypedStorage, which takes LibTorch's default
// CPU allocator, not the counting one; memgate's probe counts it (a deep-copied BatchNorm holds what a second one
// built afresh holds: 136 B of running statistics and counter beside its 64 B of parameters).
// tools/checkpoint_reference.py launched once for the suite: PyTorch's plain loop over py_vit_tiny_lora_timm at batches
// 1 and 4 with torch.utils.checkpoint.checkpoint (use_reentrant=True, preserve_rng_state=False; PyTorch's default also
// keeps the CPU generator's state, 5,056 bytes a block, which memgate's checkpoint does not) around blocks.1 and
// blocks.2 (selection 0), then around base_model.model.blocks.1 alone (selection 1), as its JSON's "selections".
const std::vector<std::int64_t> kCheckpointBatches{1, 4};

const nlohmann::json& checkpoint_reference() {
  static const auto selections = testing::checkpoint_reference_selections(
      "py_vit_tiny_lora_timm", "--blocks blocks.1,blocks.2 --blocks base_model.model.blocks.1 --batch-sizes 1,4");
  return selections;
}

// Every component of `fixture` at kCheckpointBatches equals the reference's selection `index`.
void expect_checkpoint_reference(const Fixture& fixture, std::size_t index) {
  const auto& selections = checkpoint_reference();
  ASSERT_TRUE(selections.is_array()) << "the reference failed: " << selections.dump();
  ASSERT_GT(selections.size(), index);
  const auto& ref = selections[index].at("probes");
  ASSERT_EQ(ref.size(), kCheckpointBatches.size());
  for (std::size_t i = 0; i < kCheckpointBatches.size(); ++i) {
    const auto probe = run_probe(fixture, kCheckpointBatches[i], kCpu);
    ASSERT_FALSE(probe.oom) << probe.error;
    for (const auto* c : kCompared) {
      if (!ref[i].contains(c)) continue;  // `ema`: none kept
      EXPECT_EQ(probe.components.get(c), ref[i].at(c).get<std::int64_t>()) << "batch " << kCheckpointBatches[i] << ": "
                                                                            << c;
    }
  }
}

// py_vit_tiny_lora_timm with `gradient_checkpointing: <value>`, its entry an absolute path, written into `dir`.
Fixture python_vit_checkpointed(const testing::TempDir& dir, const std::string& value, const std::string& stem) {
  const auto models = testing::source_dir() + "/fixtures/models/";
  auto text = read_text_file(models + "py_vit_tiny_lora_timm.yaml", "a fixture");
  text.replace(text.find("entry: python/models.py"), 23, "entry: " + models + "python/models.py");
  text.replace(text.find("  precision: fp32\n"), 18, "  precision: fp32\n  gradient_checkpointing: " + value + "\n");
  write_file_atomically(dir / (stem + ".yaml"), text);
  return load_fixture(dir / (stem + ".yaml"));
}

// The zoo's checkpointing of chosen blocks is torch's, to the byte: vit_tiny_lora with
// `gradient_checkpointing: {blocks: [blocks.1, blocks.2]}` equals its timm twin in the plain-PyTorch loop with those
// two blocks' forwards wrapped in torch.utils.checkpoint.checkpoint, on every component at batches 1 and 4.
TEST(CheckpointReferenceTest, TheZoosChosenBlocksAllocateWhatTorchUtilsCheckpointDoes) {
  testing::TempDir dir;
  const auto models = testing::source_dir() + "/fixtures/models/";
  auto text = read_text_file(models + "vit_tiny_lora.yaml", "a fixture");
  text.replace(text.find("  precision: fp32\n"), 18,
               "  precision: fp32\n  gradient_checkpointing: {blocks: [blocks.1, blocks.2]}\n");
  write_file_atomically(dir / "vit_tiny_lora_ck12.yaml", text);
  expect_checkpoint_reference(load_fixture(dir / "vit_tiny_lora_ck12.yaml"), 0);
}

// A Python fixture checkpoints exactly the blocks it names (issue 70), as Python names them: py_vit_tiny_lora_timm
// with `{blocks: [base_model.model.blocks.1]}`, measured by memgate through its Python extension, equals the same
// model in PyTorch's loop with that one block's forward in torch.utils.checkpoint.checkpoint, every component at
// batches 1 and 4.
TEST(CheckpointReferenceTest, APythonFixturesChosenBlockAllocatesWhatTorchUtilsCheckpointDoes) {
  testing::TempDir dir;
  expect_checkpoint_reference(python_vit_checkpointed(dir, "{blocks: [base_model.model.blocks.1]}", "py_ck1"), 1);
}

// Checkpointing k of a Python model's n blocks keeps strictly fewer activations than none and strictly more than all:
// py_vit_tiny_lora_timm (4 blocks) at batch 2 with none, one, two and all of them checkpointed, probed in that order
// in one process (the parked build of one probe serves the next, whose selection differs).
TEST(PythonCheckpointingTest, KOfNBlocksKeepActivationsStrictlyBetweenNoneAndAll) {
  testing::TempDir dir;
  const std::vector<std::pair<std::string, std::string>> settings{
      {"none", "false"},
      {"one", "{blocks: [base_model.model.blocks.1]}"},
      {"two", "{blocks: [base_model.model.blocks.0, base_model.model.blocks.2]}"},
      {"all", "true"}};
  std::vector<std::int64_t> activations;
  for (const auto& [stem, value] : settings) {
    const auto probe = run_probe(python_vit_checkpointed(dir, value, stem), 2, kCpu);
    ASSERT_FALSE(probe.oom) << stem << ": " << probe.error;
    activations.push_back(probe.components.activations);
  }
  EXPECT_GT(activations[0], activations[1]) << "none against one block";
  EXPECT_GT(activations[1], activations[2]) << "one block against two";
  EXPECT_GT(activations[2], activations[3]) << "two blocks against all four";
}

TEST(CpuStorageCopyTest, ADeepCopiedModulesBuffersAreCounted) {
  testing::TempDir dir;
  testing::write_file(dir / "copies.py",
                      "import copy\nimport torch\n\n"
                      "def copied():\n    bn = torch.nn.BatchNorm2d(8)\n    return torch.nn.Sequential(bn, copy.deepcopy(bn))\n\n"
                      "def fresh():\n    return torch.nn.Sequential(torch.nn.BatchNorm2d(8), torch.nn.BatchNorm2d(8))\n");
  for (const auto* name : {"copied", "fresh"}) {
    testing::write_file(dir / (std::string(name) + ".yaml"),
                        fmt::format("model:\n  arch: python\n  entry: copies.py:{}\n  inputs:\n    - {{shape: [B, 8, 4, 4]}}\n"
                                    "  task: sum\ntraining:\n  optimizer: sgd\n  trainable: all\nbatch_sizes: [2]\n",
                                    name));
  }
  const auto copied = run_probe(load_fixture(dir / "copied.yaml"), 2, kCpu);
  const auto fresh = run_probe(load_fixture(dir / "fresh.yaml"), 2, kCpu);
  ASSERT_FALSE(copied.oom || fresh.oom) << copied.error << fresh.error;
  EXPECT_EQ(fresh.components.params, 2 * (4 * 8 * 4 + 8)) << "two BatchNorm2d(8): four float vectors and a counter each";
  EXPECT_EQ(copied.components.params, fresh.components.params);
}

// A fixture without the new keys keeps its hash (its baselines stay valid).
TEST(StepFixtureTest, FixturesWithoutTheNewKeysKeepTheirHash) {
  const auto f = testing::model_fixture("py_llama_tiny_lora");
  EXPECT_TRUE(f.canonical.at("training").find("max_grad_norm") == f.canonical.at("training").end());
  EXPECT_TRUE(f.canonical.at("training").find("ema") == f.canonical.at("training").end());
  EXPECT_TRUE(f.canonical.at("model").find("batch") == f.canonical.at("model").end());
  for (const auto& input : f.canonical.at("model").at("inputs")) {
    EXPECT_TRUE(input.find("kwarg") == input.end());
    EXPECT_TRUE(input.find("values") == input.end());
  }
}

}  // namespace
}  // namespace memgate
