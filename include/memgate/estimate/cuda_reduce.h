// The global memory PyTorch's CUDA reduction kernel takes from the caching allocator while it runs
// (aten/src/ATen/native/cuda/Reduce.cuh, gpu_reduce_kernel): where a reduction splits each output's inputs over
// several thread blocks (setReduceConfig: ctas_per_output > 1), a staging buffer of the blocks' partial results and a
// semaphore per block column, both freed when the kernel is queued. sum and mean go through it (a convolution's bias
// gradient, grad_output.sum({0, 2, 3}); a linear layer's, the autograd engine's sum over the batch; a loss's mean).
// An estimate for CUDA allocates them on the Meta device as the GPU would: a channels-last decoder's 1x1 convolution
// at batch 4 (grad_output [4, 128, 96, 96] fp32) stages 37,748,736 bytes on top of the step's peak.
#pragma once

#include "memgate/base/error.h"

#include <cstdint>
#include <exception>
#include <string_view>
#include <vector>

namespace memgate {

/// A step that CUDA itself cannot run at this size, whatever the GPU's memory: PyTorch's own kernel fails (a reduction
/// of more elements than 32-bit indexing covers that TensorIterator cannot split). An estimate raises it; the search
/// for the largest batch takes such a batch as one that does not fit, and says why.
class CannotRunOnCudaError : public Error {
 public:
  using Error::Error;
};
/// Every CannotRunOnCudaError's message holds this, so that the kind survives a Python frame that carries only text.
inline constexpr std::string_view kCannotRunOnCuda = "cannot run on CUDA at this size";
/// Whether `e` is (or was, before a Python frame turned it into text) a CannotRunOnCudaError.
[[nodiscard]] inline bool cannot_run_on_cuda(const std::exception& e) {
  return dynamic_cast<const CannotRunOnCudaError*>(&e) != nullptr ||
         std::string_view(e.what()).find(kCannotRunOnCuda) != std::string_view::npos;
}

/// What setReduceConfig reads of the GPU: its multiprocessors and the threads each holds. The defaults are an H100's
/// and an H200's (132 SMs, 2048 threads each); an A100 has 108 SMs, and on a GPU with another count the staging of a
/// reduction whose blocks are bounded by the occupancy target (few outputs, many inputs each) differs.
struct CudaReduceDevice {
  int multiprocessors = 132;
  int max_threads_per_multiprocessor = 2048;
  friend bool operator==(const CudaReduceDevice&, const CudaReduceDevice&) = default;
};

/// The GPU an estimate for CUDA speaks for, as its reductions read it: this thread's estimate context's
/// (estimate_context.h), which `memgate estimate --gpu`'s search and `estimate --suite` set for each GPU fixture and a
/// probe's own process takes from its request; else the defaults (an H100's and an H200's).
[[nodiscard]] CudaReduceDevice estimated_cuda_reduce_device();

/// A reduction as gpu_reduce_kernel receives it: its input (sizes, strides in elements, the byte offset of its first
/// element from a 512-byte-aligned allocation) reduced over the dims marked in `reduced` (empty: all) into a
/// contiguous output, as sum.dim_IntList and mean.dim allocate it.
struct ReduceOperands {
  std::vector<std::int64_t> sizes;
  std::vector<std::int64_t> strides;
  std::vector<bool> reduced;
  std::int64_t input_offset_bytes = 0;
  int input_element_size = 4;   ///< sizeof(scalar_t): the dtype the kernel reads
  int output_element_size = 4;  ///< sizeof(out_scalar_t)
  int accumulate_size = 4;      ///< sizeof(arg_t): 4 for fp32, fp16 and bf16 sums and means
  /// The kernel's input_vec_size: torch 2.11's sum and mean take 8 for 2-byte scalars, else vt0 (4).
  int input_vec_size = 4;
  int max_threads = 512;  ///< mnt_wrapper<scalar_t>::MAX_NUM_THREADS: 256 for complex<double>
  /// False where an fp16 (bf16) sum writes fp16 (bf16): split for 32-bit indexing, it accumulates apart.
  bool can_accumulate_in_output = true;
};

/// The TensorIterator the reduction runs over: its dims reordered (reduced ones first, then by stride) and
/// coalesced, strides in bytes.
struct ReduceIteration {
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> output_strides;  ///< 0 on the reduced dims
  std::vector<std::int64_t> input_strides;
  std::int64_t input_offset_bytes = 0;
};

/// One launch of the kernel: the bytes of its staging buffer and of its semaphores (both 0 where one block reduces
/// each output), and the blocks it gives each output.
struct ReduceLaunch {
  std::int64_t staging_bytes = 0;
  std::int64_t semaphore_bytes = 0;
  int ctas_per_output = 1;
};

/// All a reduction takes: an accumulation buffer held through its launches (only where it is split for 32-bit
/// indexing and cannot accumulate in its output), and each launch in order, each allocating its staging, then its
/// semaphores, freeing both before the next.
struct ReduceBuffers {
  std::int64_t accumulation_bytes = 0;
  std::vector<ReduceLaunch> launches;
};

/// TensorIterator's reduce_op over `operands`: reorder_dimensions and coalesce_dimensions.
[[nodiscard]] ReduceIteration reduce_iteration(const ReduceOperands& operands);

/// setReduceConfig's staging (ReduceConfig::global_memory_size) and semaphores (semaphore_size) for one launch over
/// an iteration that 32-bit indexing covers.
[[nodiscard]] ReduceLaunch reduce_launch(const ReduceIteration& iteration, const ReduceOperands& operands,
                                         const CudaReduceDevice& device = {});

/// gpu_reduce_kernel's allocations: the iteration, split as with_32bit_indexing splits it where it must be.
[[nodiscard]] ReduceBuffers cuda_reduce_buffers(const ReduceOperands& operands, const CudaReduceDevice& device = {});

}  // namespace memgate
