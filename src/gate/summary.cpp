// Markdown summaries of memory-suite results.
#include "memgate/gate/summary.h"

#include "memgate/base/error.h"
#include "memgate/gate/report.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

namespace memgate {

Summary summarize_results(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot read (run the tests with MEMGATE_RESULTS set; the test presets set it)");
  // fixture -> (batch, component) -> row; the last row of a test wins (re-runs append).
  std::map<std::string, std::map<std::pair<std::int64_t, std::string>, nlohmann::json>> rows;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    nlohmann::json row;
    try {
      row = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error&) {
      throw Error(path + ":" + std::to_string(number) + ": not a JSON object");
    }
    rows[row.value("device", "?") + " / " + row.value("fixture", "?")]
        [{row.value("batch_size", std::int64_t{0}), row.value("component", "")}] = row;
  }
  Summary s;
  std::ostringstream md;
  md << "## memgate memory gate\n\n";
  int regressions = 0, stale = 0, changed = 0, missing = 0;
  for (const auto& [fixture, cases] : rows) {
    md << "### " << fixture << "\n\n| batch | component | baseline | measured | change | status |\n"
       << "|---:|---|---:|---:|---:|---|\n";
    for (const auto& [key, row] : cases) {
      const auto status = row.value("status", "");
      md << "| " << key.first << " | " << key.second << " | ";
      if (row.contains("baseline")) {
        const auto b = row["baseline"].get<std::int64_t>(), m = row["measured"].get<std::int64_t>();
        char pct[32];
        std::snprintf(pct, sizeof pct, "%+.2f%%", b == 0 ? 0.0 : 100.0 * static_cast<double>(m - b) / static_cast<double>(b));
        md << format_mib(b) << " | " << format_mib(m) << " | " << (m >= b ? "+" : "-") << format_mib(m >= b ? m - b : b - m)
           << " (" << pct << ") | ";
      } else {
        md << "- | - | - | ";
      }
      const char* icon = status == "ok" ? "ok" : status == "regression" ? "**REGRESSION**" : status == "stale" ? "stale baseline"
                       : status == "changed" ? "**model changed**" : status == "oom" ? "**out of memory**" : "no baseline";
      md << icon << " |\n";
      regressions += status == "regression" || status == "oom";
      changed += status == "changed";
      stale += status == "stale";
      missing += status == "missing";
    }
    md << "\n";
  }
  md << "**" << regressions << "** regressions, **" << changed << "** changed models, " << stale << " stale, " << missing
     << " without baseline.\n";
  s.failed = regressions + changed > 0;
  s.markdown = md.str();
  return s;
}

}  // namespace memgate
