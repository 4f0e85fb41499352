// Markdown summaries of memory-suite results: the verdict first, then what changed, then everything folded.
#include "memgate/report/summary.h"

#include "memgate/base/error.h"
#include "memgate/base/units.h"
#include "memgate/base/enum_names.h"
#include "memgate/base/status.h"
#include "memgate/report/svg_chart.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace memgate {
namespace {

// One results row, read strictly: a row that lacks a field or has one of the wrong type is an error naming the
// file, the line and the field.
struct Row {
  std::string device;
  std::string fixture;
  std::int64_t batch_size = 0;
  std::string component;
  Status status = Status::kOk;
  std::optional<std::int64_t> baseline;
  std::optional<std::int64_t> measured;
  std::vector<ModuleChange> modules;  ///< the modules that changed most, where the verdict named them
};

std::string where(const std::string& path, int line) { return fmt::format("{}:{}", path, line); }

std::string need_string(const nlohmann::json& row, const std::string& at, const char* key) {
  if (!row.contains(key) || !row[key].is_string()) throw Error(fmt::format("{}: `{}`: expected a string", at, key));
  return row[key].get<std::string>();
}

std::optional<std::int64_t> optional_int(const nlohmann::json& row, const std::string& at, const char* key) {
  if (!row.contains(key)) return std::nullopt;
  if (!row[key].is_number_integer()) throw Error(fmt::format("{}: `{}`: expected an integer", at, key));
  return row[key].get<std::int64_t>();
}

Row row_from_json(const nlohmann::json& j, const std::string& at) {
  if (!j.is_object()) throw Error(at + ": not a JSON object");
  Row r;
  r.device = need_string(j, at, "device");
  r.fixture = need_string(j, at, "fixture");
  r.component = need_string(j, at, "component");
  const auto batch = optional_int(j, at, "batch_size");
  if (!batch || *batch < 1) throw Error(at + ": `batch_size`: expected an integer >= 1");
  r.batch_size = *batch;
  const auto status = need_string(j, at, "status");
  const auto parsed = parse_enum(kStatusNames, status);
  if (!parsed) throw Error(fmt::format("{}: `status`: expected one of ok, regression, stale, missing, changed, oom, "
                                       "over-budget, got '{}'", at, status));
  r.status = *parsed;
  r.baseline = optional_int(j, at, "baseline");
  r.measured = optional_int(j, at, "measured");
  if (r.baseline.has_value() != r.measured.has_value() && r.status != Status::kOom) {
    throw Error(at + ": `baseline` and `measured`: expected both or neither");
  }
  if (j.contains("modules")) {
    if (!j["modules"].is_array()) throw Error(at + ": `modules`: expected a list of {module, baseline, measured}");
    for (const auto& m : j["modules"]) {
      const auto module_at = at + ": `modules`";
      ModuleChange change;
      change.module = need_string(m, module_at, "module");
      const auto then = optional_int(m, module_at, "baseline"), now = optional_int(m, module_at, "measured");
      if (!then || !now) throw Error(module_at + ": expected `baseline` and `measured` bytes for each module");
      change.baseline = *then;
      change.measured = *now;
      r.modules.push_back(std::move(change));
    }
  }
  return r;
}

Row parse_row(const std::string& line, const std::string& at) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception&) {
    throw Error(at + ": not a JSON object");
  }
  return row_from_json(j, at);
}

std::string status_cell(Status s) {
  switch (s) {
    case Status::kOk: return "ok";
    case Status::kRegression: return "**REGRESSION**";
    case Status::kStale: return "stale baseline";
    case Status::kMissing: return "no baseline";
    case Status::kChanged: return "**model changed**";
    case Status::kOom: return "**out of memory**";
    case Status::kOverBudget: return "**over budget**";
    case Status::kNotRepeatable: return "**not repeatable**";
  }
  return "?";
}

// One line of valid UTF-8.
std::string one_line(std::string_view text) {
  auto s = valid_utf8(text);
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\r', ' ');
  return s;
}

}  // namespace

