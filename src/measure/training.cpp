// Optimizers as torch.optim runs them: AdamW and SGD, each as a per-parameter loop, foreach ops or fused kernels
// (torch/optim/adam.py and sgd.py of torch 2.11: _single_tensor_*, _multi_tensor_*, _fused_*).
#include "memgate/measure/training.h"

#include "memgate/base/error.h"
#include "memgate/estimate/estimate_context.h"
#include "memgate/estimate/meta_kernels.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>

namespace memgate {
namespace {

// Indices of the parameters that have a gradient, by dtype (torch.optim groups by device and dtype; a probe's
// parameters are on one device).
std::map<c10::ScalarType, std::vector<std::size_t>> with_grad_by_dtype(const std::vector<torch::Tensor>& params) {
  std::map<c10::ScalarType, std::vector<std::size_t>> out;
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].grad().defined()) out[params[i].scalar_type()].push_back(i);
  }
  return out;
}

std::vector<torch::Tensor> pick(const std::vector<torch::Tensor>& all, const std::vector<std::size_t>& index) {
  std::vector<torch::Tensor> out;
  out.reserve(index.size());
  for (const auto i : index) out.push_back(all[i]);
  return out;
}

std::vector<torch::Tensor> grads_of(const std::vector<torch::Tensor>& params, const std::vector<std::size_t>& index) {
  std::vector<torch::Tensor> out;
  out.reserve(index.size());
  for (const auto i : index) out.push_back(params[i].grad());
  return out;
}

class AdamW final : public TrainingOptimizer {
 public:
  AdamW(std::vector<torch::Tensor> params, const TrainingSpec& t, OptimizerImpl impl)
      : TrainingOptimizer(std::move(params)), lr_(t.lr), weight_decay_(t.weight_decay), impl_(impl),
        steps_(params_.size()), exp_avgs_(params_.size()), exp_avg_sqs_(params_.size()) {}

  void step() override {
    torch::NoGradGuard no_grad;
    const auto groups = with_grad_by_dtype(params_);
    for (const auto& [dtype, index] : groups) {
      for (const auto i : index) init_state(i);
    }
    for (const auto& [dtype, index] : groups) {
      switch (impl_) {
        case OptimizerImpl::kForeach: foreach_step(index); break;
        case OptimizerImpl::kFused: fused_step(index); break;
        default: for_loop_step(index); break;
      }
    }
  }

 private:
  // Lazy state, as adam.py's _init_group: the step on the CPU (on the device when fused), then the two moments.
  void init_state(std::size_t i) {
    if (exp_avgs_[i].defined()) return;
    const auto& p = params_[i];
    steps_[i] = impl_ == OptimizerImpl::kFused ? torch::zeros({}, p.options().dtype(torch::kFloat32))
                                               : torch::tensor(0.0F, torch::kFloat32);
    exp_avgs_[i] = torch::zeros_like(p, torch::MemoryFormat::Preserve);
    exp_avg_sqs_[i] = torch::zeros_like(p, torch::MemoryFormat::Preserve);
  }

  void for_loop_step(const std::vector<std::size_t>& index) {
    // As adam.py's _single_tensor_adam: `denom` is a loop variable, so each parameter's lives on while the next
    // one's is computed, and the last until the step returns.
    torch::Tensor denom;
    for (const auto i : index) {
      auto& p = params_[i];
      const auto& grad = p.grad();
      steps_[i].add_(1);
      if (weight_decay_ != 0.0) p.mul_(1.0 - lr_ * weight_decay_);
      exp_avgs_[i].lerp_(grad, 1.0 - kBeta1);
      exp_avg_sqs_[i].mul_(kBeta2).addcmul_(grad, grad, 1.0 - kBeta2);
      const auto step = steps_[i].item<double>();
      const auto step_size = lr_ / (1.0 - std::pow(kBeta1, step));
      const auto bias_correction2_sqrt = std::sqrt(1.0 - std::pow(kBeta2, step));
      denom = (exp_avg_sqs_[i].sqrt() / bias_correction2_sqrt).add_(kEps);
      p.addcdiv_(exp_avgs_[i], denom, -step_size);
    }
  }

