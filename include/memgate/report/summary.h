// The Markdown summary of a memory-suite run, from the JSON lines its tests write to $MEMGATE_RESULTS.
#pragma once

#include "memgate/report/html_report.h"

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
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
/// The same summary of rows already in memory (`memgate check --markdown`): each an object as a results line holds
/// (device, fixture, batch_size, component, status; baseline and measured where compared).
[[nodiscard]] Summary summarize_result_rows(const std::vector<nlohmann::json>& rows);

/// `text` as plain text in a Markdown table cell or list item: valid UTF-8 (valid_utf8), on one line, and `\`, `|`
/// and backquotes escaped, so that a name like `x|y` stays in its cell.
[[nodiscard]] std::string markdown_text(std::string_view text);
/// `text` as inline code in a Markdown table cell: fenced by more backquotes than any run it holds (padded with a
/// space where it starts or ends with one), valid UTF-8, on one line, `|` escaped (GitHub's tables split on a bare
/// `|` even inside code; `\|` shows as `|`).
[[nodiscard]] std::string markdown_code(std::string_view text);

/// A fixture that could not be judged (it did not load, or its probe failed), for the reports of `memgate check`.
struct NotJudged {
  std::string fixture;  ///< its name, or its file where it did not load
  std::string error;
};

/// JUnit XML of a gate's verdicts, as CI systems read test reports: a <testsuite> per fixture, a <testcase> per batch
/// size and component (`<fixture>_bs<N>_<component>`, the memory suite's test names); a failing status
/// (fails(status, strict)) is a <failure> with the gate's message, a missing baseline that does not fail is
/// <skipped>, a fixture not judged is an <error>.
[[nodiscard]] std::string render_junit(const std::vector<nlohmann::json>& rows, const std::vector<NotJudged>& errors,
                                       bool strict);

}  // namespace memgate
