// What `memgate check` reports of its verdicts, as text: the one screen it prints (what is not ok as a table, the
// verdict line, where a missing baseline was looked for), its JSON, JUnit XML, Markdown (what $GITHUB_STEP_SUMMARY
// gets too) and HTML. Functions of verdict data alone, free of LibTorch: the gate judges, this only writes. The pytest
// plugin reads the JSON (results[].test, status, fails, message, baseline, measured; not_judged[].error); the memory
// suite prints a judged fixture's counts with format_status_counts.
#pragma once

#include "memgate/base/status.h"
#include "memgate/report/summary.h"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace memgate {

/// One judged component of a check, with what the gate decided of it.
struct CheckedComponent {
  ComponentVerdict verdict{};
  std::string device{};  ///< the slug of the device its probe ran on (baselines/<slug>/)
  bool fails = false;    ///< it fails the gate (fails(status, strict)); a component that differs fails too
  bool differs = false;  ///< --exact: within its tolerance, but not its baseline's bytes
};

/// A check's verdicts and what its reports say around them.
struct CheckReport {
  std::vector<CheckedComponent> components{};  ///< every judged component, in the order judged
  std::vector<NotJudged> not_judged{};         ///< the fixtures that could not be judged, in order
  std::size_t probes = 0;                      ///< the probes asked for (batch sizes of the judged fixtures)
  std::string device{};                        ///< where they ran, as the run names it: cpu, cuda:0
  std::size_t compared = 0;                    ///< components compared with a baseline (compared_components)
  bool strict = false;                         ///< --strict, --exact or MEMGATE_STRICT: stale and missing fail
  bool missing_fails = false;                  ///< a missing baseline fails (missing_fails(strict): strict, or CI)
  std::set<std::string> searched{};            ///< the baseline folders a missing component was looked for in
  std::string record_hint{};                   ///< the command that records the first fixture with a missing one
};

/// The check's verdict word: "ERROR" when a fixture was not judged, else "FAILED" when a component fails, else
/// "passed".
[[nodiscard]] std::string check_verdict(const CheckReport& report);

/// The counts the verdict line, the JSON's "summary" and the Markdown carry: "83 probes on cpu, 698 components
/// compared with a baseline: 697 ok, 1 differs, 1 fixture not judged" ("nothing to judge" where there are none).
[[nodiscard]] std::string check_counts(const CheckReport& report);

/// "7 ok, 1 regression": each status that occurs, in Status's order, joined by ", " ("" for none).
[[nodiscard]] std::string format_status_counts(const std::map<Status, int>& counts);
/// The same of `verdicts`, counted.
[[nodiscard]] std::string format_status_counts(std::span<const ComponentVerdict> verdicts);

/// What `memgate check` prints once every fixture is judged: what is not ok as a table (what fails first, the largest
/// change first, at most 15 rows, the gate's message under the first 3), the verdict line ("memgate check: FAILED
/// (...)"), and for missing baselines where they were looked for and the command that records them.
[[nodiscard]] std::string render_check_screen(const CheckReport& report);

/// One component as a JSON result: the verdict's JSON (to_json), with "device", "test" (<fixture>_bs<N>_<component>,
/// the memory suite's test name), "fails", and "differs": true where it differs.
[[nodiscard]] nlohmann::json check_result_row(const CheckedComponent& component);

/// --json: {"verdict", "summary" (check_counts), "results" (a row per component), "not_judged" ([{fixture, error}])},
/// indented by 2, bytes that are not UTF-8 replaced.
[[nodiscard]] std::string render_check_json(const CheckReport& report);

/// --junit: render_junit of the results rows and the fixtures not judged.
[[nodiscard]] std::string render_check_junit(const CheckReport& report);

/// --markdown and $GITHUB_STEP_SUMMARY: the memory suite's summary of the results (as `memgate summary` writes it),
/// headed by the check's verdict and counts, then the fixtures not judged with the first line of their errors.
[[nodiscard]] std::string render_check_markdown(const CheckReport& report);

/// --html: for each fixture that changed, its baseline against this run (`memgate summary --html`'s page);
/// `generator` ("memgate 0.x") signs the footer.
[[nodiscard]] std::string render_check_html(const CheckReport& report, const std::string& generator);

/// The memory suite's line for one judged fixture: "<fixture>: N probes measured on <slug>, M components compared
/// with a baseline, 7 ok, 1 regression".
[[nodiscard]] std::string render_judged_fixture_line(std::string_view fixture, std::size_t probes,
                                                     std::string_view device, std::size_t compared,
                                                     std::span<const ComponentVerdict> verdicts);

}  // namespace memgate
