// The file one measuring test of the memory suite leaves for the component tests that require it: every verdict of
// one fixture on one device (or why it was not measured). Written whole or not at all; read strictly.
#pragma once

#include "memgate/base/status.h"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace memgate {

struct VerdictFile {
  std::string suite{};                      ///< the suite file's name: cpu, gpu
  std::string fixture{};                    ///< the fixture's name
  std::string device{};                     ///< the device slug the probes ran on (empty when skipped)
  std::optional<std::string> skipped{};     ///< why nothing was measured (no GPU here): its tests skip with it
  std::optional<std::string> error{};       ///< why the fixture could not be judged: its tests fail with it
  std::vector<ComponentVerdict> components{};  ///< one per batch size x component
  std::vector<ComponentVerdict> budgets{};     ///< one per budget of this fixture (component: the GPU)

  /// The verdict of `component` at `batch_size`, or nullptr.
  [[nodiscard]] const ComponentVerdict* find(std::int64_t batch_size, std::string_view component) const;
  /// The budget verdict for `gpu` at `batch_size`, or nullptr.
  [[nodiscard]] const ComponentVerdict* find_budget(std::int64_t batch_size, std::string_view gpu) const;
};

/// Writes `file` as JSON to `path` (through a temporary file and a rename).
void write_verdict_file(const std::string& path, const VerdictFile& file);

/// Reads a verdict file; throws memgate::Error naming the path and what is wrong (absent, not JSON, a field).
[[nodiscard]] VerdictFile read_verdict_file(const std::string& path);

}  // namespace memgate
