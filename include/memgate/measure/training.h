// A training setup (optimizer, what trains, precision, checkpointing, accumulation) and its optimizer.
#pragma once

#include "memgate/base/components.h"
#include "memgate/base/enum_names.h"
#include "memgate/backend/device.h"
#include "memgate/distributed/spec.h"
#include "memgate/models/autocast.h"
#include "memgate/models/model.h"

#include <c10/core/Device.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace memgate {

/// The optimizers a training setup can name.
enum class Optimizer {
  kAdamW,  ///< torch.optim.AdamW: two state tensors per trainable parameter
  kSgd,    ///< torch.optim.SGD: one momentum buffer per trainable parameter when momentum > 0
};

/// The words of Optimizer.
inline constexpr EnumNames<Optimizer, 2> kOptimizerNames{{{Optimizer::kAdamW, "adamw"}, {Optimizer::kSgd, "sgd"}}};

/// How an optimizer's step runs over the parameters, as torch.optim's `foreach` and `fused` flags choose. The
/// state is the same; the step's temporaries, and so the step's peak, are not.
enum class OptimizerImpl {
  kAuto,     ///< PyTorch's default for the device: foreach on CUDA, the per-parameter loop elsewhere
  kForLoop,  ///< one parameter at a time (`foreach=False`): temporaries of one parameter at a time
  kForeach,  ///< `_foreach_*` ops over all parameters of a dtype: AdamW's sqrt(exp_avg_sq) of all of them at once
  kFused,    ///< `_fused_adamw_` / `_fused_sgd_` (`fused=True`): no temporaries; AdamW's step counts on the device
};

/// The words of OptimizerImpl.
inline constexpr EnumNames<OptimizerImpl, 4> kOptimizerImplNames{{{OptimizerImpl::kAuto, "auto"},
                                                                  {OptimizerImpl::kForLoop, "for_loop"},
                                                                  {OptimizerImpl::kForeach, "foreach"},
                                                                  {OptimizerImpl::kFused, "fused"}}};

/// `impl`, with kAuto resolved to PyTorch's default on `device` (torch.optim's _default_to_fused_or_foreach).
[[nodiscard]] OptimizerImpl resolve_optimizer_impl(OptimizerImpl impl, c10::Device device);

/// Where the tensors a training forward saves for backward are kept (`training.activation_offload`): on the device
/// (none), or packed into host memory in forward and brought back in backward as PyTorch's
/// `torch.autograd.graph.save_on_cpu(pin_memory=...)` does around the forward (measure/activation_offload.h).
enum class ActivationOffload {
  kNone,       ///< none: autograd keeps them where they are
  kCpu,        ///< cpu: save_on_cpu(pin_memory=False), `tensor.cpu()` (on the CPU device: the tensor itself)
  kCpuPinned,  ///< cpu_pinned: save_on_cpu(pin_memory=True), a copy in pinned host memory where CUDA is available
};
inline constexpr EnumNames<ActivationOffload, 3> kActivationOffloadNames{{{ActivationOffload::kNone, "none"},
                                                                          {ActivationOffload::kCpu, "cpu"},
                                                                          {ActivationOffload::kCpuPinned, "cpu_pinned"}}};

/// How a model trains.
struct TrainingSpec {
  Optimizer optimizer = Optimizer::kAdamW;  ///< adamw | sgd
  OptimizerImpl optimizer_impl = OptimizerImpl::kAuto;  ///< auto | for_loop | foreach | fused
  double lr = 1e-4;                 ///< learning rate
  double weight_decay = 0.0;        ///< decoupled (AdamW) or L2 (SGD)
  double momentum = 0.0;            ///< SGD momentum; > 0 keeps one buffer per parameter
  TrainableSpec trainable;          ///< all | lora | head | last_blocks:N
  Precision precision = Precision::kFp32;  ///< autocast dtype
  bool gradient_checkpointing = false;     ///< recompute blocks in backward: all, or those of checkpoint_blocks
  /// `training.gradient_checkpointing: {blocks: [...]}`: only these blocks are recomputed, named as the model names
  /// them without the final dot ("blocks.3"; Model::checkpoint_prefixes); empty: every block, where
  /// gradient_checkpointing.
  std::vector<std::string> checkpoint_blocks;
  std::int64_t accumulation_steps = 1;     ///< micro-batches per optimizer step
  bool deterministic = false;              ///< deterministic algorithms (torch.use_deterministic_algorithms)
  std::string allocator;            ///< CUDA allocator settings, e.g. expandable_segments:True
  CpuKernels cpu_kernels = CpuKernels::kPortable;  ///< portable | host: the kernels a CPU probe runs
  DistributedSpec distributed;      ///< ranks and strategy; none: one device
  bool compile = false;             ///< a Python model trained as torch.compile(module) compiles it
  /// > 0: the gradients clipped to this total 2-norm before each optimizer step, as torch.nn.utils.clip_grad_norm_
  /// does (`training.max_grad_norm`); 0: not clipped.
  double max_grad_norm = 0.0;
  /// A Python fixture's own optimizer (`training.optimizer: {class: ...}` or a callable): model/python.h holds it.
  bool own_optimizer = false;
  /// > 0: an EMA copy of the parameters and buffers is kept and updated after each optimizer step with this decay,
  /// as timm's ModelEmaV3 does (`training.ema: {decay}`); 0: none.
  double ema_decay = 0.0;
  /// What the forward saves for backward, packed into host memory as save_on_cpu packs it, where not kNone.
  ActivationOffload activation_offload = ActivationOffload::kNone;
};

