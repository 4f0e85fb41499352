// CUDA's reduction kernel's staging buffers (cuda_reduce.h): the sizes an H200's allocation traces showed, the
// iteration as TensorIterator builds it, and the estimate's Meta kernels allocating them for CUDA only.
#include "memgate/estimate/cuda_reduce.h"

#include "memgate/backend/meta_allocator.h"
#include "memgate/base/error.h"
#include "memgate/estimate/estimate_context.h"
#include "memgate/estimate/meta_kernels.h"

#include <ATen/TensorIterator.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace memgate {
namespace {

std::vector<std::int64_t> channels_last(std::int64_t c, std::int64_t h, std::int64_t w) {
  return {c * h * w, 1, w * c, c};
}

ReduceOperands fp32(std::vector<std::int64_t> sizes, std::vector<std::int64_t> strides, std::vector<bool> reduced) {
  ReduceOperands r;
  r.sizes = std::move(sizes);
  r.strides = std::move(strides);
  r.reduced = std::move(reduced);
  return r;
}

ReduceLaunch one_launch(const ReduceOperands& operands, const CudaReduceDevice& device = {}) {
  const auto buffers = cuda_reduce_buffers(operands, device);
  EXPECT_EQ(buffers.accumulation_bytes, 0);
  EXPECT_EQ(buffers.launches.size(), 1U);
  return buffers.launches.empty() ? ReduceLaunch{} : buffers.launches.front();
}

// Every staging buffer of two H200 traces of the camo_seg conv nets at batch 4 (fp32): the decoder's convolution
// bias gradients over channels-last outputs at 96, 48 and 24 px (none at 12), the linear layers' bias gradients
// (the autograd engine's sum over the tokens), and the BCE loss's mean.
TEST(CudaReduceTest, StagesWhatTheH200sTracesShowed) {
  struct Case {
    std::string name;
    ReduceOperands operands;
    std::int64_t staging, semaphores;
  };
  const std::vector<bool> conv_bias{true, false, true, true};
  const std::vector<Case> cases{
      {"conv bias, channels last [4,128,96,96]", fp32({4, 128, 96, 96}, channels_last(128, 96, 96), conv_bias),
       37'748'736, 4},
      {"conv bias, channels last [4,128,48,48]", fp32({4, 128, 48, 48}, channels_last(128, 48, 48), conv_bias),
       9'437'184, 4},
      {"conv bias, channels last [4,128,24,24]", fp32({4, 128, 24, 24}, channels_last(128, 24, 24), conv_bias),
       2'359'296, 4},
      {"conv bias, channels last [4,128,12,12]", fp32({4, 128, 12, 12}, channels_last(128, 12, 12), conv_bias), 0, 0},
      {"linear bias [2304,640] over dim 0", fp32({2304, 640}, {640, 1}, {true, false}), 11'796'480, 20},
      {"linear bias [2304,160] over dim 0", fp32({2304, 160}, {160, 1}, {true, false}), 2'949'120, 8},
      {"mean of [4,1,384,384]", fp32({4, 1, 384, 384}, {147456, 147456, 384, 1}, {}), 288, 4},
  };
  for (const auto& c : cases) {
    const auto launch = one_launch(c.operands);
    EXPECT_EQ(launch.staging_bytes, c.staging) << c.name;
    EXPECT_EQ(launch.semaphore_bytes, c.semaphores) << c.name;
  }
  // The same gradient channels first reduces along its fastest dim, a block per channel: nothing staged.
  EXPECT_EQ(one_launch(fp32({4, 128, 96, 96}, {128 * 96 * 96, 96 * 96, 96, 1}, conv_bias)).staging_bytes, 0);
}

// Where few outputs each have many inputs, the blocks per output are bounded by the occupancy target (SMs x blocks
// per SM): an A100's 108 SMs stage less than an H200's 132.
TEST(CudaReduceTest, TheStagingOfAReductionBoundByOccupancyFollowsTheSmCount) {
  const auto sum_rows = fp32({32768, 4096}, {4096, 1}, {true, false});
  const auto h200 = one_launch(sum_rows);
  const auto a100 = one_launch(sum_rows, CudaReduceDevice{108, 2048});
  EXPECT_EQ(h200.ctas_per_output, 66);  // 132 SMs x 16 blocks of 128 threads, over a grid of 32 columns
  EXPECT_EQ(a100.ctas_per_output, 54);
  EXPECT_EQ(h200.staging_bytes, std::int64_t{4} * 4096 * 66 * 32 * 4);
  EXPECT_EQ(a100.staging_bytes, std::int64_t{4} * 4096 * 54 * 32 * 4);
  EXPECT_EQ(h200.semaphore_bytes, 4 * 32);
}

// An input beyond 32-bit indexing is reduced in pieces, the first half first, each with its own staging; an fp16 sum
// into fp16 then accumulates in an fp32 buffer of its outputs, held through all of them.
TEST(CudaReduceTest, AReductionBeyond32BitIndexingLaunchesOncePerPiece) {
  auto operands = fp32({65536, 16384}, {16384, 1}, {true, false});  // 4 GiB of fp32
  const auto fp32_buffers = cuda_reduce_buffers(operands);
  EXPECT_EQ(fp32_buffers.accumulation_bytes, 0);
  ASSERT_EQ(fp32_buffers.launches.size(), 2U);
  operands.input_element_size = operands.output_element_size = 2;
  operands.input_vec_size = 8;
  operands.can_accumulate_in_output = false;
  const auto fp16_buffers = cuda_reduce_buffers(operands);
  EXPECT_EQ(fp16_buffers.launches.size(), 1U) << "2 GiB of fp16 fit 32-bit indexing";
  operands.sizes[0] *= 2;
  const auto large = cuda_reduce_buffers(operands);
  EXPECT_EQ(large.launches.size(), 2U);
  EXPECT_EQ(large.accumulation_bytes, 16384 * 4);
}

// reduce_iteration against TensorIterator's own reduce_op: the same dims, in the same order, with the same strides.
TEST(CudaReduceTest, IteratesAsTensorIteratorDoes) {
  struct Case {
    std::vector<std::int64_t> sizes;
    std::vector<std::int64_t> permutation;  // of a contiguous tensor of the permuted sizes
    std::vector<std::int64_t> dims;         // empty: all
  };
  const std::vector<Case> cases{
      {{4, 8, 6, 6}, {0, 1, 2, 3}, {0, 2, 3}}, {{4, 8, 6, 6}, {0, 3, 1, 2}, {0, 2, 3}},
      {{4, 8, 6, 6}, {0, 3, 1, 2}, {1}},       {{4, 1, 6, 5}, {0, 1, 2, 3}, {}},
      {{12, 10}, {0, 1}, {0}},                 {{12, 10}, {1, 0}, {0}},
      {{3, 5, 7}, {2, 0, 1}, {1}},             {{2, 3, 4, 5, 6}, {0, 4, 1, 2, 3}, {0, 2, 3, 4}},
      {{5, 1, 7}, {0, 1, 2}, {0}},             {{3, 4, 5}, {1, 2, 0}, {0, 2}},
  };
  for (const auto& c : cases) {
    // A contiguous tensor permuted so that its sizes are c.sizes: dim i of the result is dim permutation[i] stored.
    std::vector<std::int64_t> stored(c.sizes.size());
    for (std::size_t i = 0; i < c.sizes.size(); ++i) stored[static_cast<std::size_t>(c.permutation[i])] = c.sizes[i];
    const auto input = torch::zeros(stored).permute(c.permutation);
    ASSERT_EQ(input.sizes().vec(), c.sizes);
    std::vector<bool> reduced(c.sizes.size(), c.dims.empty());
    for (const auto d : c.dims) reduced[static_cast<std::size_t>(d)] = true;
    auto out_sizes = c.sizes;
    for (std::size_t d = 0; d < c.sizes.size(); ++d) {
      if (reduced[d]) out_sizes[d] = 1;
    }
    auto out = torch::zeros(out_sizes);
    auto out_strides = out.strides().vec();
    for (std::size_t d = 0; d < c.sizes.size(); ++d) {
      if (reduced[d]) out_strides[d] = 0;
    }
    auto viewed = out.as_strided(out_sizes, out_strides);
    const auto iter = at::TensorIterator::reduce_op(viewed, input);

    ReduceOperands operands = fp32(c.sizes, input.strides().vec(), reduced);
    const auto it = reduce_iteration(operands);
    const auto name = ::testing::PrintToString(c.sizes) + " permuted " + ::testing::PrintToString(c.permutation) +
                      " over " + ::testing::PrintToString(c.dims);
    EXPECT_EQ(it.shape, iter.shape().vec()) << name;
    EXPECT_EQ(it.output_strides, iter.strides(0).vec()) << name;
    EXPECT_EQ(it.input_strides, iter.strides(1).vec()) << name;
  }
}

// Past 32-bit indexing, the launches against LibTorch's own TensorIterator (its with_32bit_indexing over views of one
// float: nothing allocated): as many pieces, and where an input expanded from one value leaves nothing to split (the
// gradient of a .sum() over 2^32 elements, a Linear's bias gradient), TensorIterator::split asserts; the estimate
// says that this reduction fails on CUDA, where it recursed into a stack overflow (signal 11) before.
TEST(CudaReduceTest, SplitsPast32BitIndexingAsTensorIteratorDoesAndFailsWhereItFails) {
  struct Case {
    std::string name;
    std::vector<std::int64_t> sizes;
    std::vector<std::int64_t> strides;  // empty: contiguous
    std::vector<bool> reduced;          // empty: all
    bool fails = false;                 // TensorIterator::split asserts
  };
  constexpr std::int64_t k2e30 = std::int64_t{1} << 30, k2e31 = std::int64_t{1} << 31, k2e32 = std::int64_t{1} << 32;
  const std::vector<Case> cases{
      {"expanded [2^30, 2] over dim 0 (2^31 elements)", {k2e30, 2}, {0, 0}, {true, false}},
      {"expanded [2^31, 2] over dim 0 (2^32 elements)", {k2e31, 2}, {0, 0}, {true, false}, true},
      {"expanded [2^31, 1] over dim 0", {k2e31, 1}, {0, 0}, {true, false}},
      {"expanded [4, 2^31] over dim 1", {4, k2e31}, {0, 0}, {false, true}, true},
      {"expanded [2^32] over all", {k2e32}, {0}, {}},
      {"expanded [2^32 + 3] over all", {k2e32 + 3}, {0}, {}},
      {"[2^16, 2^16] over dim 0 (2^32 elements)", {65536, 65536}, {}, {true, false}},
      {"[2^16, 2^16] over dim 1", {65536, 65536}, {}, {false, true}},
      {"[2^32] over all", {k2e32}, {}, {}},
      {"[3, 2^31] over dim 1", {3, k2e31}, {}, {false, true}},
      {"[2^31 + 1] over all", {k2e31 + 1}, {}, {}},
      {"channels last [64, 128, 512, 512] over 0, 2, 3", {64, 128, 512, 512}, channels_last(128, 512, 512),
       {true, false, true, true}},
  };
  // On the CPU (a Meta iterator skips coalesce_dimensions): views of one float that no one reads, as large as asked.
  float one = 0;
  for (const auto& c : cases) {
    auto strides = c.strides;
    if (strides.empty()) strides = torch::empty(c.sizes, torch::kMeta).strides().vec();
    const auto input = torch::from_blob(&one, c.sizes, strides, torch::kFloat);
    std::vector<bool> reduced = c.reduced.empty() ? std::vector<bool>(c.sizes.size(), true) : c.reduced;
    auto out_sizes = c.sizes;
    for (std::size_t d = 0; d < c.sizes.size(); ++d) {
      if (reduced[d]) out_sizes[d] = 1;
    }
    auto out_strides = torch::empty(out_sizes, torch::kMeta).strides().vec();
    for (std::size_t d = 0; d < c.sizes.size(); ++d) {
      if (reduced[d]) out_strides[d] = 0;
    }
    auto viewed = torch::from_blob(&one, out_sizes, out_strides, torch::kFloat);
    auto iter = at::TensorIterator::reduce_op(viewed, input);
    ASSERT_FALSE(iter.can_use_32bit_indexing()) << c.name;
    std::size_t pieces = 0;
    bool aten_fails = false;
    try {
      for (auto& piece : iter.with_32bit_indexing()) {
        EXPECT_TRUE(piece.can_use_32bit_indexing()) << c.name;
        ++pieces;
      }
    } catch (const c10::Error& e) {
      aten_fails = true;
      EXPECT_THAT(e.what(), ::testing::HasSubstr("shape()[dim] >= 2")) << c.name;
    }
    EXPECT_EQ(aten_fails, c.fails) << c.name;
    const auto operands = fp32(c.sizes, strides, reduced);
    if (aten_fails) {
      try {
        (void)cuda_reduce_buffers(operands);
        ADD_FAILURE() << c.name << ": LibTorch's split fails, the estimate's did not";
      } catch (const Error& e) {
        EXPECT_THAT(e.what(), ::testing::HasSubstr("on CUDA this reduction fails")) << c.name;
        EXPECT_THAT(e.what(), ::testing::HasSubstr("sizes [" + std::to_string(c.sizes[0]))) << c.name;
        EXPECT_THAT(e.what(), ::testing::HasSubstr("more than 32-bit indexing covers")) << c.name;
      }
    } else {
      EXPECT_EQ(cuda_reduce_buffers(operands).launches.size(), pieces) << c.name;
    }
  }
}

// The audio front end's bias gradient at batch 16384 ([B, 65536, 1] into a Linear(1, 2), a .sum() loss): 2^30 rows of
// an expanded gradient, 2^31 elements, split by its two outputs; each column's 2^30 inputs over 512-thread blocks
// (block.y), 2^21 values per thread, 8192 blocks per output (setReduceConfig: values_per_thread / 256 bounds it from
// below): 8192 fp32 partials staged and one semaphore, per launch. At batch 32768 (2^31 rows) it fails as CUDA does.
TEST(CudaReduceTest, StagesTheBiasGradientOfASumPast2To31ElementsPerOutput) {
  constexpr std::int64_t rows = std::int64_t{1} << 30;
  const auto buffers = cuda_reduce_buffers(fp32({rows, 2}, {0, 0}, {true, false}));
  ASSERT_EQ(buffers.launches.size(), 2U);
  for (const auto& launch : buffers.launches) {
    EXPECT_EQ(launch.ctas_per_output, 8192);
    EXPECT_EQ(launch.staging_bytes, 4 * 8192);
    EXPECT_EQ(launch.semaphore_bytes, 4);
  }
  EXPECT_THROW((void)cuda_reduce_buffers(fp32({2 * rows, 2}, {0, 0}, {true, false})), Error);
}

// Every reduction an estimate for CUDA runs on the Meta device, past 2^31 and past 2^32 elements: sums over dims and
// over all, mean, var, std, norms, softmax and log_softmax, layer, group and batch norm, cross-entropy, argmax,
// forward and backward where it has one. Each returns its output's shape (nothing allocated; no signal). A .sum()'s
// gradient through a Linear (its bias gradient sums an expanded gradient) fails as CUDA does past 2^32 elements and
// runs at 2^31; a .mean()'s, materialized, runs at both.
TEST(CudaReduceTest, EveryReductionOnTheMetaDeviceRunsPast32BitIndexing) {
  auto& allocator = CountingMetaAllocator::install();
  allocator.set_granularity(512);
  allocator.model_caching_allocator(false);
  register_meta_kernels();
  const EstimateContextGuard for_cuda({.target = EstimateTarget::kCuda});
  const auto meta = torch::TensorOptions().device(torch::kMeta);
  for (const std::int64_t rows : {std::int64_t{1} << 25, std::int64_t{1} << 26, (std::int64_t{1} << 26) + 64}) {
    // [rows, 64]: 2^31, 2^32 and 2^32 + 4096 elements
    const auto label = "rows " + std::to_string(rows);
    const auto x = torch::empty({rows, 64}, meta).requires_grad_();
    const auto expect_shape = [&](const at::Tensor& t, std::vector<std::int64_t> sizes, const char* what) {
      EXPECT_EQ(t.sizes().vec(), sizes) << what << ", " << label;
    };
    expect_shape(x.sum(0), {64}, "sum over dim 0");
    expect_shape(x.sum(1), {rows}, "sum over dim 1");
    expect_shape(x.sum(), {}, "sum");
    expect_shape(x.mean(0), {64}, "mean over dim 0");
    expect_shape(x.mean(), {}, "mean");
    expect_shape(x.var(0), {64}, "var");
    expect_shape(x.std(1), {rows}, "std");
    expect_shape(at::linalg_vector_norm(x, 2, {0}), {64}, "vector_norm");
    expect_shape(x.norm(), {}, "norm");
    expect_shape(x.argmax(0), {64}, "argmax over dim 0");
    expect_shape(x.argmax(), {}, "argmax");
    expect_shape(std::get<0>(x.max(1)), {rows}, "max over dim 1");
    expect_shape(x.logsumexp(1), {rows}, "logsumexp");
    allocator.reset_peak();
    const auto staged_from = allocator.current_bytes();
    const auto column_sums = x.sum(0);
    EXPECT_GT(allocator.peak_bytes() - staged_from - 512, 0) << "the sum's staging above its output, " << label;
    const auto backward = [&](const at::Tensor& loss, const char* what) {
      x.mutable_grad() = at::Tensor();
      loss.backward();
      expect_shape(x.grad(), {rows, 64}, what);
    };
    backward(x.softmax(1).mul(x).sum(), "softmax");
    backward(x.log_softmax(1).mean(), "log_softmax");
    backward(at::cross_entropy_loss(x, torch::zeros({rows}, meta.dtype(torch::kLong))), "cross_entropy");
    backward(at::layer_norm(x, {64}).mean(), "layer_norm");
    const auto x4 = x.view({rows / 32, 64, 32, 1});
    backward(at::group_norm(x4, 8).mean(), "group_norm");
    backward(at::batch_norm(x4, {}, {}, {}, {}, true, 0.1, 1e-5, false).mean(), "batch_norm");
  }
  // A Linear(1, 2)'s bias gradient over 2^30 and 2^31 rows: a .mean()'s gradient is materialized and runs at both; a
  // .sum()'s is expanded, and runs at 2^31 elements (split by the two outputs) but fails at 2^32, naming why.
  for (const std::int64_t rows : {std::int64_t{1} << 30, std::int64_t{1} << 31}) {
    const auto label = "rows " + std::to_string(rows);
    const auto weight = torch::empty({2, 1}, meta).requires_grad_();
    const auto bias = torch::empty({2}, meta).requires_grad_();
    const auto x = torch::empty({rows, 1}, meta);
    at::linear(x, weight, bias).mean().backward();
    EXPECT_EQ(bias.grad().sizes().vec(), std::vector<std::int64_t>{2}) << "a mean's, " << label;
    bias.mutable_grad() = at::Tensor();
    if (rows == std::int64_t{1} << 30) {
      at::linear(x, weight, bias).sum().backward();
      EXPECT_EQ(bias.grad().sizes().vec(), std::vector<std::int64_t>{2}) << "a sum's, " << label;
    } else {
      try {
        at::linear(x, weight, bias).sum().backward();
        ADD_FAILURE() << "a sum's bias gradient over 2^31 rows ran";
      } catch (const std::exception& e) {
        EXPECT_THAT(e.what(), ::testing::HasSubstr("on CUDA this reduction fails: its input of sizes [2147483648, 2]"));
      }
    }
  }
  allocator.set_granularity(0);
}

// The Meta kernels of an estimate for CUDA allocate the staging and semaphores after the output and free them before
// they return: a sum's and a convolution's bias gradient's; for the CPU, the output only.
TEST(CudaReduceTest, TheEstimateForCudaStagesAsTheGpuDoesTheCpuNot) {
  auto& meta = CountingMetaAllocator::install();
  meta.set_granularity(0);
  meta.model_caching_allocator(false);
  const auto options = torch::TensorOptions().device(torch::kMeta);
  const auto grad_output = torch::empty({4, 128, 96, 96}, options.memory_format(torch::MemoryFormat::ChannelsLast));
  const auto input = torch::empty({4, 64, 96, 96}, options.memory_format(torch::MemoryFormat::ChannelsLast));
  const auto weight = torch::empty({128, 64, 1, 1}, options.memory_format(torch::MemoryFormat::ChannelsLast));
  const auto above_output = [&](const std::function<at::Tensor()>& op) {
    const auto before = meta.current_bytes();
    meta.reset_peak();
    const auto out = op();
    EXPECT_EQ(meta.current_bytes() - before, 512) << "the 128 channels' fp32 sums stay";
    return meta.peak_bytes() - before - 512;
  };
  const auto sum = [&] { return grad_output.sum({0, 2, 3}); };
  const auto bias_gradient = [&] {
    return std::get<2>(at::convolution_backward(grad_output, input, weight, std::vector<std::int64_t>{128}, {1, 1},
                                                {0, 0}, {1, 1}, false, {0, 0}, 1, {false, false, true}));
  };
  register_meta_kernels();
  {
    const EstimateContextGuard for_cuda({.target = EstimateTarget::kCuda});
    EXPECT_EQ(above_output(sum), 37'748'736 + 4);
    EXPECT_EQ(above_output(bias_gradient), 37'748'736 + 4);
  }
  EXPECT_EQ(above_output(sum), 0);
  EXPECT_EQ(above_output(bias_gradient), 0);
}

// The GPU an estimate speaks for: this thread's estimate context, set for a scope by one guard (the search sets it
// for each GPU target) and put back after; {0, 0} keeps the GPU around it, and another thread has its own. The same
// bias gradient stages less on a T4 (40 x 1,024) than on an H100: the Meta kernel reads it.
TEST(CudaReduceTest, TheEstimateStagesForTheGpuItSpeaksFor) {
  EXPECT_EQ(estimated_cuda_reduce_device().multiprocessors, 132);
  {
    const EstimateContextGuard t4(estimate_context_for_gpu({40, 1024}));
    EXPECT_EQ(estimated_cuda_reduce_device().multiprocessors, 40);
    EXPECT_EQ(estimated_cuda_reduce_device().max_threads_per_multiprocessor, 1024);
    EXPECT_EQ(estimate_context().target, EstimateTarget::kCuda);
    {
      const EstimateContextGuard defaults(estimate_context_for_gpu({0, 0}));  // nothing of its own: the T4's stays
      EXPECT_EQ(estimated_cuda_reduce_device().multiprocessors, 40);
    }
    EXPECT_EQ(estimated_cuda_reduce_device().multiprocessors, 40);
    int other_thread = 0;
    std::thread([&] { other_thread = estimated_cuda_reduce_device().multiprocessors; }).join();
    EXPECT_EQ(other_thread, 132);
  }
  EXPECT_EQ(estimated_cuda_reduce_device().multiprocessors, 132);
  EXPECT_EQ(estimate_context(), EstimateContext{});

  auto& meta = CountingMetaAllocator::install();
  meta.set_granularity(0);
  meta.model_caching_allocator(false);
  const auto grad_output = torch::empty({4, 128, 96, 96}, torch::TensorOptions().device(torch::kMeta).memory_format(
                                                                 torch::MemoryFormat::ChannelsLast));
  const auto staged = [&] {
    const auto before = meta.current_bytes();
    meta.reset_peak();
    const auto out = grad_output.sum({0, 2, 3});
    return meta.peak_bytes() - before - 512;  // above the output's block
  };
  register_meta_kernels();
  std::int64_t on_h100 = 0;
  std::int64_t on_t4 = 0;
  {
    const EstimateContextGuard for_cuda({.target = EstimateTarget::kCuda});
    on_h100 = staged();
    const EstimateContextGuard t4(estimate_context_for_gpu({40, 1024}));
    on_t4 = staged();
  }
  EXPECT_GT(on_h100, 0);
  EXPECT_GT(on_t4, 0);
  EXPECT_LT(on_t4, on_h100);
}

}  // namespace
}  // namespace memgate
