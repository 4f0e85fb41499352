// The CPU (counting allocator) and CUDA (caching allocator device stats) memory backends.
#include "memgate/backend/memory_backend.h"

#include "memgate/backend/cpu_allocator.h"
#include "memgate/backend/meta_allocator.h"
#include "memgate/base/error.h"
#include "memgate/backend/device.h"

#include <ATen/ATen.h>
#if __has_include(<cublas_v2.h>) && __has_include(<cublasLt.h>) && __has_include(<cusparse.h>) && \
    __has_include(<cusolverDn.h>)
#include <ATen/cuda/CUDAContextLight.h>
#define MEMGATE_HAVE_CUBLAS_HEADERS 1
#else
#define MEMGATE_HAVE_CUBLAS_HEADERS 0
#endif
#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

namespace memgate {
namespace {

class CpuBackend final : public MemoryBackend {
 public:
  CpuBackend() : counter_(CountingCpuAllocator::install()) {}
  void synchronize() override {}
  MemorySnapshot snapshot() override {
    const auto current = counter_.current_bytes();
    const auto peak = counter_.peak_bytes();
    // No cache on the CPU: the allocator holds exactly what tensors hold.
    return {current, current, peak, peak};
  }
  void reset_peak() override { counter_.reset_peak(); }
  void empty_cache() override {}
  void set_memory_fraction(double) override {}
  std::int64_t create_library_workspaces() override { return 0; }
  std::int64_t outside_allocator_bytes() override { return 0; }
  void apply_allocator_settings(const std::string&) override {}
  c10::Device device() const override { return c10::Device(c10::DeviceType::CPU); }

 private:
  CountingCpuAllocator& counter_;
};

// The Meta device: nothing computed, every request counted (estimates). Allocated and reserved come from the
// caching allocator's model when an estimate for CUDA runs it (blocks as CUDA counts them), else both are what the
// requests asked for.
class MetaBackend final : public MemoryBackend {
 public:
  MetaBackend() : counter_(CountingMetaAllocator::install()) {}
  void synchronize() override {}
  MemorySnapshot snapshot() override {
    return counter_.counts();
  }
  void reset_peak() override { counter_.reset_peak(); }
  void empty_cache() override { counter_.empty_cache(); }
  void set_memory_fraction(double) override {}
  std::int64_t create_library_workspaces() override { return 0; }
  std::int64_t outside_allocator_bytes() override { return 0; }
  // The settings a CUDA probe would run with (the environment's, with the fixture's on top) shape the caching
  // allocator's model: expandable segments or not; the model has no other setting.
  void apply_allocator_settings(const std::string& settings) override {
    // merge_allocator_settings gives key:value entries joined by commas, each key once.
    const auto merged = "," + merge_allocator_settings(allocator_settings_from_environment(), settings) + ",";
    counter_.model_expandable_segments(merged.find(",expandable_segments:True,") != std::string::npos);
  }
  c10::Device device() const override { return c10::Device(c10::DeviceType::Meta); }

