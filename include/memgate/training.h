// Training building blocks LibTorch lacks: block checkpointing, an autocast scope, optimizers from a fixture.
#pragma once

#include "memgate/fixture.h"

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace memgate {

/// A block's forward, as checkpointing calls it.
using BlockFn = std::function<torch::Tensor(const torch::Tensor&)>;

/// Runs `fn(x)` without keeping its activations; backward recomputes it (with the autocast state of the
/// forward) and back-propagates through the recomputation. Gradients match the unchecked forward's.
///
///   x = memgate::checkpoint([&](const torch::Tensor& t) { return block->forward(t); }, x);
[[nodiscard]] torch::Tensor checkpoint(BlockFn fn, const torch::Tensor& x);

/// `block->forward(x)`, through `checkpoint` when `checkpointed`: how every model runs its repeated blocks.
template <typename Block>
[[nodiscard]] torch::Tensor run_block(Block block, const torch::Tensor& x, bool checkpointed) {
  if (!checkpointed) return block->forward(x);
  return checkpoint([block](const torch::Tensor& t) mutable { return block->forward(t); }, x);
}

/// Autocast on `device_type` in `precision` for its lifetime (no-op for fp32); restores the previous state.
class AutocastScope {
 public:
  AutocastScope(torch::DeviceType device_type, Precision precision);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  torch::DeviceType device_type_;
  bool active_ = false;
  bool previous_enabled_ = false;
  torch::ScalarType previous_dtype_ = torch::kFloat32;
};

/// The fixture's optimizer (adamw | sgd with optional momentum) over `params`.
[[nodiscard]] std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainingSpec& training,
                                                                      std::vector<torch::Tensor> params);

/// The dtype of a precision name (`fp32` | `fp16` | `bf16`).
[[nodiscard]] torch::Dtype dtype_of(Precision precision);

}  // namespace memgate