std::string markdown_text(std::string_view text) {
  std::string out;
  for (const char c : one_line(text)) {
    if (c == '\\' || c == '|' || c == '`') out += '\\';
    out += c;
  }
  return out;
}

std::string markdown_code(std::string_view text) {
  const auto s = one_line(text);
  std::size_t longest = 0;
  for (std::size_t run = 0, i = 0; i < s.size(); ++i) {
    run = s[i] == '`' ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  std::string body;
  for (const char c : s) {
    if (c == '|') body += '\\';
    body += c;
  }
  const bool pad = !s.empty() && (s.front() == '`' || s.back() == '`');
  const std::string fence(longest + 1, '`');
  return fence + (pad ? " " : "") + body + (pad ? " " : "") + fence;
}

namespace {

// The module whose bytes changed most: "+64.0 KiB in blocks.0.attn" ("-" where none was named).
std::string module_cell(const Row& r) {
  if (r.modules.empty()) return "-";
  const auto& m = r.modules.front();
  return fmt::format("{} in {}", format_bytes_delta(m.difference()), markdown_code(m.module));
}

std::string table_row(const Row& r, bool with_fixture) {
  std::string cells = with_fixture ? fmt::format("| {} / {} ", markdown_text(r.device), markdown_text(r.fixture)) : "";
  cells += fmt::format("| {} | {} | ", r.batch_size, markdown_text(r.component));
  if (r.baseline && r.measured) {
    const auto b = *r.baseline, m = *r.measured;
    const double pct = b == 0 ? 0.0 : 100.0 * static_cast<double>(m - b) / static_cast<double>(b);
    cells += fmt::format("{} | {} | {} ({:+.2f}%) | ", format_bytes(b), format_bytes(m), format_bytes_delta(m - b), pct);
  } else {
    cells += fmt::format("{} | - | - | ", r.baseline ? format_bytes(*r.baseline) : "-");
  }
  return cells + status_cell(r.status) + (with_fixture ? " | " + module_cell(r) : std::string()) + " |\n";
}

}  // namespace

Summary summarize_results(const std::string& path) { return summarize_results(std::vector<std::string>{path}); }

namespace {

// device / fixture -> (batch, component) -> row
using Rows = std::map<std::string, std::map<std::pair<std::int64_t, std::string>, Row>>;

Summary summarize(const Rows& rows);

}  // namespace

Summary summarize_result_rows(const std::vector<nlohmann::json>& rows) {
  Rows by_fixture;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    auto r = row_from_json(rows[i], fmt::format("result {}", i + 1));
    by_fixture[r.device + " / " + r.fixture][{r.batch_size, r.component}] = std::move(r);
  }
  if (by_fixture.empty()) throw Error("no results: nothing was judged");
  return summarize(by_fixture);
}

Summary summarize_results(const std::vector<std::string>& paths) {
  // The last row of a test wins (re-runs append; a later file wins).
  Rows rows;
  for (const auto& path : paths) {
    if (std::filesystem::is_directory(path)) {
      throw Error(path + ": is a directory, expected a results file (JSON lines)");
    }
    std::ifstream in(path);
    if (!in) throw Error(path + ": cannot read (run the tests with MEMGATE_RESULTS set; the test presets set it)");
    std::string line;
    int number = 0;
    while (std::getline(in, line)) {
      ++number;
      if (line.empty()) continue;
      auto r = parse_row(line, where(path, number));
      rows[r.device + " / " + r.fixture][{r.batch_size, r.component}] = std::move(r);
    }
  }
  if (rows.empty()) {
    throw Error(fmt::format("{}: no results (did the memory suite run?)", fmt::join(paths, ", ")));
  }
  return summarize(rows);
}

