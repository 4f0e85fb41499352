// The workspace cuDNN takes from the caching allocator for one convolution, as PyTorch 2.11 runs it on a GPU with
// benchmarking off (aten/src/ATen/native/cudnn/Conv_v8.cpp, run_single_conv): cuDNN's heuristic engine configs
// (CUDNN_HEUR_MODE_INSTANT) without those ATen filters out, then its fallback configs, the same way filtered; the
// first whose execution plan builds runs, and its workspace (EXECUTION_PLAN_WORKSPACE_SIZE) is allocated for that call
// and freed after it. cuDNN answers this without a GPU when it is given the GPU's device properties (a
// CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR from JSON, fixtures/gpus' `cudnn_device`), so an estimate asks the very cuDNN
// the torch wheel ships (libcudnn_graph.so.9, loaded at run time: memgate builds and runs without it, and only an
// estimate for CUDA that reaches a cuDNN convolution needs it).
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace memgate {

/// Which of a convolution's three computations cuDNN runs. A transposed convolution's forward is a backward-data
/// pass, its input's gradient a forward pass.
enum class ConvolutionPass { kForward, kBackwardData, kBackwardFilter };

/// One convolution as ATen describes it to cuDNN (build_opgraph): x the input (its gradient for backward data), w
/// the weight (its gradient for backward filter), y the output (its gradient for both backward passes); sizes and
/// strides in elements, as the tensors are laid out (ATen makes them contiguous in the convolution's memory format,
/// and cuDNN sees size-1 dims with the strides fixSizeOneDimStride gives them). Groups are in the weight's shape.
struct CudnnConvolution {
  ConvolutionPass pass = ConvolutionPass::kForward;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<std::int64_t> x_sizes, x_strides, w_sizes, w_strides, y_sizes, y_strides;
  std::vector<std::int64_t> stride, padding, dilation;  ///< one per spatial dim
  bool channels_last = false;  ///< cudnn_conv_suggest_memory_format's answer: ChannelsLast(3d) or Contiguous
  /// getAlignment of each data pointer: the caching allocator's blocks start 512-byte aligned, so 32 (the most ATen
  /// reports) for every tensor that starts its block.
  std::int64_t alignment = 32;
  bool deterministic = false;  ///< torch.backends.cudnn.deterministic (2.11's default: off)
  bool allow_tf32 = true;      ///< torch.backends.cudnn.allow_tf32 (2.11's default for convolutions: on)
};

/// The workspace bytes of the plan ATen runs for `convolution` on the GPU that `device_json` describes (the JSON
/// of cuDNN's device properties). Cached per convolution and GPU, as ATen caches each plan (per thread). Throws
/// memgate::Error where cuDNN cannot be loaded (naming where it looked), or answers no plan.
[[nodiscard]] std::int64_t cudnn_workspace_bytes(const CudnnConvolution& convolution, const std::string& device_json);

/// The device properties an estimate for CUDA gives cuDNN: this thread's estimate context's (estimate_context.h),
/// else MEMGATE_ESTIMATE_GPU_CUDNN (a user's override: a GPU fixture's `cudnn_device` JSON), else an H200's
/// (fixtures/gpus/h200_141gb.yaml as memgate was built with it, built in: wherever memgate runs).
[[nodiscard]] std::string estimated_cudnn_device_json();

/// Where libcudnn_graph.so.9 was loaded from, or why it could not be (for messages and tests).
[[nodiscard]] std::string cudnn_library_description();

}  // namespace memgate
