// Committed baselines (baselines/<device-slug>/<fixture>.json): reading, comparing, and updating in place.
#pragma once

#include "memgate/base/status.h"
#include "memgate/gate/fixture.h"
#include "memgate/measure/probe.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace memgate {

/// One recorded probe: its components and where they were measured.
struct BaselineProbe {
  std::int64_t batch_size = 0;
  Components components;
  /// A distributed fixture's ranks, each with its own components (and communication buffers); empty otherwise.
  std::vector<RankComponents> ranks;
  /// Which module holds the bytes of the components that have a breakdown (ProbeResult::modules): what names the
  /// modules that changed when a component fails. Empty where the probe had none.
  ModuleBreakdown modules;
  /// What can change the bytes, and the commit: see probe_provenance.
  nlohmann::json provenance = nlohmann::json::object();
  [[nodiscard]] std::string fixture_hash() const;
};

/// A baseline file.
struct Baseline {
  std::string path;
  std::string fixture;
  std::string device_slug;
  Tolerance tolerance;
  std::vector<BaselineProbe> probes;  ///< sorted by batch size
  [[nodiscard]] const BaselineProbe* find(std::int64_t batch_size) const;
};

/// `<root>/<slug>/<fixture>.json`.
[[nodiscard]] std::string baseline_path(const std::string& root, const std::string& slug, const std::string& fixture);

/// Reads a baseline; a corrupt file throws memgate::Error naming the file, the key and what was expected.
/// Strict: unknown keys, a batch size given twice, and (when given) a `fixture` or `device.slug` other than the
/// expected ones (the file's name and folder) are errors too.
[[nodiscard]] Baseline load_baseline(const std::string& path, const std::string& expected_fixture = {},
                                     const std::string& expected_slug = {});
/// The baseline's JSON, keys sorted, probes by batch size.
[[nodiscard]] nlohmann::json baseline_to_json(const Baseline& baseline);

/// The commit of the source tree ($MEMGATE_COMMIT, else `git rev-parse --short=12 HEAD`, "+dirty" when tracked
/// files outside baselines/ have changes: the update writing baselines/ does not make its own commit dirty), or
/// "unknown".
[[nodiscard]] std::string source_commit(const std::string& source_dir);

/// A probe's provenance: what can change its bytes, with the fixture's hash and the commit it was recorded at.
/// - CPU, portable kernels: torch, cpu_kernels, cpu_threads (the CPU's name and ISA change no byte, so they are not
///   recorded, and a runner with another CPU rewrites nothing);
/// - CPU, host kernels: the same, with the CPU's name, its oneDNN ISA class (cpu_isa) and the reduced-precision
///   features ATen reads (cpu_features);
/// - CUDA: device, torch, cuda, cudnn, driver, allocator, cuda_module_loading.
[[nodiscard]] nlohmann::json probe_provenance(const DeviceInfo& device, const std::string& fixture_hash,
                                              const std::string& commit);

/// Writes the measured probes into `path`: only those probes are replaced, every other entry is kept; the file
/// is written to a temporary file and renamed, under an exclusive lock (safe when ctest runs in parallel); a
/// probe whose components and provenance (but for the commit) did not change is left as it was, commit included,
/// so an unchanged file stays byte for byte the same, whichever runner recorded it. Returns whether the file
/// changed.
bool update_baseline(const std::string& path, const Fixture& fixture, const DeviceInfo& device,
                     const std::vector<ProbeResult>& probes, const std::string& commit);

/// The verdict of one component against its baseline.
enum class Verdict {
  kWithin,      ///< within tolerance
  kRegression,  ///< grew beyond tolerance: fails
  kStale,       ///< shrank beyond tolerance: passes with a notice (fails in strict mode)
};

/// One component of one probe, compared.
struct Comparison {
  Verdict verdict = Verdict::kWithin;
  std::string fixture;
  std::int64_t batch_size = 0;
  std::string component;
  std::int64_t baseline = 0;
  std::int64_t measured = 0;
  std::int64_t allowed = 0;  ///< max(relative x baseline, absolute)
  [[nodiscard]] std::int64_t difference() const { return measured - baseline; }
  [[nodiscard]] double percent() const;
  /// The command that records this baseline, where the message tells the user how (empty: the update-baselines
  /// preset, as inside CTest).
  std::string record_command;
  /// The sentence a failure or notice prints: case, baseline, measured, difference (MiB and %), tolerance,
  /// and what to do.
  [[nodiscard]] std::string message() const;
};


/// measured vs baseline with the fixture's tolerance (the reserved tolerance for step_peak_reserved).
[[nodiscard]] Comparison compare_component(const std::string& fixture, std::int64_t batch_size,
                                           std::string_view component, std::int64_t baseline,
                                           std::int64_t measured, const Tolerance& tolerance);


}  // namespace memgate
