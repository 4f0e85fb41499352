// PyTorch's CUDA reduction kernel's buffers, computed as torch 2.11 computes them: TensorIterator
// (aten/src/ATen/TensorIterator.cpp: reorder_dimensions, coalesce_dimensions, can_use_32bit_indexing,
// get_dim_to_split, split) and Reduce.cuh (setReduceConfig, get_output_vec_size, ReduceConfig, gpu_reduce_kernel),
// line by line where it matters, with PyTorch's names.
#include "memgate/estimate/cuda_reduce.h"

#include "memgate/base/error.h"
#include "memgate/estimate/estimate_context.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <limits>
#include <numeric>
#include <utility>

namespace memgate {
namespace {

constexpr int kWarpSize = 32;
constexpr int kMinValuesPerThread = 16;  // CUDA; ROCm's is 128
constexpr int kMaxValuesPerThread = 256;

int last_pow2(int n) {
  n |= (n >> 1);
  n |= (n >> 2);
  n |= (n >> 4);
  n |= (n >> 8);
  n |= (n >> 16);
  return std::max(1, n - (n >> 1));
}

template <typename T>
T div_up(T a, T b) {
  return (a + b - 1) / b;
}

std::int64_t numel(const ReduceIteration& it) {
  std::int64_t n = 1;
  for (const auto s : it.shape) n *= s;
  return n;
}

int num_reduce_dims(const ReduceIteration& it) {
  return static_cast<int>(std::count(it.output_strides.begin(), it.output_strides.end(), 0));
}

std::int64_t num_output_elements(const ReduceIteration& it) {
  std::int64_t n = 1;
  for (std::size_t d = 0; d < it.shape.size(); ++d) {
    if (it.output_strides[d] != 0 || it.shape[d] == 0) n *= it.shape[d];
  }
  return n;
}

bool can_use_32bit_indexing(const ReduceIteration& it) {
  constexpr std::int64_t max_value = std::numeric_limits<std::int32_t>::max();
  if (numel(it) > max_value) return false;
  for (const auto* strides : {&it.output_strides, &it.input_strides}) {
    std::int64_t max_offset = 1;
    for (std::size_t d = 0; d < it.shape.size(); ++d) max_offset += (it.shape[d] - 1) * (*strides)[d];
    if (max_offset > max_value) return false;
  }
  return true;
}

int dim_to_split(const ReduceIteration& it) {
  std::int64_t max_extent = -1;
  int dim = -1;
  for (int d = static_cast<int>(it.shape.size()) - 1; d >= 0; --d) {
    const auto size = it.shape[d];
    if (size == 0) continue;
    for (const auto* strides : {&it.output_strides, &it.input_strides}) {
      const auto extent = (size - 1) * std::abs((*strides)[d]);
      if (extent > max_extent) {
        max_extent = extent;
        dim = d;
      }
    }
  }
  return dim;
}

// get_output_vec_size: 4, halved until it divides the input's address (in elements), the outputs' dim and every
// other stride of the input.
int output_vec_size(const ReduceIteration& it, const ReduceOperands& operands) {
  int vec_size = 4;
  const auto update = [&](std::uint64_t n) {
    while (n % static_cast<std::uint64_t>(vec_size) != 0) vec_size /= 2;
  };
  update(static_cast<std::uint64_t>(it.input_offset_bytes / operands.input_element_size));
  const auto output_index = static_cast<std::size_t>(num_reduce_dims(it));
  update(static_cast<std::uint64_t>(it.shape[output_index]));
  for (std::size_t j = 0; j < it.input_strides.size(); ++j) {
    if (j != output_index) update(static_cast<std::uint64_t>(it.input_strides[j] / operands.input_element_size));
  }
  return vec_size;
}

void launches(const ReduceIteration& it, const ReduceOperands& operands, const CudaReduceDevice& device,
              std::vector<ReduceLaunch>& out) {
  if (can_use_32bit_indexing(it)) {
    out.push_back(reduce_launch(it, operands, device));
    return;
  }
  // with_32bit_indexing: the first half of the dim that spans most bytes, then the rest, each split again until it
  // fits.
  const auto dim = dim_to_split(it);
  if (dim < 0 || it.shape[static_cast<std::size_t>(dim)] < 2) {
    // Every dim left spans 0 bytes (an input expanded from one value, the gradient of a .sum(), whose outputs are
    // already split one by one): TensorIteratorBase::split asserts shape()[dim] >= 2, and CUDA's reduction fails.
    throw CannotRunOnCudaError(fmt::format(
        "on CUDA this reduction fails: its input of sizes [{}] and strides [{}] has {} elements, more than 32-bit "
        "indexing covers, and spans no bytes to split it by (expanded from one value, as the gradient of a .sum() is); "
        "PyTorch 2.11's gpu_reduce_kernel cannot split it (TensorIterator::split: INTERNAL ASSERT FAILED, "
        "\"shape()[dim] >= 2\"), so this step {}",
        fmt::join(operands.sizes, ", "), fmt::join(operands.strides, ", "),
        std::accumulate(operands.sizes.begin(), operands.sizes.end(), std::int64_t{1}, std::multiplies<>()),
        kCannotRunOnCuda));
  }
  auto first = it, rest = it;
  const auto copy_size = it.shape[dim] / 2;
  first.shape[dim] = copy_size;
  rest.shape[dim] = it.shape[dim] - copy_size;
  rest.input_offset_bytes += copy_size * it.input_strides[dim];
  launches(first, operands, device, out);
  launches(rest, operands, device, out);
}

}  // namespace

ReduceIteration reduce_iteration(const ReduceOperands& operands) {
  const auto ndim = operands.sizes.size();
  const auto reduced = [&](std::size_t d) { return operands.reduced.empty() || operands.reduced[d]; };
  ReduceIteration it;
  it.shape = operands.sizes;
  it.input_offset_bytes = operands.input_offset_bytes;
  it.input_strides.resize(ndim);
  it.output_strides.resize(ndim);
  // The output (contiguous) as review_reduce_result views it: the input's shape, stride 0 on the reduced dims.
  std::int64_t out_stride = operands.output_element_size;
  for (std::size_t i = ndim; i-- > 0;) {
    it.input_strides[i] = operands.strides[i] * operands.input_element_size;
    if (reduced(i)) {
      it.output_strides[i] = 0;
    } else {
      it.output_strides[i] = out_stride;
      out_stride *= operands.sizes[i];
    }
  }
  if (ndim <= 1) return it;
  // reorder_dimensions: insertion sort from the reversed order; should_swap gives 1 where dim0 goes after dim1,
  // -1 where before, 0 where it cannot tell. The output comes first, and puts its reduced dims in front.
  std::vector<std::size_t> perm(ndim);
  std::iota(perm.rbegin(), perm.rend(), std::size_t{0});
  const auto should_swap = [&](std::size_t dim0, std::size_t dim1) {
    for (const auto* strides : {&it.output_strides, &it.input_strides}) {
      const auto stride0 = (*strides)[dim0], stride1 = (*strides)[dim1];
      if (strides == &it.output_strides && (stride0 == 0) != (stride1 == 0)) return stride1 == 0 ? 1 : -1;
      if (stride0 == 0 || stride1 == 0) continue;
      if (stride0 < stride1) return -1;
      if (stride0 > stride1) return 1;
      if (it.shape[dim0] > it.shape[dim1]) return 1;
    }
    return 0;
  };
  for (std::size_t i = 1; i < ndim; ++i) {
    auto dim1 = i;
    for (auto dim0 = static_cast<std::ptrdiff_t>(i) - 1; dim0 >= 0; --dim0) {
      const auto comparison = should_swap(perm[static_cast<std::size_t>(dim0)], perm[dim1]);
      if (comparison > 0) {
        std::swap(perm[static_cast<std::size_t>(dim0)], perm[dim1]);
        dim1 = static_cast<std::size_t>(dim0);
      } else if (comparison < 0) {
        break;
      }
    }
  }
  const auto permuted = [&](const std::vector<std::int64_t>& v) {
    std::vector<std::int64_t> out(ndim);
    for (std::size_t i = 0; i < ndim; ++i) out[i] = v[perm[i]];
    return out;
  };
  it.shape = permuted(it.shape);
  it.output_strides = permuted(it.output_strides);
  it.input_strides = permuted(it.input_strides);
  // coalesce_dimensions: neighbours merge where either has size 1 or, for both operands, one steps over the other.
  const auto can_coalesce = [&](std::size_t dim0, std::size_t dim1) {
    const auto shape0 = it.shape[dim0], shape1 = it.shape[dim1];
    if (shape0 == 1 || shape1 == 1) return true;
    for (const auto* strides : {&it.output_strides, &it.input_strides}) {
      if (shape0 * (*strides)[dim0] != (*strides)[dim1]) return false;
    }
    return true;
  };
  const auto replace_stride = [&](std::size_t dim0, std::size_t dim1) {
    it.output_strides[dim0] = it.output_strides[dim1];
    it.input_strides[dim0] = it.input_strides[dim1];
  };
  std::size_t prev_dim = 0;
  for (std::size_t dim = 1; dim < ndim; ++dim) {
    if (can_coalesce(prev_dim, dim)) {
      if (it.shape[prev_dim] == 1) replace_stride(prev_dim, dim);
      it.shape[prev_dim] *= it.shape[dim];
    } else {
      ++prev_dim;
      if (prev_dim != dim) {
        replace_stride(prev_dim, dim);
        it.shape[prev_dim] = it.shape[dim];
      }
    }
  }
  it.shape.resize(prev_dim + 1);
  it.output_strides.resize(prev_dim + 1);
  it.input_strides.resize(prev_dim + 1);
  return it;
}

ReduceLaunch reduce_launch(const ReduceIteration& it, const ReduceOperands& operands, const CudaReduceDevice& device) {
  // setReduceConfig: each thread starts with one output and all its inputs.
  const auto num_outputs = static_cast<int>(num_output_elements(it));
  if (num_outputs == 0) return {};
  const auto num_inputs = static_cast<int>(numel(it) / num_outputs);
  const auto ndim = static_cast<int>(it.shape.size());
  const auto nreduce = num_reduce_dims(it);
  std::int64_t dim0 = 1, dim1 = 1, fastest_moving_stride = operands.input_element_size;
  bool reduction_on_fastest_striding_dimension = true;
  if (ndim > 0) {
    reduction_on_fastest_striding_dimension =
        nreduce == ndim || it.input_strides[0] < it.input_strides[static_cast<std::size_t>(nreduce)];
    if (reduction_on_fastest_striding_dimension) {
      // block.x along the reduced dim: the threads of a row reduce together.
      dim0 = num_inputs;
      dim1 = num_outputs;
      fastest_moving_stride = it.input_strides[0];
    } else {
      // block.x along the outputs: each thread its own.
      dim0 = num_outputs;
      dim1 = num_inputs;
      fastest_moving_stride = it.input_strides[static_cast<std::size_t>(nreduce)];
    }
  }
  // Vectorized loads: along the input (vectorize_input) where it reduces its fastest dim, else along the outputs.
  int vec_out = 1;
  if (fastest_moving_stride == operands.input_element_size) {
    if (reduction_on_fastest_striding_dimension && dim0 >= 128 && nreduce == 1) {
      dim0 /= operands.input_vec_size;
    } else if (!reduction_on_fastest_striding_dimension) {
      vec_out = output_vec_size(it, operands);
      dim0 /= vec_out;
    }
  }
  // set_block_dimension
  const int max_num_threads = operands.max_threads / vec_out;
  const int dim0_pow2 = dim0 < max_num_threads ? last_pow2(static_cast<int>(dim0)) : max_num_threads;
  const int dim1_pow2 = dim1 < max_num_threads ? last_pow2(static_cast<int>(dim1)) : max_num_threads;
  int block_width = std::min(dim0_pow2, kWarpSize);
  const int block_height = std::min(dim1_pow2, max_num_threads / block_width);
  block_width = std::min(dim0_pow2, max_num_threads / block_height);
  const int num_threads = block_width * block_height;

  int step_input = 1, step_output = 1;
  bool block_x_reduce = false, block_y_reduce = false;
  if (ndim == 0 || reduction_on_fastest_striding_dimension) {
    block_x_reduce = true;  // input_mult[0] = split_input(block_width)
    step_input *= block_width;
  } else {
    step_output *= block_width;  // output_mult[0] = split_output(block_width)
  }
  const auto values_per_thread = [&] { return div_up(num_inputs, step_input); };
  const int warp_split_threshold = std::min(block_height * 16, kMaxValuesPerThread);
  if (values_per_thread() >= warp_split_threshold) {
    block_y_reduce = true;  // input_mult[1] = split_input(block_height)
    step_input *= block_height;
  } else {
    step_output *= block_height;
  }
  const int blocks_per_sm = device.max_threads_per_multiprocessor / num_threads;
  const int target_grid_size = device.multiprocessors * blocks_per_sm;
  const int grid_x = div_up(num_outputs / vec_out, step_output);
  ReduceLaunch launch;
  if (block_y_reduce && values_per_thread() >= kMaxValuesPerThread && grid_x <= target_grid_size) {
    const int ctas_per_output1 = div_up(target_grid_size, grid_x);
    const int ctas_per_output2 = div_up(values_per_thread(), kMinValuesPerThread);
    const int ctas_per_output3 = div_up(values_per_thread(), kMaxValuesPerThread);
    launch.ctas_per_output = std::max(std::min(ctas_per_output1, ctas_per_output2), ctas_per_output3);
  }
  if (launch.ctas_per_output > 1) {
    // should_global_reduce: global_memory_size and semaphore_size.
    launch.staging_bytes = std::int64_t{operands.accumulate_size} * num_outputs * launch.ctas_per_output;
    if (!block_x_reduce) launch.staging_bytes *= std::int64_t{block_width} * vec_out;
    launch.semaphore_bytes = std::int64_t{4} * grid_x;
  }
  return launch;
}

CudaReduceDevice estimated_cuda_reduce_device() { return estimate_context().gpu; }

ReduceBuffers cuda_reduce_buffers(const ReduceOperands& operands, const CudaReduceDevice& device) {
  ReduceBuffers buffers;
  const auto it = reduce_iteration(operands);
  if (numel(it) == 0) return buffers;  // no kernel: the output is filled
  if (!operands.can_accumulate_in_output && !can_use_32bit_indexing(it) &&
      operands.output_element_size < operands.accumulate_size) {
    // AccumulationBuffer: the output's extent in the accumulation type.
    std::int64_t output_memory_size = operands.output_element_size;
    for (std::size_t d = 0; d < it.shape.size(); ++d) {
      output_memory_size = std::max(output_memory_size, it.shape[d] * it.output_strides[d]);
    }
    buffers.accumulation_bytes = output_memory_size / operands.output_element_size * operands.accumulate_size;
  }
  launches(it, operands, device, buffers.launches);
  return buffers;
}

}  // namespace memgate
