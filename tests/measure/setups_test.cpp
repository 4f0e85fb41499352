// Each training setup's effect, measured on the CPU: autocast, checkpointing, accumulation, frozen stages.
#include "memgate/base/error.h"
#include "memgate/models/model.h"
#include "memgate/measure/probe.h"
#include "memgate/measure/training.h"
#include "memgate/launch/run.h"
#include "fixture_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace memgate {
namespace {

using testing::fixture_from;
using testing::tiny_vit_yaml;

using testing::kCpu;

// A ViT wide enough that activations dominate the fixed overheads.
std::string vit(const std::string& training) {
  return "model:\n  arch: vit\n  img_size: 64\n  patch_size: 8\n  embed_dim: 96\n  depth: 4\n  num_heads: 4\n"
         "  num_classes: 5\ntraining:\n  optimizer: adamw\n" + training + "batch_sizes: [4]\n";
}

Components measure(const std::string& yaml, std::int64_t bs = 4) {
  auto r = run_probe(fixture_from(yaml), bs, kCpu);
  EXPECT_FALSE(r.oom) << r.error;
  return r.components;
}

double ratio(std::int64_t a, std::int64_t b) { return static_cast<double>(a) / static_cast<double>(b); }

TEST(SetupsTest, Bf16AutocastRoughlyHalvesActivations) {
  const auto fp32 = measure(vit(""));
  const auto bf16 = measure(vit("  precision: bf16\n"));
  // Bound: at most 0.75 of fp32 (half, plus what stays fp32 under autocast: the residual stream, which timm's cat
  // promotes to the class token's fp32, and what norms, softmax and the loss save; 0.717 here).
  EXPECT_LT(ratio(bf16.activations, fp32.activations), 0.75);
  EXPECT_GT(ratio(bf16.activations, fp32.activations), 0.30);
  EXPECT_EQ(bf16.params, fp32.params) << "autocast keeps fp32 master weights";
}

TEST(SetupsTest, CheckpointingKeepsLittleMoreThanBlockInputs) {
  const auto plain = measure(vit(""));
  const auto ckpt = measure(vit("  gradient_checkpointing: true\n"));
  EXPECT_LT(ratio(ckpt.activations, plain.activations), 0.40);
  // What remains: each block's input [B, tokens, D] in fp32, plus the stem and the head's activations.
  const std::int64_t block_inputs = 4 /*blocks*/ * 4 /*batch*/ * 65 /*tokens*/ * 96 * 4;
  EXPECT_GE(ckpt.activations, block_inputs);
  EXPECT_EQ(ckpt.gradients, plain.gradients);
}

// `gradient_checkpointing: {blocks: [...]}` with the first k of the 4 blocks: activations fall strictly with each
// block added, from none's (k = 0, the same bytes as false) to all's (k = 4, the same bytes as true).
TEST(SetupsTest, CheckpointingChosenBlocksKeepsActivationsStrictlyBetweenNoneAndAllMonotoneInTheirNumber) {
  const auto plain = measure(vit(""));
  const auto ckpt = measure(vit("  gradient_checkpointing: true\n"));
  std::vector<std::int64_t> by_k{plain.activations};
  std::string blocks;
  for (int k = 1; k <= 4; ++k) {
    blocks += std::string(k > 1 ? ", " : "") + "blocks." + std::to_string(k - 1);
    by_k.push_back(measure(vit("  gradient_checkpointing: {blocks: [" + blocks + "]}\n")).activations);
    EXPECT_LT(by_k[k], by_k[k - 1]) << k << " blocks checkpointed";
  }
  EXPECT_EQ(by_k[4], ckpt.activations) << "the list of every block is true";
  EXPECT_GT(by_k[1], ckpt.activations);
}

TEST(SetupsTest, CheckpointingABlockTheModelLacksNamesTheFixtureTheKeyAndSomeBlocks) {
  const auto f = fixture_from(vit("  gradient_checkpointing: {blocks: [blocks.1, block.2]}\n"), "ckpt_typo");
  try {
    (void)run_probe(f, 2, kCpu);
    FAIL() << "block.2 is no block of the ViT";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_THAT(what, ::testing::HasSubstr("ckpt_typo.yaml: training.gradient_checkpointing.blocks: 'block.2' is no "
                                           "block of the model"));
    EXPECT_THAT(what, ::testing::HasSubstr("blocks.0, blocks.1, blocks.2, blocks.3"));
  }
}

TEST(SetupsTest, CheckpointingGivesIdenticalGradients) {
  const auto f = fixture_from(vit(""));
  std::vector<torch::Tensor> grads[2];
  for (int checkpointed = 0; checkpointed < 2; ++checkpointed) {
    auto model = build_model(f.model, kCpu, /*seed=*/3);
    model->set_gradient_checkpointing(checkpointed == 1);
    torch::manual_seed(5);
    const auto batch = model->make_batch(2);
    model->loss(batch).backward();
    for (const auto& p : model->module().parameters()) grads[checkpointed].push_back(p.grad().clone());
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (std::size_t i = 0; i < grads[0].size(); ++i) {
    EXPECT_TRUE(torch::equal(grads[0][i], grads[1][i])) << "parameter " << i;
  }
}

TEST(SetupsTest, AccumulationStepPeakFollowsTheMicroBatch) {
  const auto one = measure(vit(""), 4);
  const auto accumulated = measure(vit("  accumulation_steps: 4\n"), 4);
  const auto big = measure(vit(""), 16);
  EXPECT_LE(accumulated.step_peak, one.step_peak + one.gradients) << "micro-batch 4, effective batch 16";
  EXPECT_LT(accumulated.step_peak, big.step_peak);
  EXPECT_EQ(accumulated.activations, one.activations);
}

TEST(SetupsTest, FrozenStagesGetNoGradientsAndNoOptimizerState) {
  const auto stage1 = fixture_from(vit("  trainable: head\n"));
  const auto unfreeze = fixture_from(vit("  trainable: last_blocks:2\n"));
  const auto stage2 = fixture_from(vit("  trainable: all\n"));
  std::int64_t previous_trainable = 0;
  for (const auto* f : {&stage1, &unfreeze, &stage2}) {
    const auto counts = workload_param_counts(*f);
    const auto c = run_probe(*f, 4, kCpu).components;
    EXPECT_EQ(c.gradients, counts.trainable * 4) << f->training.trainable.str();
    EXPECT_EQ(c.optimizer_state, testing::adamw_state_bytes(*f, counts.trainable)) << f->training.trainable.str();
    EXPECT_GT(counts.trainable, previous_trainable) << f->training.trainable.str();
    previous_trainable = counts.trainable;
  }
}

TEST(SetupsTest, OptimizersKeepTwoOneOrNoBuffers) {
  const auto adamw = measure(vit("  trainable: all\n"));
  const auto momentum = measure("model:\n  arch: vit\n  img_size: 64\n  patch_size: 8\n  embed_dim: 96\n  depth: 4\n"
                                "  num_heads: 4\n  num_classes: 5\ntraining:\n  optimizer: sgd\n  momentum: 0.9\n"
                                "batch_sizes: [4]\n");
  // Two moments against one buffer, and AdamW's 4-byte step per tensor.
  const auto f = fixture_from(vit("  trainable: all\n"));
  EXPECT_EQ(adamw.optimizer_state, 2 * momentum.optimizer_state + 4 * testing::trainable_tensors(f));
}

}  // namespace
}  // namespace memgate
