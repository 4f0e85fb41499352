// memgate summary: Markdown tables (and HTML plots) of the memory suite's results; exit 1 on a regression.
#include "cli.h"

#include "memgate/base/files.h"
#include "memgate/report/summary.h"
#include "memgate/report/html_report.h"

#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace memgate::cli {

Run add_summary(CLI::App& app) {
  struct Options {
    std::vector<std::string> results;
    std::string output;
    std::string html;
  };
  auto o = std::make_shared<Options>();
  app.add_option("--results", o->results,
                 "The memory suite's results (build/<preset>/memgate-results.jsonl); several: one report of a suite "
                 "split across runners")
      ->required()
      ->type_name("FILE ...");
  app.add_option("--output", o->output, "Also write the Markdown to this file")->type_name("FILE");
  app.add_option("--html", o->html,
                 "Also write, per changed fixture, its baseline against this run as HTML plots (memgate compare's "
                 "view); the Markdown links it")
      ->type_name("FILE");
  app.footer(footer(
      "Turns the memory suite's results into a Markdown table per fixture (component x batch size: baseline,\n"
      "measured, difference); appends it to $GITHUB_STEP_SUMMARY when that is set. Exits 1 when any component\n"
      "regressed, changed or ran out of memory."));
  return [o] {
    check_env_switches();
    std::vector<FileArg> inputs;
    for (const auto& f : o->results) inputs.push_back({"--results", f});
    refuse_colliding_files(inputs, {{"--output", o->output}, {"--html", o->html}});
    auto summary = memgate::summarize_results(o->results);
    if (!o->html.empty()) {
      write_output("--html", o->html,
                   memgate::render_comparisons_html(summary.comparisons, {},
                                                    {.title = "memgate gate: baseline against this run, per changed "
                                                              "fixture",
                                                     .generator = generator()}));
      summary.markdown += fmt::format("\nPlots of the {} changed fixture{} (baseline against this run): {}\n",
                                      summary.comparisons.size(), summary.comparisons.size() == 1 ? "" : "s",
                                      memgate::markdown_code(o->html));
    }
    fmt::print("{}", summary.markdown);
    if (!o->output.empty()) write_output("--output", o->output, summary.markdown);
    append_step_summary(summary.markdown);
    return summary.failed ? kFailed : kOk;
  };
}

}  // namespace memgate::cli