  // One dtype group's tensors, as the foreach and fused ops take them.
  struct Group {
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
  };

  Group group(const std::vector<std::size_t>& index) const {
    return {pick(params_, index), grads_of(params_, index), pick(exp_avgs_, index), pick(exp_avg_sqs_, index),
            pick(steps_, index)};
  }

  void foreach_step(const std::vector<std::size_t>& index) {
    auto [params, grads, exp_avgs, exp_avg_sqs, steps] = group(index);
    if (steps.front().is_cpu()) at::_foreach_add_(steps, torch::tensor(1.0F), 1.0);
    else at::_foreach_add_(steps, 1);
    if (weight_decay_ != 0.0) at::_foreach_mul_(params, 1.0 - lr_ * weight_decay_);
    at::_foreach_lerp_(exp_avgs, grads, 1.0 - kBeta1);
    at::_foreach_mul_(exp_avg_sqs, kBeta2);
    at::_foreach_addcmul_(exp_avg_sqs, grads, grads, 1.0 - kBeta2);
    grads.clear();
    std::vector<c10::Scalar> step_size, bias_correction2_sqrt;
    for (const auto& s : steps) {
      const auto step = s.item<double>();
      step_size.emplace_back(-lr_ / (1.0 - std::pow(kBeta1, step)));
      bias_correction2_sqrt.emplace_back(std::sqrt(1.0 - std::pow(kBeta2, step)));
    }
    // The foreach temporaries: sqrt(exp_avg_sq) of every parameter of the group at once.
    auto exp_avg_sq_sqrt = at::_foreach_sqrt(exp_avg_sqs);
    at::_foreach_div_(exp_avg_sq_sqrt, bias_correction2_sqrt);
    at::_foreach_add_(exp_avg_sq_sqrt, kEps);
    at::_foreach_addcdiv_(params, exp_avgs, exp_avg_sq_sqrt, step_size);
  }

  void fused_step(const std::vector<std::size_t>& index) {
    auto [params, grads, exp_avgs, exp_avg_sqs, steps] = group(index);
    at::_foreach_add_(steps, 1);
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, {}, steps, lr_, kBeta1, kBeta2, weight_decay_, kEps,
                      /*amsgrad=*/false, /*maximize=*/false);
  }

  static constexpr double kBeta1 = 0.9;
  static constexpr double kBeta2 = 0.999;
  static constexpr double kEps = 1e-8;
  double lr_;
  double weight_decay_;
  OptimizerImpl impl_;
  std::vector<torch::Tensor> steps_, exp_avgs_, exp_avg_sqs_;
};

class Sgd final : public TrainingOptimizer {
 public:
  Sgd(std::vector<torch::Tensor> params, const TrainingSpec& t, OptimizerImpl impl)
      : TrainingOptimizer(std::move(params)), lr_(t.lr), weight_decay_(t.weight_decay), momentum_(t.momentum),
        impl_(impl), buffers_(params_.size()) {}

  void step() override {
    torch::NoGradGuard no_grad;
    for (const auto& [dtype, index] : with_grad_by_dtype(params_)) {
      switch (impl_) {
        case OptimizerImpl::kForeach: foreach_step(index); break;
        case OptimizerImpl::kFused: fused_step(index); break;
        default: for_loop_step(index); break;
      }
    }
  }

 private:
  void for_loop_step(const std::vector<std::size_t>& index) {
    for (const auto i : index) {
      auto& p = params_[i];
      auto grad = p.grad();
      if (weight_decay_ != 0.0) grad = grad.add(p, weight_decay_);
      if (momentum_ != 0.0) {
        auto& buf = buffers_[i];
        if (!buf.defined()) buf = grad.detach().clone();
        else buf.mul_(momentum_).add_(grad, 1.0 - kDampening);
        grad = buf;
      }
      p.add_(grad, -lr_);
    }
  }

