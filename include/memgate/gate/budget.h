// Target GPUs (fixtures/gpus/*.yaml) and budgets: does a fixture at a batch size fit a GPU with headroom?
#pragma once

#include "memgate/measure/probe.h"

#include <cstdint>
#include <optional>
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
  /// usable_fraction x memory.
  [[nodiscard]] std::int64_t usable_bytes() const;
};

/// Loads one GPU fixture; bad input throws memgate::Error with file, key and line.
[[nodiscard]] GpuSpec load_gpu(const std::string& path);
/// Loads every *.yaml under `dir`, sorted by memory then id.
[[nodiscard]] std::vector<GpuSpec> load_gpus(const std::string& dir);
/// The GPU with this id from `gpus`; throws memgate::Error naming the known ids.
[[nodiscard]] const GpuSpec& find_gpu(const std::vector<GpuSpec>& gpus, const std::string& id);

/// The arithmetic of a budget: required = step_peak_reserved + outside_allocator; fits when required <= usable.
struct BudgetCheck {
  std::int64_t required = 0;   ///< bytes the step needs on the GPU
  std::int64_t available = 0;  ///< usable bytes of the GPU
  [[nodiscard]] bool fits() const { return required <= available; }
  /// available - required (negative when over budget).
  [[nodiscard]] std::int64_t headroom() const { return available - required; }
};

[[nodiscard]] BudgetCheck check_budget(std::int64_t step_peak_reserved, const GpuSpec& gpu);

/// The largest measured batch size of `profile` whose step fits `gpu`, if any.
[[nodiscard]] std::optional<std::int64_t> largest_fitting_batch(const Profile& profile, const GpuSpec& gpu);

}  // namespace memgate
