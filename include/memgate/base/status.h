// The gate's verdict words and what one judged component carries, free of LibTorch: the measuring tests write them,
// the component tests, `memgate summary` and `memgate check` read them. gate/verdict.h makes them.
#pragma once

#include "memgate/base/enum_names.h"
#include "memgate/base/module_breakdown.h"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace memgate {

/// What the gate says of one component of one probe (or of one budget).
enum class Status {
  kOk,          ///< within its baseline's tolerance
  kRegression,  ///< grew beyond the tolerance: fails
  kStale,       ///< shrank beyond the tolerance: passes with a notice (fails in strict mode)
  kMissing,     ///< no baseline for this device or batch size: skips (fails in strict mode)
  kChanged,     ///< the fixture no longer hashes to what the baseline was recorded for: fails
  kOom,         ///< the probe ran out of memory: fails
  kOverBudget,  ///< a budget's step does not fit its GPU: fails
  kNotRepeatable,  ///< measured twice, the component's bytes differed: fails (neither number can be gated on)
};

/// The words of Status, as results files and summaries spell them.
inline constexpr EnumNames<Status, 8> kStatusNames{{{Status::kOk, "ok"},
                                                   {Status::kRegression, "regression"},
                                                   {Status::kStale, "stale"},
                                                   {Status::kMissing, "missing"},
                                                   {Status::kChanged, "changed"},
                                                   {Status::kOom, "oom"},
                                                   {Status::kOverBudget, "over-budget"},
                                                   {Status::kNotRepeatable, "not-repeatable"}}};

/// Whether a status fails the gate (`strict`: stale and missing baselines fail too; a missing one also fails under
/// CI, see missing_fails).
[[nodiscard]] bool fails(Status status, bool strict);

/// An on/off environment variable (MEMGATE_STRICT, MEMGATE_UPDATE_BASELINES): 1, true, yes or on is on; 0, false, no
/// or off is off (any case); unset or empty is nothing (the default). Any other value throws memgate::Error naming
/// the variable, its value and the words accepted (a typo must not silently leave the gate lenient).
[[nodiscard]] std::optional<bool> env_switch(const char* variable);

/// Reads MEMGATE_STRICT and MEMGATE_UPDATE_BASELINES as env_switch does: throws for a value that is neither on nor
/// off. The CLI and the memory suite's programs call it first, so that such a value is said once, before any work.
void check_env_switches();

/// MEMGATE_STRICT on (env_switch): stale and missing baselines fail too.
[[nodiscard]] bool strict_mode();

/// Whether this runs under CI: CI set to 1, true, yes or on (any case), as GitHub Actions, GitLab CI, Buildkite,
/// CircleCI and Travis set it; any other value (Woodpecker's CI=woodpecker) is not read as CI.
[[nodiscard]] bool ci_environment();

/// Whether a missing baseline fails: in strict mode, and under CI (a gate that compared nothing is not a pass there)
/// unless MEMGATE_STRICT=0 says otherwise.
[[nodiscard]] bool missing_fails(bool strict);

/// MEMGATE_UPDATE_BASELINES on (env_switch): the memory suite records baselines instead of judging them.
[[nodiscard]] bool update_mode();

/// One component of one probe, judged. For a budget, `component` is the GPU's name, `baseline` the bytes it has
/// usable and `measured` the bytes the step needs.
struct ComponentVerdict {
  Status status = Status::kOk;
  std::string fixture;
  std::int64_t batch_size = 0;
  std::string component;
  std::optional<std::int64_t> baseline;  ///< bytes, when there is a baseline
  std::optional<std::int64_t> measured;  ///< bytes, when the probe ran
  std::optional<std::int64_t> allowed;   ///< the tolerance in bytes, when compared
  std::string message;                   ///< what a failure, a notice or a skip prints
  /// The modules whose bytes of this component changed against the baseline, the largest change first (at most
  /// kModuleChangesKept), where the baseline and the probe both have a per-module breakdown of it; else empty.
  std::vector<ModuleChange> modules;
};

/// How many module changes a verdict keeps.
inline constexpr std::size_t kModuleChangesKept = 10;

/// JSON of a verdict: {"status", "fixture", "batch_size", "component", "message"}, the bytes that are known, and
/// "modules": [{"module", "baseline", "measured"}, ...] where modules changed.
void to_json(nlohmann::json& j, const ComponentVerdict& v);
/// Reads what to_json wrote; throws memgate::Error naming the field that is missing or of the wrong type.
void from_json(const nlohmann::json& j, ComponentVerdict& v);

}  // namespace memgate
