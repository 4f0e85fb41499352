// A trainable model: its module, a batch of inputs, its loss, and which parameters form
// its blocks and its head (for trainable: lora | head | last_blocks:N).
#pragma once

#include "memgate/models/checkpoint.h"
#include "memgate/models/nn.h"

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace memgate {

/// Which parameters train.
struct TrainableSpec {
  enum class Kind { kAll, kLora, kHead, kLastBlocks, kPatterns };
  Kind kind = Kind::kAll;
  std::int64_t last_blocks = 0;  ///< for kLastBlocks
  /// For kPatterns: shell-style patterns over parameter names (`*` matches any run of characters, dots
  /// included; `?` one character; `[...]` a class), e.g. "head.*", "*.lora_*". A parameter trains when any matches.
  std::vector<std::string> patterns;
  /// all | lora | head | last_blocks:N | train:[p1,p2], as fixtures spell it.
  [[nodiscard]] std::string str() const;
};

/// The inputs and target of one (micro-)batch, on the model's device.
struct Batch {
  std::vector<torch::Tensor> inputs;
  torch::Tensor target;
  /// Per input, the keyword forward() takes it as (a Python fixture's `kwarg:`), "" for a positional one; empty: all
  /// positional.
  std::vector<std::string> names;
  /// A Python fixture's batch as its `batch:` callable made it (a tensor, or a nested tuple, list or dict), opaque
  /// here; its tensors are `inputs` too. Null for every other model.
  std::shared_ptr<void> own;
};

/// An optimizer a model makes and steps itself (a Python fixture's torch.optim optimizer, `training.optimizer:
/// {class: ...}` or a callable), in place of memgate's AdamW and SGD.
class OwnOptimizer {
 public:
  virtual ~OwnOptimizer() = default;
  /// optimizer.step()
  virtual void step() = 0;
  /// optimizer.zero_grad(set_to_none=True)
  virtual void zero_grad() = 0;
};

/// An exponential moving average of a model's parameters and buffers, kept as timm's ModelEmaV3 keeps it (foreach):
/// a copy of each, made once; after each optimizer step the floating-point ones move towards the model's,
/// `torch._foreach_lerp_(ema, model, 1 - decay)`, in place, and the others are copied (`copy_`). The copy is never
/// run: a loop evaluates with it, its bytes are what it costs a step.
class ModelEma {
 public:
  /// `ema[i]` is the copy of `model[i]`; `keep_alive` holds what owns the copies (a Python module's deep copy).
  ModelEma(std::vector<torch::Tensor> model, std::vector<torch::Tensor> ema, double decay,
           std::shared_ptr<void> keep_alive = {});
  /// One update, after the optimizer step (no autograd).
  void update();

 private:
  std::vector<torch::Tensor> model_float_, ema_float_, model_other_, ema_other_;
  double decay_;
  std::shared_ptr<void> keep_alive_;
};

/// Parameter counts: total = trainable + frozen (buffers excluded, as in the reference implementations).
struct ParamCounts {
  std::int64_t total = 0;
  std::int64_t trainable = 0;
  std::int64_t frozen = 0;
};

/// A model and its task. Implementations live beside each architecture (vit.cpp, resnet.cpp, ...).
class Model {
 public:
  virtual ~Model() = default;
  /// The root module: parameters, buffers, train()/eval().
  [[nodiscard]] virtual torch::nn::Module& module() = 0;
  /// A deterministic (seeded) batch of `batch_size` samples.
  [[nodiscard]] virtual Batch make_batch(std::int64_t batch_size) = 0;
  /// Forward and the task's loss (a scalar).
  [[nodiscard]] virtual torch::Tensor loss(const Batch& batch) = 0;
  /// Forward only, as in evaluation.
  [[nodiscard]] virtual torch::Tensor forward(const Batch& batch) = 0;
  /// Whether loss(batch) is loss_of_output(batch, forward(batch)): a model whose loss is a function of its
  /// forward's one output. A caller may then act when the forward returns (FSDP2's root post-forward runs there) and
  /// keep the output through the loss, as the training loops that hold the model's output do (Hugging Face's
  /// Trainer, torchtitan's: `pred = model(x); loss = loss_fn(pred, y); del pred`).
  [[nodiscard]] virtual bool splits_loss() const { return false; }
  /// The task's loss from forward(batch)'s `output`; only where splits_loss().
  [[nodiscard]] virtual torch::Tensor loss_of_output(const Batch& batch, const torch::Tensor& output);
  /// Name prefixes of the repeated blocks, input to output ("blocks.0.", "blocks.1.", ...).
  [[nodiscard]] virtual std::vector<std::string> block_prefixes() const = 0;
  /// The blocks FSDP's `units: blocks` wraps, each a module whose forward runs through run_block (the hook FSDP
  /// unshards it in): the blocks, unless some of them run otherwise (a stem, a downsampling layer), or none (a
  /// model whose forward memgate does not run block by block, TorchScript's).
  [[nodiscard]] virtual std::vector<std::string> unit_prefixes() const { return block_prefixes(); }
  /// Name prefixes of the task head, which trains with lora, head and last_blocks:N ("head." for a ViT, as timm
/// and PEFT's modules_to_save=["head"] have it; a final norm is left to patterns).
  [[nodiscard]] virtual std::vector<std::string> head_prefixes() const = 0;
  /// The optimizer the model's own code makes over `trainable` (the parameters that train, in module order), or
  /// nullptr where memgate's optimizer (the training's adamw | sgd) steps it.
  [[nodiscard]] virtual std::unique_ptr<OwnOptimizer> make_own_optimizer(const std::vector<torch::Tensor>& trainable) {
    return nullptr;
  }
  /// The EMA copy a training loop keeps of it (`training.ema`). By default a clone of each parameter and buffer of
  /// module() (a tensor that several names share cloned once), as copy.deepcopy copies them; a Python model deep-copies
  /// its module, as timm does.
  [[nodiscard]] virtual std::unique_ptr<ModelEma> make_ema(double decay);
  /// The blocks that run through run_block, which checkpointing can recompute (`training.gradient_checkpointing:
  /// {blocks: [...]}` names them without the final dot): the FSDP units, by default.
  [[nodiscard]] virtual std::vector<std::string> checkpoint_prefixes() const { return unit_prefixes(); }
  /// Recompute each block in backward instead of keeping its activations (true), or none (false).
  void set_gradient_checkpointing(bool on) {
    checkpointing_ = on;
    selection_ = CheckpointSelection(on);
  }
  /// Recompute only the named blocks ("blocks.3", a prefix of checkpoint_prefixes() without its final dot). A name
  /// that is none of them throws memgate::Error naming `source` (the fixture), the key, the name and valid ones.
  void set_checkpointed_blocks(const std::vector<std::string>& names, const std::string& source = {});
  [[nodiscard]] bool gradient_checkpointing() const { return checkpointing_; }
  /// Which blocks run checkpointed.
  [[nodiscard]] const CheckpointSelection& checkpoint_selection() const { return selection_; }

 protected:
  /// Whether any block runs checkpointed (all of them unless selection_ lists some).
  bool checkpointing_ = false;
  CheckpointSelection selection_;
};

/// Freezes everything but what `trainable` selects; returns the parameters that train, in module order.
/// lora: adapters + head; head: head; last_blocks:N: the last N blocks + head; all: everything; patterns: the
/// parameters whose names match one of them. A pattern that matches no parameter throws memgate::Error naming
/// the pattern and some of the model's parameter names; so does a selection of no parameter at all (a step needs one
/// to train). `source` (the fixture file) starts each error.
std::vector<torch::Tensor> select_trainable(Model& model, const TrainableSpec& trainable,
                                            const std::string& source = {});

/// Counts parameters (not buffers) by requires_grad.
[[nodiscard]] ParamCounts count_parameters(const torch::nn::Module& module);

/// Sum of numel x element size over parameters and buffers.
[[nodiscard]] std::int64_t parameter_and_buffer_bytes(const torch::nn::Module& module);

}  // namespace memgate
