// memgate's command-line tool: the subcommands (one file each) registered on one CLI11 app, and its exit codes.
#include "cli.h"

#include "memgate/base/error.h"
#include "memgate/gate/rank.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace memgate::cli {
namespace {

const Subcommand kSubcommands[] = {
    {"profile", "Measure one fixture's memory per component and batch size", add_profile},
    {"estimate", "Every component without a GPU: the protocol run on the Meta device", add_estimate},
    {"advise", "The largest batch that fits each GPU (or a capacity), predicted and confirmed", add_advise},
    {"check", "Run the gate for fixtures or a suite outside CTest; exit 1 when it fails", add_check},
    {"summary", "Markdown tables of the memory suite's results; exit 1 on a regression", add_summary},
    {"report", "An HTML report with plots from profile or advice JSON files", add_report},
    {"compare", "Profiles side by side: every component, the differences, batch per GPU", add_compare},
    {"replay", "Replay a real GPU's memory snapshot through the allocator's model; what-if settings and sizes",
     add_replay},
    {"bench-compare", "Compare two memgate_bench runs: step time and peak memory; exit 1 when worse",
     add_bench_compare},
    {"bench-merge", "Pool several memgate_bench runs of one build into one file", add_bench_merge},
    {"bench-convert", "Peak memory of a memgate_bench run for github-action-benchmark", add_bench_convert},
};

}  // namespace
}  // namespace memgate::cli

using memgate::cli::kError;
using memgate::cli::kExitCodes;
using memgate::cli::kSubcommands;
using memgate::cli::kUsageError;
using memgate::cli::Run;

int main(int argc, char** argv) {
  if (memgate::is_rank_command(argc, argv)) return memgate::rank_main(argc, argv);
  CLI::App app{"memgate: memory regression tests for deep-learning training on LibTorch", "memgate"};
  app.set_version_flag("--version", std::string("memgate ") + MEMGATE_VERSION);
  app.require_subcommand(1);
  app.footer(kExitCodes);
  std::vector<std::pair<CLI::App*, Run>> runs;
  for (const auto& s : kSubcommands) {
    auto* sub = app.add_subcommand(s.name, s.description);
    runs.emplace_back(sub, s.add(*sub));
  }
  if (argc < 2) {
    fmt::print(stderr, "{}", app.help());
    return kUsageError;
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);  // --help, --version
    const auto parsed = app.get_subcommands();
    std::string message = e.what();
    // CLI11 checks required options before unknown ones: `advise --bogus` would say "--config is required".
    // An unknown argument is the first thing to fix, so say that.
    if (const auto extra = app.remaining(/*recurse=*/true);
        !extra.empty() && dynamic_cast<const CLI::RequiredError*>(&e) != nullptr && !parsed.empty()) {
      message = fmt::format("unknown argument{} {}", extra.size() > 1 ? "s" : "", fmt::join(extra, " "));
    }
    if (parsed.empty() && dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
      // CLI11 says "A subcommand is required"; name what was given instead.
      std::vector<std::string_view> names;
      for (const auto& s : kSubcommands) names.emplace_back(s.name);
      const std::string_view given = argv[1];
      message = fmt::format("{} '{}'; the subcommands are {}",
                            given.starts_with('-') ? "a subcommand must come first, not" : "unknown subcommand", given,
                            fmt::join(names, ", "));
    }
    const std::string command = parsed.empty() ? "memgate" : "memgate " + parsed.front()->get_name();
    fmt::print(stderr, "memgate: {}\nRun '{} --help' for the options.\n", message, command);
    return kUsageError;
  }

  try {
    for (const auto& [sub, run] : runs) {
      if (sub->parsed()) return run();
    }
    return kUsageError;  // unreachable: require_subcommand(1)
  } catch (const memgate::cli::UsageError& e) {
    fmt::print(stderr, "memgate: {}\n", e.what());
    return kUsageError;
  } catch (const memgate::Error& e) {
    fmt::print(stderr, "memgate: error: {}\n", e.what());
  } catch (const std::exception& e) {
    fmt::print(stderr, "memgate: unexpected error: {}\n", e.what());
  }
  return kError;
}
