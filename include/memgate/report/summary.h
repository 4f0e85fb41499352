// The Markdown summary of a memory-suite run, from the JSON lines its tests write to $MEMGATE_RESULTS.
#pragma once

#include "memgate/report/html_report.h"

#include <string>
#include <vector>

namespace memgate {

struct Summary {
  std::string markdown;
  bool failed = false;  ///< a status that fails the gate (fails(status, strict_mode()))
  /// Per fixture whose bytes moved or whose status is not ok: its baseline against this run, at every batch size
  /// where both have every component (render_comparisons_html draws them).
  std::vector<ComparisonSection> comparisons;
};

/// Reads the results file (one JSON object per test; the last line of a test wins) and renders, per fixture,
/// a component x batch-size table of baseline, measured and difference. Throws memgate::Error for a file that
/// cannot be read or a line that is not JSON (naming the file and the line).
[[nodiscard]] Summary summarize_results(const std::string& path);
/// The results of several runs at once (a GPU suite split across runners, one results file each), as one file
/// of their lines in this order.
[[nodiscard]] Summary summarize_results(const std::vector<std::string>& paths);

}  // namespace memgate
