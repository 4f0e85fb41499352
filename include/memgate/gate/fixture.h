// Model fixtures: a YAML file naming an architecture, a training setup and the batch sizes to probe.
#pragma once

#include "memgate/measure/train_step.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace memgate {

/// The gate's tolerance: a measurement fails when it exceeds baseline + max(relative x baseline, absolute).
/// Its defaults follow what is exact (default_tolerance); a fixture's `gate:` section overrides them.
struct Tolerance {
  double relative = 0.0;              ///< allocated components
  std::int64_t absolute = 0;          ///< allocated components, bytes
  double reserved_relative = 0.0;     ///< step_peak_reserved
  std::int64_t reserved_absolute = 0; ///< step_peak_reserved, bytes
  friend bool operator==(const Tolerance&, const Tolerance&) = default;
};

/// Relative share of a baseline that allocated bytes may grow by: allocated bytes repeat to the byte (the
/// counting CPU allocator, CUDA's caching allocator with its 512-byte rounding), so the gate holds them within
/// a quarter of a percent, with no absolute floor: a 0.5% growth of any component fails at any size.
inline constexpr double kExactRelative = 0.0025;
/// What CUDA's reserved bytes may grow by: one segment of the caching allocator's large pool (20 MiB).
inline constexpr std::int64_t kCudaSegmentBytes = std::int64_t{20} << 20;

/// The default tolerance of a backend: exact allocated bytes everywhere; reserved bytes exact on the CPU (the
/// counting allocator reserves what it allocates) and within one allocator segment on CUDA.
[[nodiscard]] Tolerance default_tolerance(bool cuda);

/// A fixture's `gate:` section: the parts of the tolerance it sets.
struct ToleranceOverride {
  std::optional<double> relative;
  std::optional<std::int64_t> absolute;
  std::optional<double> reserved_relative;
  std::optional<std::int64_t> reserved_absolute;
};

/// One model fixture, loaded from fixtures/models/<name>.yaml.
/// Its workload's `name` is `name:` or the file's stem, its `source` the file.
struct Fixture : Workload {
  std::string path;  ///< the file it came from
  std::vector<std::int64_t> batch_sizes;
  ToleranceOverride tolerance;  ///< the `gate:` section
  /// The model and training sections as read (defaults filled in), keys sorted.
  nlohmann::json canonical;
  /// Content hash of `canonical` ("fnv1a64:<16 hex>"): baselines recorded for another hash are stale.
  std::string hash;
};

/// The tolerance the gate holds `fixture` to on a CPU or CUDA device: the backend's defaults with the fixture's
/// overrides.
[[nodiscard]] Tolerance effective_tolerance(const Fixture& fixture, bool cuda);

/// Loads and validates a fixture. Throws memgate::Error naming the file, the key, the line and what was
/// expected for an unknown key, a missing required key, a wrong type or a value out of range.
[[nodiscard]] Fixture load_fixture(const std::string& path);

/// Sets the kernels CPU probes of `fixture` run, over its own `training.cpu_kernels`, where a run asks for them
/// (`--cpu-kernels`, or MEMGATE_CPU_KERNELS for the memory suite): `word` is `portable` or `host`; empty leaves the
/// fixture's. Its hash stays: the kernels measure the model, they are not part of it. Throws memgate::Error naming
/// `where` for another word.
void override_cpu_kernels(Fixture& fixture, std::string_view word, std::string_view where);

/// 64-bit FNV-1a of `text`, as "fnv1a64:<16 hex digits>".
[[nodiscard]] std::string content_hash(const std::string& text);

}  // namespace memgate
