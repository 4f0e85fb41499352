// Budget arithmetic.
#include "memgate/gate/budget.h"


#include <algorithm>

namespace memgate {

BudgetCheck check_budget(std::int64_t step_peak_reserved, const GpuSpec& gpu) {
  return {step_peak_reserved, gpu.usable_bytes()};
}

std::optional<std::int64_t> largest_fitting_batch(const Profile& profile, const GpuSpec& gpu) {
  std::optional<std::int64_t> best;
  for (const auto& p : profile.probes) {
    if (p.measured() && check_budget(p.components.step_peak_reserved, gpu).fits()) {
      best = std::max(best.value_or(0), p.batch_size);
    }
  }
  return best;
}

}  // namespace memgate
