// The GPUs that budgets and advice target (fixtures/gpus/*.yaml), and where memgate finds a project's files and its
// own. No LibTorch: the subcommands that only read files (report, compare, replay) use it too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace memgate {

/// A GPU that fixtures are budgeted against.
struct GpuSpec {
  std::string id;                      ///< the file's stem: `rtx_4090_24gb`
  std::string name;                    ///< `NVIDIA GeForce RTX 4090`
  std::string path;                    ///< the file it came from
  std::int64_t memory_bytes = 0;       ///< total memory as CUDA reports it
  double usable_fraction = 0.90;       ///< share of memory a training run may plan to use (headroom)
  std::int64_t outside_allocator_bytes = 0;  ///< CUDA context and libraries, outside the caching allocator
  /// The GPU's usable memory, the one definition every output prints (docs/design.md): memory x usable_fraction
  /// less what lives outside the caching allocator, i.e. what the allocator may hold. A step fits when what it
  /// needs inside the allocator (step_peak_reserved and the library workspaces) is at most this.
  [[nodiscard]] std::int64_t usable_bytes() const;

  /// What an estimate needs of the GPU beside its memory, each from `sources` (0 / "" where the file does not say):
  std::string compute_capability;          ///< "9.0": which cuBLAS workspace torch gives it
  int multiprocessors = 0;                 ///< its SMs
  int max_threads_per_multiprocessor = 0;  ///< threads an SM holds (CUDA's table per compute capability)
  std::string sources;                     ///< where the properties and memory_gib come from
  /// Whether memgate measured this GPU (memory_gib and outside_allocator_mib from a run on it); otherwise its
  /// figures are NVIDIA's and planning allowances, and estimates for it say so.
  bool measured = false;
  /// The GPU's properties as cuDNN's heuristics read them (a CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR's JSON, from the
  /// file's `cudnn_device`), with which an estimate asks cuDNN which plan a convolution runs and the workspace it
  /// takes; "" where the file has none.
  std::string cudnn_device_json;
  std::string cudnn_device_sources;  ///< where each of those values comes from

  /// The caching allocator's bytes that cuBLAS keeps for a training step on this GPU in torch 2.11, which an
  /// estimate adds to a step's needs as a measured probe does (its library_workspace_bytes): two cuBLAS workspaces
  /// (the forward's thread and autograd's, a handle each) of 32 MiB on compute capability 9.x and 8 MiB + 128 KiB
  /// elsewhere (CUBLAS_WORKSPACE_CONFIG's defaults, ":4096:8" and ":4096:2:16:8"), and one 1 MiB cuBLASLt workspace:
  /// 65 MiB on an H200, as measured there; 17.25 MiB on a T4. Without a compute capability, the larger.
  [[nodiscard]] std::int64_t library_workspace_bytes() const;
};

/// A GPU's usable memory as every output prints it: "12984.4 MiB" (format_mib: a budget's headroom is MiB-sized).
[[nodiscard]] std::string format_usable(std::int64_t usable_bytes);

/// Loads one GPU fixture; bad input throws memgate::Error with file, key and line.
[[nodiscard]] GpuSpec load_gpu(const std::string& path);
/// A GPU fixture's text read as load_gpu reads its file (a fixture built into memgate); `name` stands for the path.
[[nodiscard]] GpuSpec gpu_from_text(const std::string& text, const std::string& name);

/// `text` where it is the JSON object of cuDNN's device properties that CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION
/// takes (each of the 23 keys a GPU fixture's cudnn_device holds, of its type); else throws memgate::Error naming
/// `where` (a file and key, or an environment variable), what it expects and the key that is missing or bad.
[[nodiscard]] std::string checked_cudnn_device_json(const std::string& text, const std::string& where);
/// Loads every *.yaml under `dir`, sorted by memory then id.
[[nodiscard]] std::vector<GpuSpec> load_gpus(const std::string& dir);
/// The GPU with this id from `gpus`; throws memgate::Error naming the known ids.
[[nodiscard]] const GpuSpec& find_gpu(const std::vector<GpuSpec>& gpus, const std::string& id);

/// The project memgate reads fixtures and baselines from (<project>/fixtures/{models,suites,gpus},
/// <project>/baselines): $MEMGATE_PROJECT_DIR, else $MEMGATE_SOURCE_DIR (its older name), else the working folder.
/// Nothing of the machine memgate was built on is compiled in.
[[nodiscard]] std::string project_dir();

/// memgate's own data (the GPU fixtures and model fixtures it ships): $MEMGATE_DATA_DIR, else
/// <prefix>/share/memgate beside the running executable (<prefix>/bin/<exe> or <prefix>/libexec/memgate/<exe>)
/// when that exists, else "".
[[nodiscard]] std::string data_dir();

/// The GPU fixtures: <project>/fixtures/gpus when that exists, else <data_dir>/fixtures/gpus. Throws
/// memgate::Error naming where it looked when neither exists.
[[nodiscard]] std::string gpus_dir(const std::string& project);

}  // namespace memgate
