// Gradient checkpointing of a block, as torch.utils.checkpoint does it: how every model runs its repeated blocks.
#pragma once

#include <torch/types.h>

#include <functional>

namespace memgate {

/// A block's forward, as checkpointing calls it.
using BlockFn = std::function<torch::Tensor(const torch::Tensor&)>;

/// Runs `fn(x)` without keeping its activations; backward recomputes it (with the autocast state of the
/// forward) and back-propagates through the recomputation. Gradients match the unchecked forward's.
///
///   x = memgate::checkpoint([&](const torch::Tensor& t) { return block->forward(t); }, x);
[[nodiscard]] torch::Tensor checkpoint(BlockFn fn, const torch::Tensor& x);

/// `block->forward(x)`, through `checkpoint` when `checkpointed`.
template <typename Block>
[[nodiscard]] torch::Tensor run_block(Block block, const torch::Tensor& x, bool checkpointed) {
  if (!checkpointed) return block->forward(x);
  return checkpoint([block](const torch::Tensor& t) mutable { return block->forward(t); }, x);
}

}  // namespace memgate
