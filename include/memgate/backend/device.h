// Which device a probe runs on, and the description recorded with every measurement.
#pragma once

#include "memgate/base/enum_names.h"

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace memgate {

/// Which kernels a probe on the CPU runs, and so whose bytes it measures.
enum class CpuKernels {
  /// LibTorch's own kernels (oneDNN and NNPACK off, one intra-op thread): what the model and the training step
  /// keep, with no scratch chosen for this CPU's vector units or caches. The same bytes on every CPU: `baselines/cpu`.
  kPortable,
  /// What PyTorch runs on this CPU (oneDNN's convolutions and matmuls for its ISA class, with their reorders and
  /// scratchpads): this class's real bytes, kept apart in `baselines/cpu-<isa class>`.
  kHost,
};

/// The words of CpuKernels.
inline constexpr EnumNames<CpuKernels, 2> kCpuKernelsNames{{{CpuKernels::kPortable, "portable"},
                                                            {CpuKernels::kHost, "host"}}};

/// A device and what it was measured with: the provenance of every baseline.
struct DeviceInfo {
  /// Where tensors go (`cpu` or `cuda:N`).
  c10::Device device{c10::DeviceType::CPU};
  /// Human name: the CPU model, or the CUDA device's name (`NVIDIA H100 80GB HBM3`).
  std::string name;
  /// Filesystem-safe name of the baseline folder: `cpu` (portable CPU kernels), `cpu-avx512-core-bf16` (the host's
  /// kernels, per ISA class), `nvidia-h100-80gb-hbm3`.
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
  /// The CPU ISA oneDNN dispatches to (`avx512_core_bf16`, `avx2`, ...; empty on a GPU): oneDNN's kernels, and
  /// the scratch bytes of convolutions and matmuls, differ by it, so the host kernels' bytes hold for one class.
  std::string cpu_isa;
  /// The CPU features by which ATen itself sends reduced precision to oneDNN (`avx512_bf16 avx512_fp16 amx_bf16
  /// ...`, those present; a ONEDNN_MAX_CPU_ISA cap does not reach them): the host kernels' bytes follow them too.
  std::string cpu_features;
  /// The kernels a CPU probe ran (`portable` or `host`; empty on a GPU): see CpuKernels.
  std::string cpu_kernels;
  /// CUDA_MODULE_LOADING in force (`LAZY`, as Python's torch sets it), empty on the CPU.
  std::string cuda_module_loading;
};

/// Lower-case, dashes for every run of other characters: `NVIDIA H100 80GB HBM3` -> `nvidia-h100-80gb-hbm3`.
[[nodiscard]] std::string slugify(std::string_view name);

/// Whether LibTorch sees a usable CUDA device.
[[nodiscard]] bool cuda_available();

/// Parses `auto`, `cpu`, `cuda` or `cuda:N`. `auto` is the first GPU when one is present, else the CPU.
/// Throws memgate::Error for anything else, or for a CUDA device that is not there.
[[nodiscard]] c10::Device resolve_device(std::string_view spec);

/// The CUDA environment a PyTorch user's process has, set in this process before its first CUDA call (memgate's
/// measure library does it while the program starts; calling it again does nothing): CUDA_MODULE_LOADING=LAZY
/// (Python's torch sets it; eager loading takes several hundred MB more outside the allocator) and
/// CUDA_DEVICE_ORDER=PCI_BUS_ID (device ordinals in nvidia-smi's order, the ids CTest's resource spec names).
/// A value the user set already is kept. Returns true (it initializes a static).
bool prepare_cuda_environment();

/// The CUDA device ordinal of the GPU CTest assigned to a test.
/// - `ctest_resource`: CTEST_RESOURCE_GROUP_0_GPUS ("id:2,slots:1"; empty: no assignment). Ids are nvidia-smi
///   indices (PCI bus order, see prepare_cuda_environment).
/// - `visible`: CUDA_VISIBLE_DEVICES ("" or unset: every GPU; "2,3": GPU 2 is ordinal 0).
/// - `device_count`: the devices CUDA sees in this process.
/// Without an assignment, the only GPU; several GPUs and no assignment is an error (a test would measure on a GPU
/// another test may hold). Throws memgate::Error naming the variable and what was expected.
[[nodiscard]] c10::DeviceIndex assigned_gpu(std::string_view ctest_resource, std::string_view visible,
                                            int device_count);

/// assigned_gpu() with this process's environment and LibTorch's device count: the GPU a memory test measures on.
[[nodiscard]] c10::Device gpu_for_test();

/// The CUDA device ordinals of the GPUs CTest assigned to a distributed test of `ranks` ranks, rank r's first: the
/// GPU of resource group r (`ctest_resources[r]`, CTEST_RESOURCE_GROUP_<r>_GPUS, read as assigned_gpu reads group
/// 0's), for a test registered with RESOURCE_GROUPS <ranks>,gpus:1. Without an assignment (empty), ordinals 0 to
/// ranks-1 where the process sees exactly `ranks` GPUs. Two ranks on one GPU, a count of groups other than `ranks`,
/// or too few GPUs are errors naming the variable and what was expected.
[[nodiscard]] std::vector<c10::DeviceIndex> assigned_gpus(const std::vector<std::string>& ctest_resources,
                                                          std::string_view visible, int device_count, int ranks);

/// assigned_gpus() with this process's environment (CTEST_RESOURCE_GROUP_COUNT and each group's GPUS) and
/// LibTorch's device count: the GPUs a distributed memory test's ranks measure on.
[[nodiscard]] std::vector<c10::DeviceIndex> gpus_for_test(int ranks);

/// `ranks` GPUs from ordinal `first` on, one per rank (`memgate profile --device cuda:K` of a distributed fixture);
/// an error that says how many GPUs the ranks need where the process sees fewer.
[[nodiscard]] std::vector<c10::DeviceIndex> consecutive_gpus(c10::DeviceIndex first, int ranks, int device_count);

/// The allocator settings a probe runs with, as PyTorch reads them: the process's PYTORCH_ALLOC_CONF (or the
/// older PYTORCH_CUDA_ALLOC_CONF) with the fixture's `allocator` settings on top, key by key
/// (`expandable_segments:True,max_split_size_mb:128`). Throws memgate::Error for an entry that is not `key:value`.
[[nodiscard]] std::string merge_allocator_settings(std::string_view environment, std::string_view fixture);

/// PYTORCH_ALLOC_CONF, else PYTORCH_CUDA_ALLOC_CONF, else empty.
[[nodiscard]] std::string allocator_settings_from_environment();

/// oneDNN's CPU ISA class from /proc/cpuinfo's `flags` and a DNNL_MAX_CPU_ISA / ONEDNN_MAX_CPU_ISA cap (empty: none),
/// in oneDNN's names: sse41, avx, avx2, avx2_vnni, avx512_core, avx512_core_vnni, avx512_core_bf16,
/// avx512_core_fp16, avx512_core_amx. Empty when the flags name none of them (not x86).
[[nodiscard]] std::string onednn_cpu_isa(std::string_view flags, std::string_view cap);

/// Sets what `kernels` makes of a CPU description: the kernels' name, and the baseline folder (`cpu` for the
/// portable kernels, whose bytes hold on every CPU; `cpu-<ISA class>` for the host's, e.g. `cpu-avx512-core-bf16`,
/// `cpu-aarch64` where the CPU is not x86).
void set_cpu_kernels(DeviceInfo& info, CpuKernels kernels);

/// The features in /proc/cpuinfo's `flags` by which ATen sends bf16 / fp16 work to oneDNN and its ukernels
/// (avx512_bf16, avx512_fp16, avx_ne_convert, amx_bf16, amx_fp16), those present, space-separated.
[[nodiscard]] std::string reduced_precision_cpu_features(std::string_view flags);

/// A CUDA device's total memory in bytes (what describe_device reports, without the versions and the driver
/// query); 0 on the CPU or where the CUDA runtime is not available.
[[nodiscard]] std::int64_t device_total_memory(c10::Device device);

/// Describes a device: name, slug and versions.
[[nodiscard]] DeviceInfo describe_device(c10::Device device);

}  // namespace memgate