namespace {

Summary summarize(const Rows& rows) {
  std::map<Status, int> counts;
  std::vector<const Row*> changed;  // every row that is not ok, or whose bytes moved within the tolerance
  std::size_t total = 0;
  for (const auto& [fixture, cases] : rows) {
    for (const auto& [key, r] : cases) {
      ++counts[r.status];
      ++total;
      if (r.status != Status::kOk || (r.baseline && r.measured && *r.baseline != *r.measured)) changed.push_back(&r);
    }
  }
  Summary s;
  // The same rule as the tests that wrote the rows (MEMGATE_STRICT=1 fails stale and missing baselines too).
  const bool strict = strict_mode();
  for (const auto& [status, n] : counts) s.failed = s.failed || (n > 0 && fails(status, strict));
  std::string md = fmt::format("## memgate memory gate: {}\n\n", s.failed ? "FAILED" : "passed");
  const auto compared = counts[Status::kOk] + counts[Status::kRegression] + counts[Status::kStale] +
                        counts[Status::kNotRepeatable];
  md += fmt::format("**{}** regressions, **{}** changed models, **{}** out of memory, {}{} stale, {} without baseline, "
                    "{} ok, of {} components in {} fixtures: **{}** compared with a baseline.\n\n",
                    counts[Status::kRegression], counts[Status::kChanged], counts[Status::kOom],
                    counts[Status::kNotRepeatable] > 0
                        ? fmt::format("**{}** not repeatable, ", counts[Status::kNotRepeatable])
                        : std::string(),
                    counts[Status::kStale], counts[Status::kMissing], counts[Status::kOk], total, rows.size(), compared);
  if (compared == 0) md += "Nothing was compared: no component had a baseline to be judged against.\n\n";
  if (changed.empty()) {
    md += "Every measured component equals its baseline to the byte.\n\n";
  } else {
    md += "### What changed\n\n| fixture | batch | component | baseline | measured | change | status | module that "
          "changed most |\n|---|---:|---|---:|---:|---:|---|---|\n";
    for (const auto* r : changed) md += table_row(*r, /*with_fixture=*/true);
    md += "\n";
  }
  // Baseline against this run, per changed fixture, for the HTML view.
  std::map<std::string, bool> is_changed;
  for (const auto* r : changed) is_changed[r->device + " / " + r->fixture] = true;
  for (const auto& [fixture, cases] : rows) {
    if (!is_changed[fixture]) continue;
    const auto& any = cases.begin()->second;
    ProfileDocument baseline, measured;
    for (auto* d : {&baseline, &measured}) {
      d->device_slug = d->device_name = any.device;
      d->model = any.fixture;
    }
    baseline.label = "baseline";
    measured.label = "this run";
    std::map<std::int64_t, std::pair<Components, int>> base_probes, run_probes;
    for (const auto& [key, r] : cases) {
      if (!r.baseline || !r.measured) continue;
      // A budget's verdict (its component is a GPU) is a row of the tables, not a component of the probe's chart.
      if (find_component(r.component) == nullptr && !parse_rank_component(r.component)) continue;
      auto& [bc, bn] = base_probes[r.batch_size];
      auto& [mc, mn] = run_probes[r.batch_size];
      // A distributed fixture's rank components chart as the largest over ranks, as its probe's components are.
      if (const auto ranked = parse_rank_component(r.component)) {
        const auto& name = ranked->second;
        bc.set(name, std::max(bc.get(name), *r.baseline));
        mc.set(name, std::max(mc.get(name), *r.measured));
        if (ranked->first == 0) ++bn, ++mn;
        continue;
      }
      bc.set(r.component, *r.baseline), ++bn;
      mc.set(r.component, *r.measured), ++mn;
    }
    for (const auto& [batch, probe] : base_probes) {
      const auto present = std::count_if(kComponentTable.begin(), kComponentTable.end(),
                                         [&](const ComponentInfo& info) { return has_component(probe.first, info); });
      if (probe.second != static_cast<int>(present)) continue;
      baseline.probes.push_back({batch, false, "", probe.first, 0.0});
      measured.probes.push_back({batch, false, "", run_probes[batch].first, 0.0});
    }
    if (baseline.probes.empty()) continue;
    std::vector<ProfileDocument> docs{std::move(baseline), std::move(measured)};
    auto comparison = compare_documents(docs, {});
    std::vector<ComparisonSection::ModuleRow> modules;
    for (const auto& [key, r] : cases) {
      for (const auto& m : r.modules) modules.push_back({r.batch_size, r.component, m});
    }
    s.comparisons.push_back({fixture, std::move(docs), std::move(comparison), std::move(modules)});
  }
  md += fmt::format("<details><summary>All {} results</summary>\n\n", total);
  for (const auto& [fixture, cases] : rows) {
    md += fmt::format("### {}\n\n| batch | component | baseline | measured | change | status |\n"
                      "|---:|---|---:|---:|---:|---|\n", markdown_text(fixture));
    for (const auto& [key, r] : cases) md += table_row(r, /*with_fixture=*/false);
    md += "\n";
  }
  md += "</details>\n";
  s.markdown = std::move(md);
  return s;
}

}  // namespace

