// memgate check's reports from its verdicts: the screen, JSON, JUnit, Markdown and HTML.
#include "memgate/report/check_report.h"

#include "memgate/base/units.h"
#include "memgate/report/html_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>

namespace memgate {
namespace {

// A component that is not ok, as the table shows it.
struct Noted {
  std::string status;
  const ComponentVerdict* verdict = nullptr;
  bool fails = false;
  std::string message;
};

std::string test_name(const ComponentVerdict& v) { return fmt::format("{}_bs{}_{}", v.fixture, v.batch_size, v.component); }

// What is not ok, in one screen: a table, what fails first and the largest change first, at most kShown rows; the
// gate's message under the first kExplained of them (how to record, what moved), the rest folded into a count.
std::string render_noted(std::vector<Noted> noted) {
  constexpr std::size_t kShown = 15, kExplained = 3;
  std::string text;
  if (noted.empty()) return text;
  auto out = std::back_inserter(text);
  const auto pct = [](const Noted& n) {
    const auto& v = *n.verdict;
    if (!v.baseline || !v.measured || *v.baseline == 0) return 0.0;
    return 100.0 * static_cast<double>(*v.measured - *v.baseline) / static_cast<double>(*v.baseline);
  };
  std::stable_sort(noted.begin(), noted.end(), [&](const Noted& a, const Noted& b) {
    if (a.fails != b.fails) return a.fails;
    return std::abs(pct(a)) > std::abs(pct(b));
  });
  fmt::format_to(out, "{:<11} {:<40} {:>12} {:>12} {:>13} {:>9}  {}\n", "status", "test", "baseline", "now", "change",
                 "%", "module that changed most");
  for (std::size_t i = 0; i < noted.size() && i < kShown; ++i) {
    const auto& n = noted[i];
    const auto& v = *n.verdict;
    const bool bytes = v.baseline && v.measured;
    fmt::format_to(out, "{:<11} {:<40} {:>12} {:>12} {:>13} {:>9}  {}\n", n.status, test_name(v),
                   v.baseline ? format_bytes(*v.baseline) : "-", v.measured ? format_bytes(*v.measured) : "-",
                   bytes ? format_bytes_delta(*v.measured - *v.baseline) : "-",
                   bytes && *v.baseline > 0 ? fmt::format("{:+.2f}%", pct(n)) : "-",
                   v.modules.empty() ? std::string("-")
                                     : fmt::format("{} {}", format_bytes_delta(v.modules.front().difference()),
                                                   v.modules.front().module));
    if (i < kExplained) {
      std::string indented = "  " + n.message;
      for (std::size_t at = indented.find('\n'); at != std::string::npos; at = indented.find('\n', at + 3)) {
        indented.insert(at + 1, "  ");
      }
      fmt::format_to(out, "{}\n", indented);
    }
  }
  if (noted.size() > kShown) {
    fmt::format_to(out, "... and {} more not ok (every one, with its message: --json FILE or --junit FILE)\n",
                   noted.size() - kShown);
  } else if (noted.size() > kExplained) {
    fmt::format_to(out, "(the messages of the other {}: --json FILE or --junit FILE)\n", noted.size() - kExplained);
  }
  return text;
}

std::vector<nlohmann::json> result_rows(const CheckReport& report) {
  std::vector<nlohmann::json> rows;
  rows.reserve(report.components.size());
  for (const auto& c : report.components) rows.push_back(check_result_row(c));
  return rows;
}

std::size_t count_missing(const CheckReport& report) {
  return static_cast<std::size_t>(std::count_if(report.components.begin(), report.components.end(),
                                                [](const CheckedComponent& c) {
                                                  return c.verdict.status == Status::kMissing;
                                                }));
}

}  // namespace

std::string check_verdict(const CheckReport& report) {
  if (!report.not_judged.empty()) return "ERROR";
  const bool failed = std::any_of(report.components.begin(), report.components.end(),
                                  [](const CheckedComponent& c) { return c.fails || c.differs; });
  return failed ? "FAILED" : "passed";
}

std::string format_status_counts(const std::map<Status, int>& counts) {
  std::string line;
  for (const auto& [status, n] : counts) {
    line += fmt::format("{}{} {}", line.empty() ? "" : ", ", n, name_of(kStatusNames, status));
  }
  return line;
}

std::string format_status_counts(std::span<const ComponentVerdict> verdicts) {
  std::map<Status, int> counts;
  for (const auto& v : verdicts) ++counts[v.status];
  return format_status_counts(counts);
}

namespace {

// "N probes on D, M components compared with a baseline"
std::string probes_compared(const CheckReport& report) {
  return fmt::format("{} probes on {}, {} components compared with a baseline", report.probes, report.device,
                     report.compared);
}

// "697 ok, 1 differs, 1 fixture not judged": a component that differs (--exact) is counted as such, not by its status.
std::string counted(const CheckReport& report) {
  std::map<Status, int> counts;
  std::size_t differing = 0;
  for (const auto& c : report.components) {
    if (c.differs) ++differing;
    else ++counts[c.verdict.status];
  }
  std::string line = format_status_counts(counts);
  if (differing > 0) line += fmt::format("{}{} differs", line.empty() ? "" : ", ", differing);
  const auto errors = report.not_judged.size();
  if (errors > 0) line += fmt::format("{}{} fixture{} not judged", line.empty() ? "" : ", ", errors, errors == 1 ? "" : "s");
  return line.empty() ? "nothing to judge" : line;
}

}  // namespace

std::string check_counts(const CheckReport& report) {
  return fmt::format("{}: {}", probes_compared(report), counted(report));
}

std::string render_check_screen(const CheckReport& report) {
  std::vector<Noted> noted;
  for (const auto& c : report.components) {
    const auto& v = c.verdict;
    if (c.differs) {
      noted.push_back({"differs", &v, true,
                       fmt::format("baseline {} bytes, measured {} ({:+} bytes); --exact wants the same bytes",
                                   v.baseline.value_or(0), v.measured.value_or(0),
                                   v.measured.value_or(0) - v.baseline.value_or(0))});
      continue;
    }
    // A missing baseline is said once, below, with the command that records it.
    if (v.status == Status::kOk || v.status == Status::kMissing) continue;
    noted.push_back({std::string(name_of(kStatusNames, v.status)), &v, c.fails, v.message});
  }
  std::string text = render_noted(std::move(noted));
  text += fmt::format("memgate check: {} ({}): {}\n", check_verdict(report), probes_compared(report), counted(report));
  if (const auto missing = count_missing(report); missing > 0) {
    std::string folders;
    for (const auto& f : report.searched) folders += (folders.empty() ? "" : ", ") + f;
    text += fmt::format(
        "  {} {} no baseline (looked in {}); record {} with: {}{}\n", missing,
        missing == 1 ? "component has" : "components have", folders, missing == 1 ? "it" : "them", report.record_hint,
        report.missing_fails ? (report.strict ? std::string("; strict mode fails a missing baseline")
                                              : std::string("; under CI (CI=true) a missing baseline fails: a gate "
                                                            "that compared nothing is not a pass (MEMGATE_STRICT=0 "
                                                            "lets it pass)"))
        : report.compared == 0 ? std::string("; NOTHING WAS COMPARED: this pass checked nothing")
                               : std::string());
  }
  return text;
}

nlohmann::json check_result_row(const CheckedComponent& component) {
  const auto& v = component.verdict;
  nlohmann::json row = v;
  row["device"] = component.device;
  row["test"] = test_name(v);
  if (component.differs) row["differs"] = true;
  row["fails"] = component.fails || component.differs;
  return row;
}

std::string render_check_json(const CheckReport& report) {
  nlohmann::json doc = {{"verdict", check_verdict(report)}, {"summary", check_counts(report)},
                        {"results", result_rows(report)}, {"not_judged", nlohmann::json::array()}};
  for (const auto& e : report.not_judged) doc["not_judged"].push_back({{"fixture", e.fixture}, {"error", e.error}});
  return doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string render_check_junit(const CheckReport& report) {
  return render_junit(result_rows(report), report.not_judged, report.strict);
}

std::string render_check_markdown(const CheckReport& report) {
  const auto rows = result_rows(report);
  std::string md = rows.empty() ? std::string("## memgate memory gate\n\nNothing was judged.\n\n")
                                : summarize_result_rows(rows).markdown;
  // The summary's own verdict line gives way to the check's.
  md = fmt::format("## memgate memory gate: {}\n\n`memgate check`: {}\n{}", check_verdict(report), check_counts(report),
                   md.substr(md.find('\n') + 1));
  if (!report.not_judged.empty()) {
    md += fmt::format("\n### Not judged ({})\n\n", report.not_judged.size());
    for (const auto& e : report.not_judged) {
      md += fmt::format("- {}: {}\n", markdown_code(e.fixture), markdown_text(e.error.substr(0, e.error.find('\n'))));
    }
  }
  return md;
}

std::string render_check_html(const CheckReport& report, const std::string& generator) {
  std::vector<ComparisonSection> sections;
  if (!report.components.empty()) sections = summarize_result_rows(result_rows(report)).comparisons;
  return render_comparisons_html(
      sections, {}, {.title = "memgate check: baseline against this run, per changed fixture", .generator = generator});
}

std::string render_judged_fixture_line(std::string_view fixture, std::size_t probes, std::string_view device,
                                       std::size_t compared, std::span<const ComponentVerdict> verdicts) {
  const auto counts = format_status_counts(verdicts);
  return fmt::format("{}: {} probes measured on {}, {} components compared with a baseline{}{}\n", fixture, probes,
                     device, compared, counts.empty() ? "" : ", ", counts);
}

}  // namespace memgate