 private:
  CountingMetaAllocator& counter_;
};

// LibTorch sets up CUDA and its caching allocator at the first CUDA tensor (Python's torch.cuda does it at its first
// call). Until then the allocator has no devices: its stats, peak resets and memory fraction fail ("Invalid device
// argument", "Allocator not initialized for device") or crash, and cuBLAS finds no current context. So every call of
// the CUDA backend but apply_allocator_settings sets them up first: that allocates nothing, so the settings applied
// before still shape every segment.
void initialize_cuda(c10::Device device) {
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
  static std::mutex mutex;
  static std::vector<c10::DeviceIndex> with_context;
  const std::lock_guard lock(mutex);
  if (std::find(with_context.begin(), with_context.end(), device.index()) != with_context.end()) return;
  // The device's primary context made current (c10's guard leaves a device that is already current alone, and
  // makes no context for it).
  const c10::cuda::CUDAGuard guard(device);
  C10_CUDA_CHECK(cudaFree(nullptr));
  with_context.push_back(device.index());
}

class CudaBackend final : public MemoryBackend {
 public:
  explicit CudaBackend(c10::Device device) : device_(device) {}
  // Every call acts on this backend's device, whichever device is current.
  void synchronize() override {
    initialize_cuda(device_);
    const c10::cuda::CUDAGuard guard(device_);
    c10::cuda::device_synchronize();
  }
  MemorySnapshot snapshot() override {
    initialize_cuda(device_);
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
    constexpr auto kAll = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    return {stats.allocated_bytes[kAll].current, stats.reserved_bytes[kAll].current,
            stats.allocated_bytes[kAll].peak, stats.reserved_bytes[kAll].peak};
  }
  void reset_peak() override {
    initialize_cuda(device_);
    c10::cuda::CUDACachingAllocator::resetPeakStats(device_.index());
  }
  void empty_cache() override {
    synchronize();
    c10::cuda::CUDACachingAllocator::emptyCache();
  }
  std::int64_t outside_allocator_bytes() override {
    const c10::cuda::CUDAGuard guard(device_);
    synchronize();
    std::size_t free = 0, total = 0;
    C10_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return static_cast<std::int64_t>(total - free) - snapshot().reserved;
  }
  std::int64_t create_library_workspaces() override {
    initialize_cuda(device_);
    static std::mutex mutex;
    static std::map<c10::DeviceIndex, std::int64_t> created;  // bytes, measured when first created
    const std::lock_guard lock(mutex);
    const c10::cuda::CUDAGuard guard(device_);
    const auto before = snapshot().allocated;
    // On the current stream of this thread, as the probe's kernels will run.
#if MEMGATE_HAVE_CUBLAS_HEADERS
    (void)at::cuda::getCurrentCUDABlasHandle();
    (void)at::cuda::getCurrentCUDABlasLtHandle();
    (void)at::cuda::getCUDABlasLtWorkspace();
#endif
    // Small GEMMs through LibTorch, fp32 and bf16, forward and backward: without cuBLAS's headers they create this
    // thread's handles and workspaces. Backward runs on autograd's thread for this device, whose cuBLAS handles (and
    // their workspaces, 32 MiB each on Hopper) are its own: made by the first backward of the process, they were
    // counted by its first probe only (measured on an H200: step_peak 37,895,168 B for the first probe, 4,340,736 B
    // for the same probe after it).
    const at::AutoGradMode grad(true);
    for (const auto dtype : {at::kFloat, at::kBFloat16}) {
      const auto options = at::TensorOptions().dtype(dtype).device(device_);
      const auto weight = at::ones({8, 8}, options).requires_grad_(true);
      at::addmm(at::ones({8}, options), at::ones({8, 8}, options), weight).sum().backward();
    }
    synchronize();
    const auto bytes = snapshot().allocated - before;
    auto [it, inserted] = created.try_emplace(device_.index(), bytes);
    if (!inserted && bytes > 0) it->second += bytes;  // another stream or thread: its own workspaces
    return it->second;
  }
  void set_memory_fraction(double fraction) override {
    initialize_cuda(device_);
    c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction <= 0.0 ? 1.0 : fraction, device_.index());
  }
  // The settings act from the first allocation on (expandable segments shape every segment), so a process runs
  // with one set: the first probe's, applied before anything is allocated; a later probe that asks for others is
  // refused rather than measured with settings that did not take effect, or that carry into the next fixture.
  void apply_allocator_settings(const std::string& settings) override {
    static std::mutex mutex;
    static std::optional<std::string> in_force;
    const std::lock_guard lock(mutex);
    const auto merged = merge_allocator_settings(allocator_settings_from_environment(), settings);
    if (in_force) {
      if (*in_force == merged) return;
      throw Error("allocator settings '" + merged + "' cannot take effect in this process: its CUDA allocator runs " +
                  "with '" + *in_force + "' since its first allocation. Measure this fixture in a process of its " +
                  "own (the memory suite runs each GPU fixture in its own; `memgate profile` one fixture at a time)");
    }
    if (!merged.empty()) c10::CachingAllocator::setAllocatorSettings(merged);
    in_force = merged;
  }
  c10::Device device() const override { return device_; }

 private:
  c10::Device device_;
};

}  // namespace

std::unique_ptr<MemoryBackend> make_memory_backend(c10::Device device) {
  if (device.is_cpu()) return std::make_unique<CpuBackend>();
  if (device.is_cuda()) return std::make_unique<CudaBackend>(device);
  if (device.is_meta()) return std::make_unique<MetaBackend>();
  throw Error("no memory backend for device " + device.str() + ": memgate measures cpu and cuda (and estimates on meta)");
}

}  // namespace memgate