namespace {

// Text as XML character data or an attribute value: HTML's escaping (its five entities are XML's), without the control
// characters XML 1.0 cannot hold (all but tab, newline and carriage return).
std::string xml_escaped(std::string_view text) {
  std::string kept;
  kept.reserve(text.size());
  for (const char c : text) {
    if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n' || c == '\r') kept += c;
  }
  return escape_html(kept);
}

}  // namespace

std::string render_junit(const std::vector<nlohmann::json>& rows, const std::vector<NotJudged>& errors, bool strict) {
  struct Case {
    std::string name, status, message;
    bool failed = false, skipped = false;
  };
  std::map<std::string, std::vector<Case>> suites;  // fixture -> its cases, in the order judged
  std::size_t failures = 0, skipped = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto r = row_from_json(rows[i], fmt::format("result {}", i + 1));
    Case c{fmt::format("{}_bs{}_{}", r.fixture, r.batch_size, r.component), std::string(name_of(kStatusNames, r.status)),
           rows[i].value("message", std::string())};
    c.failed = fails(r.status, strict);
    c.skipped = !c.failed && r.status == Status::kMissing;
    failures += c.failed ? 1 : 0;
    skipped += c.skipped ? 1 : 0;
    suites[r.fixture].push_back(std::move(c));
  }
  std::string xml = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"memgate check\" tests=\"{}\" failures=\"{}\" "
      "errors=\"{}\" skipped=\"{}\">\n",
      rows.size() + errors.size(), failures, errors.size(), skipped);
  for (const auto& [fixture, cases] : suites) {
    const auto failed = std::count_if(cases.begin(), cases.end(), [](const Case& c) { return c.failed; });
    const auto skips = std::count_if(cases.begin(), cases.end(), [](const Case& c) { return c.skipped; });
    xml += fmt::format("  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"{}\">\n",
                       xml_escaped(fixture), cases.size(), failed, skips);
    for (const auto& c : cases) {
      xml += fmt::format("    <testcase classname=\"memgate.{}\" name=\"{}\"", xml_escaped(fixture), xml_escaped(c.name));
      if (c.failed) {
        xml += fmt::format(">\n      <failure type=\"{}\" message=\"{}\">{}</failure>\n    </testcase>\n", c.status,
                           xml_escaped(c.message.substr(0, c.message.find('\n'))), xml_escaped(c.message));
      } else if (c.skipped) {
        xml += fmt::format(">\n      <skipped message=\"{}\"/>\n    </testcase>\n", xml_escaped(c.message));
      } else if (!c.message.empty()) {
        xml += fmt::format(">\n      <system-out>{}: {}</system-out>\n    </testcase>\n", c.status, xml_escaped(c.message));
      } else {
        xml += "/>\n";
      }
    }
    xml += "  </testsuite>\n";
  }
  for (const auto& e : errors) {
    xml += fmt::format("  <testsuite name=\"{0}\" tests=\"1\" failures=\"0\" errors=\"1\" skipped=\"0\">\n"
                       "    <testcase classname=\"memgate.{0}\" name=\"{0}\">\n      <error type=\"not judged\" "
                       "message=\"{1}\">{2}</error>\n    </testcase>\n  </testsuite>\n",
                       xml_escaped(e.fixture), xml_escaped(e.error.substr(0, e.error.find('\n'))), xml_escaped(e.error));
  }
  return xml + "</testsuites>\n";
}

}  // namespace memgate
