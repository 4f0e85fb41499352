// Budgets against the target GPUs (memgate/spec/gpus.h): does a fixture at a batch size fit a GPU with headroom?
#pragma once

#include "memgate/measure/probe.h"
#include "memgate/spec/gpus.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace memgate {

/// The arithmetic of a budget: fits when what the step needs inside the allocator (step_peak_reserved, and what
/// the caller adds beside it) is at most the GPU's usable bytes (memory x usable_fraction - outside the allocator).
struct BudgetCheck {
  std::int64_t required = 0;   ///< bytes the step needs inside the caching allocator
  std::int64_t available = 0;  ///< GpuSpec::usable_bytes()
  [[nodiscard]] bool fits() const { return required <= available; }
  /// available - required (negative when over budget).
  [[nodiscard]] std::int64_t headroom() const { return available - required; }
};

[[nodiscard]] BudgetCheck check_budget(std::int64_t step_peak_reserved, const GpuSpec& gpu);

/// The largest measured batch size of `profile` whose step fits `gpu`, if any.
[[nodiscard]] std::optional<std::int64_t> largest_fitting_batch(const Profile& profile, const GpuSpec& gpu);

}  // namespace memgate
