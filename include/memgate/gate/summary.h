// The Markdown summary of a memory-suite run, from the JSON lines its tests write to $MEMGATE_RESULTS.
#pragma once

#include <string>

namespace memgate {

struct Summary {
  std::string markdown;
  bool failed = false;  ///< a status that fails the gate (fails(status, strict_mode()))
};

/// Reads the results file (one JSON object per test; the last line of a test wins) and renders, per fixture,
/// a component x batch-size table of baseline, measured and difference. Throws memgate::Error for a file that
/// cannot be read or a line that is not JSON (naming the file and the line).
[[nodiscard]] Summary summarize_results(const std::string& path);

}  // namespace memgate
