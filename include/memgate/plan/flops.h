// FLOPs of a training step, counted on the Meta device: what `memgate plan` charges a checkpointed block.
#pragma once

#include "memgate/estimate/meta_kernels.h"
#include "memgate/gate/fixture.h"

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace memgate {

struct PythonRuntime;

/// The FLOPs of one micro-batch's forward and backward, and each block's forward within it.
struct StepFlops {
  std::int64_t step = 0;                 ///< forward + backward of the measured step's micro-batch
  std::int64_t forward = 0;              ///< its forward alone
  std::vector<std::int64_t> per_block;   ///< each of Model::checkpoint_prefixes()'s forward, in that order
  /// Of each block's forward, its attention's (scaled_dot_product_attention and its kernels): what a block in
  /// selective checkpointing that saves the attention's output does not recompute.
  std::vector<std::int64_t> per_block_attention;
};

/// Counts the FLOPs of `workload`'s measured step at `batch_size` (one micro-batch, no checkpointing) on the Meta
/// device, as torch.utils.flop_counter counts them: a dispatch-level counter (an at::RecordFunction callback) over
/// mm, addmm, bmm, baddbmm (2 m k n each), convolution and convolution_backward (2 x output elements x the kernel's
/// MACs per element, once per gradient asked for), scaled_dot_product_attention (its two matmuls) and its backward
/// ops (five matmuls, 2.5 x the forward). An op inside a counted op (addmm inside linear's matmul, bmm inside the math
/// attention) is counted once, outermost. Each block's forward is what runs between its run_block's start and end
/// (a BlockHook). Element-wise ops, norms and softmax are not counted (as PyTorch's counter). A Python or TorchScript
/// fixture, or a distributed one, has no per-block count (per_block empty): its blocks do not run here. A Python
/// fixture's blocks run here in a process that has `python` (models/python.h): count_checkpoint_flops's Python process.
[[nodiscard]] StepFlops count_step_flops(const Workload& workload, std::int64_t batch_size, EstimateTarget target,
                                         const PythonRuntime* python = nullptr);

/// What `memgate plan` needs to checkpoint a model's blocks: their names (Model::checkpoint_prefixes() without the
/// final dot, "blocks.3", as a fixture names them) and count_step_flops at each batch size asked, in that order.
struct CheckpointFlops {
  std::vector<std::string> blocks;  ///< empty for a TorchScript fixture (no blocks) and a distributed one (not counted)
  std::vector<StepFlops> flops;     ///< one per batch size
};

/// The blocks and FLOPs of `workload` at `batch_sizes` on the Meta device. A Python fixture's, where `python` is
/// nullptr, are counted in its Python process (launch/ranks.h's run_python_flops; child/rank.h's rank_main runs
/// count_checkpoint_flops_here), where its model is built and its blocks run.
[[nodiscard]] CheckpointFlops count_checkpoint_flops(const Workload& workload,
                                                     std::span<const std::int64_t> batch_sizes, EstimateTarget target,
                                                     const PythonRuntime* python = nullptr);

/// count_checkpoint_flops in this process, for a request and an answer (JSON text) as run_python_flops passes them.
[[nodiscard]] std::string count_checkpoint_flops_here(const Workload& workload, const std::string& request,
                                                      const PythonRuntime* python);

}  // namespace memgate
