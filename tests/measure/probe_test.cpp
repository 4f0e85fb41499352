// The probe protocol on the CPU, with real LibTorch: exact components, scaling, LoRA, repeatability.
#include "memgate/backend/cpu_allocator.h"
#include "memgate/backend/device.h"
#include "memgate/base/error.h"
#include "memgate/models/model.h"
#include "memgate/measure/probe.h"
#include "memgate/launch/run.h"
#include "fixture_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

namespace memgate {
namespace {

using testing::fixture_from;
using testing::tiny_vit_yaml;

using testing::kCpu;

ProbeResult probe(const Fixture& f, std::int64_t bs) {
  auto r = run_probe(f, bs, kCpu);
  EXPECT_FALSE(r.oom) << r.error;
  return r;
}

TEST(ProbeTest, ParamsAreTheBytesOfParametersAndBuffers) {
  const auto f = fixture_from(tiny_vit_yaml());
  auto model = build_model(f.model, kCpu);
  EXPECT_EQ(probe(f, 2).components.params, parameter_and_buffer_bytes(model->module()));
  EXPECT_EQ(parameter_and_buffer_bytes(model->module()), count_parameters(model->module()).total * 4);
}

TEST(ProbeTest, GradientsAndAdamWStateFollowTrainableParameters) {
  const auto f = fixture_from(tiny_vit_yaml("  trainable: all\n"));
  const auto counts = workload_param_counts(f);
  const auto r = probe(f, 2);
  EXPECT_EQ(r.components.gradients, counts.trainable * 4);
  EXPECT_EQ(r.components.optimizer_state, testing::adamw_state_bytes(f, counts.trainable));
}

TEST(ProbeTest, SgdKeepsOneBufferWithMomentumAndNoneWithout) {
  auto momentum = tiny_vit_yaml();
  momentum.replace(momentum.find("optimizer: adamw"), 16, "optimizer: sgd\n  momentum: 0.9");
  const auto with = fixture_from(momentum);
  EXPECT_EQ(probe(with, 2).components.optimizer_state, workload_param_counts(with).trainable * 4);
  auto plain = tiny_vit_yaml();
  plain.replace(plain.find("optimizer: adamw"), 16, "optimizer: sgd");
  EXPECT_EQ(probe(fixture_from(plain), 2).components.optimizer_state, 0);
}

TEST(ProbeTest, ActivationsGrowLinearlyWithBatchSize) {
  const auto f = fixture_from(tiny_vit_yaml());
  const auto a4 = probe(f, 4).components.activations;
  const auto a8 = probe(f, 8).components.activations;
  const auto a16 = probe(f, 16).components.activations;
  EXPECT_NEAR(static_cast<double>(a8) / static_cast<double>(a4), 2.0, 2.0 * 0.02);
  EXPECT_NEAR(static_cast<double>(a16) / static_cast<double>(a8), 2.0, 2.0 * 0.02);
}

TEST(ProbeTest, StepPeakHoldsEverythingAndEvalNeedsLess) {
  for (const auto* trainable : {"  trainable: all\n", "  trainable: head\n"}) {
    const auto f = fixture_from(tiny_vit_yaml(trainable));
    const auto c = probe(f, 4).components;
    EXPECT_GE(c.step_peak, c.params + c.optimizer_state + c.activations) << trainable;
    EXPECT_LT(c.eval_peak, c.step_peak) << trainable;
    EXPECT_GE(c.forward_peak, c.activations) << trainable;
    EXPECT_EQ(c.step_peak_reserved, c.step_peak) << "the CPU has no allocator cache";
  }
}

TEST(ProbeTest, LoraTrainsAdaptersAndHeadOnly) {
  const auto f = fixture_from(tiny_vit_yaml("  trainable: lora\n", "  lora: {rank: 4, alpha: 8, targets: [qkv, fc2]}\n"));
  const auto counts = workload_param_counts(f);
  const std::int64_t d = 64, hidden = 256, depth = 4, r = 4, classes = 5;
  const std::int64_t qkv = r * d + 3 * d * r, fc2 = r * hidden + d * r;
  const std::int64_t head = d * classes + classes;
  EXPECT_EQ(counts.trainable, depth * (qkv + fc2) + head) << "adapters and the classifier head, not the final norm";
  const auto c = probe(f, 2).components;
  EXPECT_EQ(c.gradients, counts.trainable * 4) << "the frozen backbone must get no gradient";
  EXPECT_EQ(c.optimizer_state, testing::adamw_state_bytes(f, counts.trainable))
      << "the frozen backbone must get no optimizer state";

  auto model = build_model(f.model, kCpu);
  (void)select_trainable(*model, f.training.trainable);
  for (const auto& item : model->module().named_parameters()) {
    const bool adapter = item.key().find("lora_") != std::string::npos;
    const bool head_part = item.key().rfind("head.", 0) == 0;
    EXPECT_EQ(item.value().requires_grad(), adapter || head_part) << item.key();
  }
}

TEST(ProbeTest, HeadTrainsTheClassifierOnly) {
  const auto f = fixture_from(tiny_vit_yaml("  trainable: head\n"));
  const std::int64_t d = 64, classes = 5;
  EXPECT_EQ(workload_param_counts(f).trainable, d * classes + classes);
}

TEST(ProbeTest, PatternsSelectByNameWithExactCounts) {
  const std::int64_t d = 64, hidden = 256, depth = 4, r = 4, classes = 5;
  const std::int64_t qkv = r * d + 3 * d * r, fc2 = r * hidden + d * r, head = d * classes + classes;
  const std::string lora = "  lora: {rank: 4, alpha: 8, targets: [qkv, fc2]}\n";
  // The same selection as trainable: lora, spelled as patterns (PEFT's target modules + modules_to_save).
  const auto as_lora = fixture_from(tiny_vit_yaml("  trainable: {train: [\"head.*\", \"*.lora_*\"]}\n", lora));
  EXPECT_EQ(workload_param_counts(as_lora).trainable, depth * (qkv + fc2) + head);
  const auto c = probe(as_lora, 2).components;
  EXPECT_EQ(c.gradients, workload_param_counts(as_lora).trainable * 4);
  // The final norm with the head: what `head` trained before it followed timm.
  const auto norm_and_head = fixture_from(tiny_vit_yaml("  trainable: {train: [\"norm.*\", \"head.*\"]}\n"));
  EXPECT_EQ(workload_param_counts(norm_and_head).trainable, 2 * d + head);
  // `?` and classes: the last block's MLP only.
  const auto last_mlp = fixture_from(tiny_vit_yaml("  trainable: {train: [\"blocks.[3].mlp.fc?.*\"]}\n"));
  EXPECT_EQ(workload_param_counts(last_mlp).trainable, (d * hidden + hidden) + (hidden * d + d));
}

TEST(ProbeTest, PatternThatMatchesNothingNamesRealParameters) {
  const auto f = fixture_from(tiny_vit_yaml("  trainable: {train: [\"head.*\", \"decoder.*\"]}\n"));
  try {
    (void)workload_param_counts(f);
    FAIL() << "a pattern that matches nothing must be an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_THAT(what, ::testing::HasSubstr("'decoder.*' matches no parameter"));
    EXPECT_THAT(what, ::testing::HasSubstr("cls_token"));
    EXPECT_THAT(what, ::testing::HasSubstr("head.bias"));
  }
}

TEST(ProbeTest, SameProbeTwiceInOneProcessGivesIdenticalBytes) {
  const auto f = fixture_from(tiny_vit_yaml("  trainable: lora\n", "  lora: {rank: 4}\n"));
  EXPECT_EQ(probe(f, 4).components, probe(f, 4).components);
}

// The benchmarks time PreparedStep's steps: their peak above the base is the probe's step_peak, by construction
// (one build, one warm-up, one TrainingStep), for a plain step and for one with four accumulation micro-batches.
TEST(PreparedStepTest, ABenchmarkedStepPeaksAtTheProbesStepPeak) {
  for (const auto& training : {std::string("  trainable: lora\n"), std::string("  accumulation_steps: 4\n")}) {
    const auto f = fixture_from(tiny_vit_yaml(training, "  lora: {rank: 4}\n"));
    const auto probed = probe(f, 2).components;
    PreparedStep prepared(f, 2, kCpu);
    for (int step = 0; step < 3; ++step) {
      prepared.backend().reset_peak();
      prepared.step().run();
      const auto s = prepared.backend().snapshot();
      EXPECT_EQ(s.peak_allocated - prepared.base().allocated, probed.step_peak) << training << " step " << step;
      EXPECT_EQ(s.peak_reserved - prepared.base().reserved, probed.step_peak_reserved) << training;
      const auto& batch = prepared.step().batch();
      auto batch_bytes = static_cast<std::int64_t>(batch.target.nbytes());
      for (const auto& input : batch.inputs) batch_bytes += static_cast<std::int64_t>(input.nbytes());
      EXPECT_EQ(s.allocated - prepared.base().allocated, probed.params + probed.optimizer_state + batch_bytes)
          << "between steps only parameters, optimizer state and the batch stay";
    }
  }
}

TEST(ProbeTest, OutOfMemoryIsRecordedAndTheNextBatchSizeStillRuns) {
  const auto f = fixture_from(tiny_vit_yaml());
  const auto small = probe(f, 1).components.step_peak;
  auto& counter = CountingCpuAllocator::install();
  // A cap between what batch 1 and batch 64 need: 64 runs out of memory, 1 (after it) still runs.
  counter.set_limit(counter.current_bytes() + small * 2);
  const auto profile = run_profile(f, {64, 1}, kCpu);
  counter.set_limit(0);
  ASSERT_EQ(profile.probes.size(), 2U);
  EXPECT_TRUE(profile.probes[0].oom);
  EXPECT_NE(profile.probes[0].error.find("limit"), std::string::npos) << profile.probes[0].error;
  EXPECT_FALSE(profile.probes[1].oom);
  EXPECT_EQ(profile.probes[1].components.step_peak, small);
}

// An out-of-memory in the middle of backward leaves the failed graph's pending tasks, with their gradients, in the
// autograd engine's ready queue; the probe drops them, so the next probe measures as if it had never run. (Before,
// the next probe's step_peak read 6.5 MB low: they were freed during its step.) Caps between batch 1's peak and
// batch 6's stop the bf16 ResNet twin at several points of its step, backward included.
TEST(ProbeTest, AProbeAfterAnOutOfMemoryInBackwardMeasuresAsIfItHadNotRun) {
  const auto f = load_fixture(testing::source_dir() + "/fixtures/models/resnet_tiny_fewshot_amp_accum.yaml");
  const auto clean = probe(f, 1).components;
  const auto six = probe(f, 6).components.step_peak;
  auto& counter = CountingCpuAllocator::install();
  int failed = 0;
  for (const int i : {8, 16, 23}) {
    counter.set_limit(counter.current_bytes() + clean.step_peak + (six - clean.step_peak) * i / 24);
    const auto r = run_probe(f, 6, kCpu);
    counter.set_limit(0);
    failed += r.oom ? 1 : 0;
    EXPECT_EQ(probe(f, 1).components, clean) << "after a probe capped at " << i << "/24 of the way";
  }
  EXPECT_EQ(failed, 3);
}

// Out of memory in every form the machine gives it: a batch the machine cannot hold is out of memory at that
// batch, and the probes before and after it measure as if it had never run.
TEST(ProbeTest, ABatchTheMachineCannotHoldIsOutOfMemoryAndTheRunGoesOn) {
  const auto f = fixture_from(tiny_vit_yaml());
  const auto profile = run_profile(f, {1, 1'000'000'000'000, 1}, kCpu);
  ASSERT_EQ(profile.probes.size(), 3U);
  EXPECT_FALSE(profile.probes[0].oom) << profile.probes[0].error;
  EXPECT_TRUE(profile.probes[1].oom);
  EXPECT_NE(profile.probes[1].error.find("could not allocate"), std::string::npos) << profile.probes[1].error;
  EXPECT_FALSE(profile.probes[2].oom) << profile.probes[2].error;
  EXPECT_EQ(profile.probes[0].components.get("step_peak"), profile.probes[2].components.get("step_peak"));
  EXPECT_EQ(profile.probes[0].components.get("activations"), profile.probes[2].components.get("activations"));
}

TEST(ProbeTest, RecognizesEveryKindOfOutOfMemory) {
  for (const auto* message :
       {"CUDA out of memory. Tried to allocate 2.00 GiB", "CUDA error: out of memory",
        "CUDA error: cudaErrorMemoryAllocation", "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "cuDNN error: CUDNN_STATUS_ALLOC_FAILED", "DefaultCPUAllocator: not enough memory: you tried to allocate 8 bytes",
        "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1024 bytes"}) {
    EXPECT_TRUE(is_out_of_memory(message)) << message;
  }
  for (const auto* message : {"mat1 and mat2 shapes cannot be multiplied", "CUDA error: an illegal memory access",
                              "CUBLAS_STATUS_EXECUTION_FAILED"}) {
    EXPECT_FALSE(is_out_of_memory(message)) << message;
  }
}

TEST(ProbeTest, BatchSizeZeroIsAnError) {
  const auto f = fixture_from(tiny_vit_yaml());
  EXPECT_THROW((void)run_probe(f, 0, kCpu), Error);
}

}  // namespace
}  // namespace memgate
