// What an estimate on the Meta device is for, kept as PyTorch keeps its modes (c10::impl::ExcludeDispatchKeyGuard,
// at::AutoDispatchBelowADInplaceOrView): one thread-local value, set for a scope by one RAII guard and put back after.
// The Meta kernels read it (the GPU's SMs for a reduction's staging, cuDNN's device properties for a convolution's
// workspace); a probe's own process gets it from its request (launch/request.h), not from the environment.
#pragma once

#include "memgate/backend/device.h"
#include "memgate/estimate/cuda_reduce.h"
#include "memgate/estimate/meta_kernels.h"

#include <string>
#include <utility>

namespace memgate {

/// What an estimate speaks for: the CPU and the kernels it runs, or CUDA and the GPU's properties.
struct EstimateContext {
  EstimateTarget target = EstimateTarget::kCpu;    ///< the device an estimate is for
  CpuKernels cpu_kernels = CpuKernels::kPortable;  ///< for the CPU: LibTorch's own kernels, or the host's
  CudaReduceDevice gpu;                            ///< for CUDA: the GPU's SMs and threads per SM (default: an H100's)
  /// For CUDA: cuDNN's device properties (a GPU fixture's `cudnn_device` JSON); empty: MEMGATE_ESTIMATE_GPU_CUDNN,
  /// else an H200's (estimated_cudnn_device_json).
  std::string cudnn_device_json;
  friend bool operator==(const EstimateContext&, const EstimateContext&) = default;
};

namespace detail {
/// This thread's context: the innermost EstimateContextGuard's, else nullptr (the defaults).
inline const EstimateContext*& estimate_context_slot() {
  thread_local const EstimateContext* current = nullptr;
  return current;
}
}  // namespace detail

/// The context of this thread's estimates: the innermost EstimateContextGuard's, else the defaults (the CPU's
/// portable kernels; for CUDA an H100's SMs and an H200's cuDNN properties).
[[nodiscard]] inline const EstimateContext& estimate_context() {
  static const EstimateContext defaults;
  const auto* current = detail::estimate_context_slot();
  return current != nullptr ? *current : defaults;
}

/// Sets this thread's estimate context for as long as it lives and puts the one before back after.
///
///   const memgate::EstimateContextGuard for_t4(memgate::estimate_context_for_gpu({40, 1024}));
///   auto probe = memgate::estimate_probe(fixture, 8, memgate::EstimateTarget::kCuda);  // staged as a T4 would
class EstimateContextGuard {
 public:
  explicit EstimateContextGuard(EstimateContext context)
      : context_(std::move(context)), previous_(detail::estimate_context_slot()) {
    detail::estimate_context_slot() = &context_;
  }
  ~EstimateContextGuard() { detail::estimate_context_slot() = previous_; }
  EstimateContextGuard(const EstimateContextGuard&) = delete;
  EstimateContextGuard& operator=(const EstimateContextGuard&) = delete;

 private:
  EstimateContext context_;
  const EstimateContext* previous_;
};

/// This thread's context for CUDA on a GPU of `gpu`'s SMs and threads per SM; {0, 0} (or either 0) keeps the GPU
/// of the context around it, as a target without its own figures does.
[[nodiscard]] inline EstimateContext estimate_context_for_gpu(CudaReduceDevice gpu) {
  auto context = estimate_context();
  context.target = EstimateTarget::kCuda;
  if (gpu.multiprocessors > 0 && gpu.max_threads_per_multiprocessor > 0) context.gpu = gpu;
  return context;
}

}  // namespace memgate
