// Which device a probe runs on, and the description recorded with every measurement.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace memgate {

/// A device and what it was measured with: the provenance of every baseline.
struct DeviceInfo {
  /// Where tensors go (`cpu` or `cuda:N`).
  c10::Device device{c10::DeviceType::CPU};
  /// Human name: the CPU model, or the CUDA device's name (`NVIDIA H100 80GB HBM3`).
  std::string name;
  /// Filesystem-safe name of the baseline folder: `cpu`, `nvidia-h100-80gb-hbm3`.
  std::string slug;
  /// LibTorch's version (`2.11.0`).
  std::string torch_version;
  /// CUDA runtime LibTorch was built with (`13.0`), empty on a CPU-only LibTorch.
  std::string cuda_version;
  /// cuDNN version (`9.19.0`), empty where LibTorch has none.
  std::string cudnn_version;
  /// NVIDIA driver version (`580.95.05`), empty without a GPU.
  std::string driver_version;
  /// Allocator settings in force (`PYTORCH_ALLOC_CONF` / per-fixture settings), empty by default.
  std::string allocator_settings;
  /// Device memory in bytes (the GPU's total; 0 on the CPU).
  std::int64_t total_memory = 0;
  /// Intra-op threads used on the CPU (probes pin them so bytes repeat).
  int cpu_threads = 0;
};

/// Lower-case, dashes for every run of other characters: `NVIDIA H100 80GB HBM3` -> `nvidia-h100-80gb-hbm3`.
[[nodiscard]] std::string slugify(std::string_view name);

/// Whether LibTorch sees a usable CUDA device.
[[nodiscard]] bool cuda_available();

/// Parses `auto`, `cpu`, `cuda` or `cuda:N`. `auto` is the first GPU when one is present, else the CPU.
/// Throws memgate::Error for anything else, or for a CUDA device that is not there.
[[nodiscard]] c10::Device resolve_device(std::string_view spec);

/// Describes a device: name, slug and versions.
[[nodiscard]] DeviceInfo describe_device(c10::Device device);

}  // namespace memgate
