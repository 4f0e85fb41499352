// FLOPs of a training step, counted on the Meta device: what `memgate plan` charges a checkpointed block.
#pragma once

#include "memgate/estimate/meta_kernels.h"
#include "memgate/gate/fixture.h"

#include <cstdint>
#include <vector>

namespace memgate {

/// The FLOPs of one micro-batch's forward and backward, and each block's forward within it.
struct StepFlops {
  std::int64_t step = 0;                 ///< forward + backward of the measured step's micro-batch
  std::int64_t forward = 0;              ///< its forward alone
  std::vector<std::int64_t> per_block;   ///< each of Model::checkpoint_prefixes()'s forward, in that order
};

/// Counts the FLOPs of `workload`'s measured step at `batch_size` (one micro-batch, no checkpointing) on the Meta
/// device, as torch.utils.flop_counter counts them: a dispatch-level counter (an at::RecordFunction callback) over
/// mm, addmm, bmm, baddbmm (2 m k n each), convolution and convolution_backward (2 x output elements x the kernel's
/// MACs per element, once per gradient asked for), scaled_dot_product_attention (its two matmuls) and its backward
/// ops (five matmuls, 2.5 x the forward). An op inside a counted op (addmm inside linear's matmul, bmm inside the math
/// attention) is counted once, outermost. Each block's forward is what runs between its run_block's start and end
/// (a BlockHook). Element-wise ops, norms and softmax are not counted (as PyTorch's counter). A Python or TorchScript
/// fixture, or a distributed one, has no per-block count (per_block empty): its blocks do not run here.
[[nodiscard]] StepFlops count_step_flops(const Workload& workload, std::int64_t batch_size, EstimateTarget target);

}  // namespace memgate
