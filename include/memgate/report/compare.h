// `memgate compare`: variants of a workload side by side (RETFound Large vs Green, LoRA vs full, fp32 vs bf16),
// every component at every batch size they share, as differences from the first.
#pragma once

#include "memgate/report/profile_document.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace memgate {

struct ProfileCompareOptions {
  /// When set, the comparison fails where a later document exceeds the first in any component at a common batch
  /// size by more than this many percent.
  std::optional<double> threshold_pct;
};

/// One component at one batch size of one later document, against the first.
struct ComponentDifference {
  std::size_t document = 0;  ///< index into the documents (>= 1)
  std::int64_t batch_size = 0;
  std::string component;
  std::int64_t reference = 0;
  std::int64_t value = 0;
  [[nodiscard]] std::int64_t delta() const { return value - reference; }
  /// The change in percent of the reference; none when the reference is 0 and the value is not.
  [[nodiscard]] std::optional<double> pct() const;
};

struct ProfileComparison {
  std::vector<std::int64_t> common_batch_sizes;   ///< measured (not out of memory) in every profile
  std::vector<ComponentDifference> differences;   ///< every later document x common batch size x component
  std::vector<ComponentDifference> over_threshold;  ///< those that grew by more than the threshold
  std::optional<double> threshold_pct;
  std::string text;  ///< for a terminal
  [[nodiscard]] bool failed() const { return !over_threshold.empty(); }
};

/// Compares `documents` (two or more profiles; advice documents add their targets' batches to the GPU table) against
/// the first. Throws memgate::Error for fewer than two documents.
[[nodiscard]] ProfileComparison compare_documents(const std::vector<ProfileDocument>& documents,
                                                  const std::vector<GpuLine>& gpus,
                                                  const ProfileCompareOptions& options = {});

}  // namespace memgate