  void foreach_step(const std::vector<std::size_t>& index) {
    auto params = pick(params_, index);
    auto grads = grads_of(params_, index);
    // Weight decay makes a new gradient of every parameter at once.
    if (weight_decay_ != 0.0) grads = at::_foreach_add(grads, params, weight_decay_);
    if (momentum_ != 0.0) {
      bool all_buffers = true;
      for (const auto i : index) all_buffers = all_buffers && buffers_[i].defined();
      std::vector<torch::Tensor> bufs;
      if (all_buffers) {
        bufs = pick(buffers_, index);
        at::_foreach_mul_(bufs, momentum_);
        at::_foreach_add_(bufs, grads, 1.0 - kDampening);
      } else {
        for (std::size_t k = 0; k < index.size(); ++k) {
          auto& buf = buffers_[index[k]];
          if (!buf.defined()) buf = grads[k].detach().clone();
          else buf.mul_(momentum_).add_(grads[k], 1.0 - kDampening);
          bufs.push_back(buf);
        }
      }
      grads = std::move(bufs);
    }
    at::_foreach_add_(params, grads, -lr_);
  }

  void fused_step(const std::vector<std::size_t>& index) {
    auto params = pick(params_, index);
    auto grads = grads_of(params_, index);
    bool first_step = momentum_ != 0.0;
    for (const auto i : index) first_step = first_step && !buffers_[i].defined();
    if (first_step) {
      for (const auto i : index) buffers_[i] = torch::empty_like(params_[i].grad());
    }
    const auto bufs = momentum_ != 0.0 ? pick(buffers_, index) : std::vector<torch::Tensor>{};
    at::_fused_sgd_(params, grads, bufs, weight_decay_, momentum_, lr_, kDampening, /*nesterov=*/false,
                    /*maximize=*/false, first_step);
  }

  static constexpr double kDampening = 0.0;
  double lr_;
  double weight_decay_;
  double momentum_;
  OptimizerImpl impl_;
  std::vector<torch::Tensor> buffers_;
};

}  // namespace

torch::Tensor GradScaler::scale(const torch::Tensor& loss) {
  if (!scale_.defined()) {
    scale_ = torch::full({}, 65536.0, torch::TensorOptions().dtype(torch::kFloat32).device(device_));
    growth_tracker_ = torch::full({}, 0, torch::TensorOptions().dtype(torch::kInt32).device(device_));
  }
  return loss * scale_;
}

void GradScaler::unscale(TrainingOptimizer& optimizer) {
  if (unscaled_) return;
  torch::NoGradGuard no_grad;
  // unscale_: the inverse scale computed in double, and per-device copies of it and of the found-inf flag.
  const auto inv_scale = scale_.to(torch::kFloat64).reciprocal().to(torch::kFloat32);
  const auto found_inf = torch::full({}, 0.0, torch::TensorOptions().dtype(torch::kFloat32).device(device_));
  const auto device_inv_scale = inv_scale.to(device_, /*non_blocking=*/true, /*copy=*/true);
  found_inf_ = found_inf.to(device_, /*non_blocking=*/true, /*copy=*/true);
  for (const auto& [dtype, index] : with_grad_by_dtype(optimizer.params())) {
    auto grads = grads_of(optimizer.params(), index);
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf_, device_inv_scale);
  }
  unscaled_ = true;
}

void GradScaler::step(TrainingOptimizer& optimizer) {
  unscale(optimizer);
  // A Meta tensor holds no value: an estimate takes the step a run without overflow takes.
  skipped_ = !found_inf_.is_meta() && found_inf_.item<float>() != 0.0F;
  if (!skipped_) optimizer.step();
}

void GradScaler::update() {
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, /*growth_factor=*/2.0, /*backoff_factor=*/0.5,
                         /*growth_interval=*/2000);
  found_inf_ = torch::Tensor();
  unscaled_ = false;
}

