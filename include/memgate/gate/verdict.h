// The gate's policy in one place: the status of one component of one probe against its baseline, with the
// sentence that explains it. The memory suite, `memgate summary` and `memgate check` all use it.
#pragma once

#include "memgate/base/enum_names.h"
#include "memgate/gate/baseline.h"
#include "memgate/gate/fixture.h"
#include "memgate/measure/probe.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace memgate {

/// What the gate says of one component of one probe.
enum class Status {
  kOk,          ///< within its baseline's tolerance
  kRegression,  ///< grew beyond the tolerance: fails
  kStale,       ///< shrank beyond the tolerance: passes with a notice (fails in strict mode)
  kMissing,     ///< no baseline for this device or batch size: skips (fails in strict mode)
  kChanged,     ///< the fixture no longer hashes to what the baseline was recorded for: fails
  kOom,         ///< the probe ran out of memory: fails
  kOverBudget,  ///< a budget's step does not fit its GPU: fails
};

/// The words of Status, as results files and summaries spell them.
inline constexpr EnumNames<Status, 7> kStatusNames{{{Status::kOk, "ok"},
                                                   {Status::kRegression, "regression"},
                                                   {Status::kStale, "stale"},
                                                   {Status::kMissing, "missing"},
                                                   {Status::kChanged, "changed"},
                                                   {Status::kOom, "oom"},
                                                   {Status::kOverBudget, "over-budget"}}};

/// Whether a status fails the gate (`strict`: stale and missing baselines fail too).
[[nodiscard]] bool fails(Status status, bool strict);

/// One component of one probe, judged.
struct ComponentVerdict {
  Status status = Status::kOk;
  std::string fixture;
  std::int64_t batch_size = 0;
  std::string component;
  std::optional<std::int64_t> baseline;  ///< bytes, when there is a baseline
  std::optional<std::int64_t> measured;  ///< bytes, when the probe ran
  std::optional<std::int64_t> allowed;   ///< the tolerance in bytes, when compared
  std::string message;                   ///< what a failure, a notice or a skip prints
};

/// Judges `component` of `probe` (fixture at a batch size, measured on `device`) against `baseline` (nullptr:
/// none for this device; `baseline_file` names where it was looked for), with the fixture's effective tolerance
/// on that device. The message names the case, the numbers, what to do, and the provenance fields (torch, CUDA,
/// cuDNN, driver, allocator, threads, device) in which the baseline's recording differs from this run.
[[nodiscard]] ComponentVerdict evaluate_component(const Fixture& fixture, const ProbeResult& probe,
                                                  std::string_view component, const Baseline* baseline,
                                                  const std::string& baseline_file, const DeviceInfo& device);

/// The provenance fields in which a recorded probe differs from `device`: "torch 2.10.0 -> 2.11.0", ...; empty
/// when they agree.
[[nodiscard]] std::string provenance_differences(const BaselineProbe& recorded, const DeviceInfo& device);

}  // namespace memgate
