// Gradient checkpointing of a block, as torch.utils.checkpoint does it: how every model runs its repeated blocks.
#pragma once

#include "memgate/base/heartbeat.h"

#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace memgate {

/// A block's forward, as checkpointing calls it.
using BlockFn = std::function<torch::Tensor(const torch::Tensor&)>;

/// Runs `fn(x)` without keeping its activations; backward recomputes it (with the autocast state of the
/// forward) and back-propagates through the recomputation. Gradients match the unchecked forward's.
///
///   x = memgate::checkpoint([&](const torch::Tensor& t) { return block->forward(t); }, x);
[[nodiscard]] torch::Tensor checkpoint(BlockFn fn, const torch::Tensor& x);

/// Which of a model's blocks run checkpointed: all, none, or those whose prefixes ("blocks.3.") are listed. A bool
/// converts to all or none, as models took it before a list could be given (`training.gradient_checkpointing:
/// {blocks: [...]}`).
class CheckpointSelection {
 public:
  CheckpointSelection(bool all = false) : all_(all) {}  // NOLINT(google-explicit-constructor): true is all blocks
  /// Exactly the blocks with these prefixes, each ending in a dot ("blocks.3.").
  explicit CheckpointSelection(std::vector<std::string> prefixes) : prefixes_(std::move(prefixes)) {}
  /// Whether the block `prefix` ("blocks.3.") runs checkpointed.
  [[nodiscard]] bool covers(const std::string& prefix) const;
  /// The selection inside the submodule `prefix` ("vision."), its blocks named as the submodule names them.
  [[nodiscard]] CheckpointSelection within(const std::string& prefix) const;
  [[nodiscard]] bool any() const { return all_ || !prefixes_.empty(); }
  [[nodiscard]] bool all() const { return all_; }
  [[nodiscard]] const std::vector<std::string>& prefixes() const { return prefixes_; }

 private:
  bool all_ = false;
  std::vector<std::string> prefixes_;
};

/// What runs each repeated block of a model (through run_block) on this thread while installed: a wrapper such as
/// FSDP's units (distributed/fully_shard.h), which acts before and after a block's forward. `forward` runs the block
/// (checkpointed where the model asks).
class BlockHook {
 public:
  virtual ~BlockHook() = default;
  [[nodiscard]] virtual torch::Tensor run(const torch::nn::Module& block, const torch::Tensor& x,
                                          const BlockFn& forward) = 0;
};

/// The hook installed on this thread, or nullptr.
[[nodiscard]] BlockHook* block_hook();

/// Installs `hook` on this thread for its lifetime (nullptr: none), restoring the previous one after.
class BlockHookScope {
 public:
  explicit BlockHookScope(BlockHook* hook);
  ~BlockHookScope();
  BlockHookScope(const BlockHookScope&) = delete;
  BlockHookScope& operator=(const BlockHookScope&) = delete;

 private:
  BlockHook* previous_;
};

/// `block->forward(x)`, through `checkpoint` when `checkpointed`, and through the thread's BlockHook if any. Each
/// block's forward is progress (base/heartbeat.h): a long forward of many blocks moves.
template <typename Block>
[[nodiscard]] torch::Tensor run_block(Block block, const torch::Tensor& x, bool checkpointed) {
  note_progress();
  // A plain lambda: a std::function (a heap allocation per block and step) only when a hook takes it.
  auto forward = [block, checkpointed](const torch::Tensor& t) mutable -> torch::Tensor {
    if (!checkpointed) return block->forward(t);
    return checkpoint([block](const torch::Tensor& u) mutable { return block->forward(u); }, t);
  };
  if (auto* hook = block_hook()) return hook->run(*block, x, forward);
  return forward(x);
}

}  // namespace memgate
