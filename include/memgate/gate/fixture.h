// Model fixtures: a YAML file naming an architecture, a training setup and the batch sizes to probe.
#pragma once

#include "memgate/measure/train_step.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace memgate {

/// The gate's tolerance: a measurement fails when it exceeds baseline + max(relative x baseline, absolute).
struct Tolerance {
  double relative = 0.01;                    ///< allocated components (exact allocators): 1%
  std::int64_t absolute = 64 * 1024;         ///< and at least 64 KiB
  double reserved_relative = 0.05;           ///< step_peak_reserved (caching allocator segments): 5%
  std::int64_t reserved_absolute = 32 << 20; ///< and at least 32 MiB
};

/// One model fixture, loaded from fixtures/models/<name>.yaml.
/// Its workload's `name` is `name:` or the file's stem, its `source` the file.
struct Fixture : Workload {
  std::string path;  ///< the file it came from
  std::vector<std::int64_t> batch_sizes;
  Tolerance tolerance;
  /// The model and training sections as read (defaults filled in), keys sorted.
  nlohmann::json canonical;
  /// Content hash of `canonical` ("fnv1a64:<16 hex>"): baselines recorded for another hash are stale.
  std::string hash;
};

/// Loads and validates a fixture. Throws memgate::Error naming the file, the key, the line and what was
/// expected for an unknown key, a missing required key, a wrong type or a value out of range.
[[nodiscard]] Fixture load_fixture(const std::string& path);

/// 64-bit FNV-1a of `text`, as "fnv1a64:<16 hex digits>".
[[nodiscard]] std::string content_hash(const std::string& text);

}  // namespace memgate