/// Whether a probe of this training setup has the component `info`: every one, `ema` where an EMA copy is kept and
/// `host_activations` where activations are offloaded; never `host_state` (estimated for CUDA only).
[[nodiscard]] inline bool keeps_component(const TrainingSpec& training, const ComponentInfo& info) {
  if (info.present == &Components::keeps_ema) return training.ema_decay > 0.0;
  if (info.present == &Components::offloads_activations) return training.activation_offload != ActivationOffload::kNone;
  // FSDP's CPU offload has host_state in an estimate for CUDA only: no probe that is measured has it.
  if (info.present == &Components::offloads_state) return false;
  return true;
}

/// An optimizer that updates parameters as torch.optim's AdamW and SGD do, tensor for tensor: the same state
/// (AdamW: exp_avg, exp_avg_sq and a scalar `step` tensor per parameter, on the CPU unless fused; SGD: a momentum
/// buffer per parameter when momentum > 0), created on the first step, and the same temporaries per
/// implementation. LibTorch's own C++ optimizers run the per-parameter loop only, without step tensors.
class TrainingOptimizer {
 public:
  explicit TrainingOptimizer(std::vector<torch::Tensor> params) : params_(std::move(params)) {}
  virtual ~TrainingOptimizer() = default;
  TrainingOptimizer(const TrainingOptimizer&) = delete;
  TrainingOptimizer& operator=(const TrainingOptimizer&) = delete;
  /// Updates every parameter that has a gradient.
  virtual void step() = 0;
  /// Sets every gradient to none (`zero_grad(set_to_none=True)`, PyTorch's default).
  virtual void zero_grad();
  [[nodiscard]] const std::vector<torch::Tensor>& params() const { return params_; }

 protected:
  std::vector<torch::Tensor> params_;
};

/// torch.amp.GradScaler as fp16 training runs it: the loss scaled before backward; before the optimizer step the
/// gradients unscaled in place and checked for inf/NaN (`_amp_foreach_non_finite_check_and_unscale_`), the step
/// skipped when one is found; then the scale updated (`_amp_update_scale_`). Its tensors are scalars on the device:
/// the scale and growth tracker (kept), the inverse scale and found-inf flags (for one step).
class GradScaler {
 public:
  explicit GradScaler(c10::Device device) : device_(device) {}
  /// loss x scale (the scale is created on the first call, as the Python scaler does).
  [[nodiscard]] torch::Tensor scale(const torch::Tensor& loss);
  /// Unscales the gradients in place (`scaler.unscale_(optimizer)`, before clipping); once per step.
  void unscale(TrainingOptimizer& optimizer);
  /// Unscales the gradients (unless unscale() did) and steps `optimizer` unless a gradient is not finite.
  void step(TrainingOptimizer& optimizer);
  /// Grows or backs off the scale; forgets this step's found-inf flags.
  void update();
  /// Whether the last step() found a gradient that is not finite and skipped the optimizer.
  [[nodiscard]] bool skipped_last_step() const { return skipped_; }

 private:
  c10::Device device_;
  torch::Tensor scale_, growth_tracker_, found_inf_;
  bool skipped_ = false;
  bool unscaled_ = false;
};

/// The training setup's optimizer (adamw | sgd with optional momentum) over `params`, in the setup's implementation
/// (auto: PyTorch's default on `device`). Throws memgate::Error for `fused` on parameters that are not floating point.
[[nodiscard]] std::unique_ptr<TrainingOptimizer> make_optimizer(const TrainingSpec& training,
                                                                std::vector<torch::Tensor> params, c10::Device device);

/// A model's own optimizer (Model::make_own_optimizer) as a TrainingOptimizer over `params`: its step and zero_grad
/// are the model's (the GradScaler unscales `params`' gradients before its step).
[[nodiscard]] std::unique_ptr<TrainingOptimizer> wrap_own_optimizer(std::unique_ptr<OwnOptimizer> own,
                                                                    std::vector<torch::Tensor> params);

/// torch.nn.utils.clip_grad_norm_(params, max_norm) with its defaults (norm 2, foreach where torch takes it: on the CPU
/// and CUDA), tensor for tensor: each dtype group's norms by _foreach_norm, their stacked norm, the coefficient
/// max_norm / (total + 1e-6) clamped at 1, the gradients multiplied in place by _foreach_mul_. Gradients that are not
/// defined are left out.
void clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm);

}  // namespace memgate
