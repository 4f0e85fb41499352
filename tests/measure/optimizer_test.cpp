// Optimizers as torch.optim runs them: the per-parameter loop, foreach ops and fused kernels update parameters
// alike and keep the same state, while their temporaries, and so the step's peak, differ as PyTorch's do.
#include "memgate/measure/probe.h"
#include "memgate/measure/training.h"
#include "memgate/launch/run.h"
#include "fixture_util.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

namespace memgate {
namespace {

using testing::fixture_from;
using testing::tiny_vit_yaml;

using testing::kCpu;

Components measure(const std::string& training, const std::string& impl, std::int64_t batch_size = 1) {
  const auto f = fixture_from(tiny_vit_yaml(training + "  optimizer_impl: " + impl + "\n"));
  const auto r = run_probe(f, batch_size, kCpu);
  EXPECT_FALSE(r.oom) << r.error;
  return r.components;
}

// Parameters after `steps` steps of `impl` from the same start and the same gradients.
std::vector<torch::Tensor> train(const TrainingSpec& spec, int steps) {
  torch::manual_seed(0);
  std::vector<torch::Tensor> params = {torch::randn({7, 5}).requires_grad_(), torch::randn({5}).requires_grad_(),
                                       torch::randn({3, 2}, torch::kFloat64).requires_grad_()};
  auto optimizer = make_optimizer(spec, params, kCpu);
  for (int s = 0; s < steps; ++s) {
    for (auto& p : params) p.mutable_grad() = torch::full_like(p, 0.1 * (s + 1)) + p.detach() * 0.01;
    optimizer->step();
    optimizer->zero_grad();
    for (const auto& p : params) EXPECT_FALSE(p.grad().defined()) << "zero_grad sets gradients to none";
  }
  return params;
}

TEST(OptimizerTest, ImplementationsUpdateParametersAlike) {
  for (const auto optimizer : {Optimizer::kAdamW, Optimizer::kSgd}) {
    TrainingSpec spec;
    spec.optimizer = optimizer;
    spec.lr = 0.01;
    spec.weight_decay = 0.05;
    spec.momentum = optimizer == Optimizer::kSgd ? 0.9 : 0.0;
    spec.optimizer_impl = OptimizerImpl::kForLoop;
    const auto reference = train(spec, 3);
    for (const auto impl : {OptimizerImpl::kForeach, OptimizerImpl::kFused}) {
      spec.optimizer_impl = impl;
      const auto other = train(spec, 3);
      for (std::size_t i = 0; i < reference.size(); ++i) {
        EXPECT_TRUE(torch::allclose(reference[i], other[i], 1e-5, 1e-6))
            << name_of(kOptimizerNames, optimizer) << " " << name_of(kOptimizerImplNames, impl) << " param " << i;
      }
    }
  }
}

// LibTorch's own AdamW runs the same arithmetic as the per-parameter loop: a check of ours.
TEST(OptimizerTest, TheLoopMatchesLibTorchsAdamW) {
  TrainingSpec spec;
  spec.lr = 0.01;
  spec.weight_decay = 0.05;
  spec.optimizer_impl = OptimizerImpl::kForLoop;
  const auto ours = train(spec, 3);
  torch::manual_seed(0);
  std::vector<torch::Tensor> params = {torch::randn({7, 5}).requires_grad_(), torch::randn({5}).requires_grad_(),
                                       torch::randn({3, 2}, torch::kFloat64).requires_grad_()};
  torch::optim::AdamW theirs(params, torch::optim::AdamWOptions(0.01).weight_decay(0.05));
  for (int s = 0; s < 3; ++s) {
    for (auto& p : params) p.mutable_grad() = torch::full_like(p, 0.1 * (s + 1)) + p.detach() * 0.01;
    theirs.step();
    theirs.zero_grad();
  }
  for (std::size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::allclose(ours[i], params[i], 1e-6, 1e-7)) << i;
}

TEST(OptimizerTest, AutoIsPyTorchsDefaultForTheDevice) {
  EXPECT_EQ(resolve_optimizer_impl(OptimizerImpl::kAuto, kCpu), OptimizerImpl::kForLoop);
  EXPECT_EQ(resolve_optimizer_impl(OptimizerImpl::kAuto, c10::Device(c10::DeviceType::CUDA, 0)),
            OptimizerImpl::kForeach);
  EXPECT_EQ(resolve_optimizer_impl(OptimizerImpl::kFused, c10::Device(c10::DeviceType::CUDA, 0)),
            OptimizerImpl::kFused);
  const auto loop = measure("  trainable: all\n", "for_loop");
  const auto automatic = measure("  trainable: all\n", "auto");
  EXPECT_EQ(automatic.step_peak, loop.step_peak);
  EXPECT_EQ(automatic.optimizer_state, loop.optimizer_state);
}

// AdamW: foreach holds sqrt(exp_avg_sq) of every parameter at once, the loop one parameter's temporaries, the fused
// kernel none. At batch 1 the optimizer step is the step's peak, so the peaks order as the temporaries do.
TEST(OptimizerTest, AdamWStateIsTheSameAndPeaksFollowTheTemporaries) {
  const auto f = fixture_from(tiny_vit_yaml("  trainable: all\n"));
  const auto trainable_bytes = workload_param_counts(f).trainable * 4;
  const auto loop = measure("  trainable: all\n", "for_loop");
  const auto foreach = measure("  trainable: all\n", "foreach");
  const auto fused = measure("  trainable: all\n", "fused");
  EXPECT_EQ(loop.optimizer_state, foreach.optimizer_state);
  EXPECT_EQ(loop.optimizer_state, fused.optimizer_state);
  EXPECT_EQ(loop.gradients, foreach.gradients);
  EXPECT_EQ(loop.activations, fused.activations);
  EXPECT_GT(foreach.step_peak, loop.step_peak);
  EXPECT_GE(foreach.step_peak - loop.step_peak, trainable_bytes / 2)
      << "foreach's sqrt temporaries are nearly a copy of the trainable parameters";
  EXPECT_LE(foreach.step_peak - fused.step_peak, trainable_bytes + 4096);
  EXPECT_LT(fused.step_peak, loop.step_peak);
}

// SGD with momentum and weight decay: foreach adds weight decay into a new gradient of every parameter at once.
TEST(OptimizerTest, SgdStateIsTheSameAndForeachHoldsDecayedGradients) {
  const std::string sgd = "  trainable: all\n  weight_decay: 0.0005\n";
  auto with = [&](const std::string& impl) {
    const auto f = fixture_from("model:\n  arch: vit\n  img_size: 32\n  patch_size: 8\n  embed_dim: 64\n  depth: 4\n"
                                "  num_heads: 4\n  num_classes: 5\ntraining:\n  optimizer: sgd\n  momentum: 0.9\n" +
                                sgd + "  optimizer_impl: " + impl + "\nbatch_sizes: [1]\n");
    return run_probe(f, 1, kCpu).components;
  };
  const auto loop = with("for_loop");
  const auto foreach = with("foreach");
  const auto fused = with("fused");
  EXPECT_EQ(loop.optimizer_state, foreach.optimizer_state);
  EXPECT_EQ(loop.optimizer_state, fused.optimizer_state);
  EXPECT_GT(foreach.step_peak, loop.step_peak);
  EXPECT_LE(fused.step_peak, loop.step_peak);
}

// fp16 trains under a GradScaler: gradients are unscaled before the step; a step with a non-finite gradient is
// skipped and the scale backs off.
TEST(GradScalerTest, UnscalesStepsAndSkipsNonFiniteSteps) {
  TrainingSpec spec;
  spec.optimizer = Optimizer::kSgd;
  spec.lr = 1.0;
  auto p = torch::zeros({4}).requires_grad_();
  auto optimizer = make_optimizer(spec, {p}, kCpu);
  GradScaler scaler(kCpu);
  auto loss = scaler.scale(p.sum());  // d(loss)/dp = 65536 per element
  EXPECT_DOUBLE_EQ(loss.item<double>(), 0.0);
  loss.backward();
  scaler.step(*optimizer);
  scaler.update();
  EXPECT_TRUE(torch::allclose(p.detach(), torch::full({4}, -1.0))) << p << " (the unscaled gradient is 1)";
  optimizer->zero_grad();

  auto inf = scaler.scale((p * std::numeric_limits<float>::infinity()).sum());
  inf.backward();
  scaler.step(*optimizer);
  scaler.update();
  EXPECT_TRUE(torch::allclose(p.detach(), torch::full({4}, -1.0))) << "a step with inf gradients is skipped";
  EXPECT_DOUBLE_EQ(scaler.scale(torch::ones({})).item<double>(), 32768.0) << "the scale backs off by half";
}

TEST(GradScalerTest, Fp16FixturesTrainUnderIt) {
  const auto f = fixture_from("model:\n  arch: unet\n  img_size: 32\n  in_chans: 3\n  num_classes: 1\n"
                              "  base_channels: 8\n  levels: 2\ntraining:\n  optimizer: adamw\n  precision: fp16\n"
                              "batch_sizes: [1]\n");
  const auto r = run_probe(f, 1, kCpu);
  ASSERT_FALSE(r.oom) << r.error;
  EXPECT_GT(r.components.optimizer_state, 0) << "the scaled step was taken";
}

TEST(OptimizerTest, TheImplementationIsAFixtureKeyInTheHashOnlyWhenChosen) {
  const auto plain = fixture_from(tiny_vit_yaml());
  EXPECT_EQ(plain.training.optimizer_impl, OptimizerImpl::kAuto);
  EXPECT_EQ(fixture_from(tiny_vit_yaml("  optimizer_impl: auto\n")).hash, plain.hash);
  const auto fused = fixture_from(tiny_vit_yaml("  optimizer_impl: fused\n"));
  EXPECT_EQ(fused.training.optimizer_impl, OptimizerImpl::kFused);
  EXPECT_NE(fused.hash, plain.hash);
}

}  // namespace
}  // namespace memgate