OptimizerImpl resolve_optimizer_impl(OptimizerImpl impl, c10::Device device) {
  if (impl != OptimizerImpl::kAuto) return impl;
  // An estimate runs on the Meta device as its target would: torch.optim's default there. (Estimates for CUDA took
  // the for-loop and missed foreach's parameter-sized temporaries: on an H200 a fully fine-tuned ViT-L at batch 1,
  // whose peak is the optimizer step, measured 19.4% above its estimate.)
  const bool cuda = device.is_cuda() || (device.is_meta() && estimate_context().target == EstimateTarget::kCuda);
  return cuda ? OptimizerImpl::kForeach : OptimizerImpl::kForLoop;
}

namespace {

class OwnOptimizerAdapter final : public TrainingOptimizer {
 public:
  OwnOptimizerAdapter(std::unique_ptr<OwnOptimizer> own, std::vector<torch::Tensor> params)
      : TrainingOptimizer(std::move(params)), own_(std::move(own)) {}
  void step() override { own_->step(); }
  void zero_grad() override { own_->zero_grad(); }

 private:
  std::unique_ptr<OwnOptimizer> own_;
};

}  // namespace

std::unique_ptr<TrainingOptimizer> wrap_own_optimizer(std::unique_ptr<OwnOptimizer> own,
                                                      std::vector<torch::Tensor> params) {
  return std::make_unique<OwnOptimizerAdapter>(std::move(own), std::move(params));
}

void clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  // clip_grad_norm_: the gradients grouped by device and dtype, in the order they first appear
  // (_group_tensors_by_device_and_dtype).
  std::vector<std::pair<std::pair<c10::Device, c10::ScalarType>, std::vector<torch::Tensor>>> groups;
  for (const auto& p : params) {
    const auto& g = p.grad();
    if (!g.defined()) continue;
    const auto key = std::make_pair(g.device(), g.scalar_type());
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& e) { return e.first == key; });
    if (it == groups.end()) {
      groups.push_back({key, {}});
      it = std::prev(groups.end());
    }
    it->second.push_back(g);
  }
  if (groups.empty()) return;
  torch::Tensor total_norm;
  {
    // _get_total_norm: every group's norms (kept until it returns), their stack's norm.
    std::vector<torch::Tensor> norms;
    for (const auto& [key, grads] : groups) {
      for (auto& n : at::_foreach_norm(grads, 2)) norms.push_back(std::move(n));
    }
    total_norm = at::linalg_vector_norm(at::stack(norms), 2);
  }
  // _clip_grads_with_norm_: max_norm / (total_norm + 1e-6) is (total_norm + 1e-6).reciprocal() * max_norm in torch.
  const auto clip_coef = (total_norm + 1e-6).reciprocal() * max_norm;
  const auto clip_coef_clamped = at::clamp(clip_coef, std::nullopt, 1.0);
  for (auto& [key, grads] : groups) at::_foreach_mul_(grads, clip_coef_clamped.to(key.first));
}

void TrainingOptimizer::zero_grad() {
  for (auto& p : params_) {
    if (p.grad().defined()) p.mutable_grad().reset();
  }
}

std::unique_ptr<TrainingOptimizer> make_optimizer(const TrainingSpec& training, std::vector<torch::Tensor> params,
                                                  c10::Device device) {
  const auto impl = resolve_optimizer_impl(training.optimizer_impl, device);
  if (impl == OptimizerImpl::kFused) {
    for (const auto& p : params) {
      if (!p.is_floating_point()) {
        throw Error("optimizer_impl fused needs floating-point parameters, got " + std::string(c10::toString(p.scalar_type())));
      }
    }
  }
  if (training.optimizer == Optimizer::kSgd) return std::make_unique<Sgd>(std::move(params), training, impl);
  return std::make_unique<AdamW>(std::move(params), training, impl);
}

}  // namespace memgate
