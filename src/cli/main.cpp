// memgate's command-line tool: profile a fixture; more subcommands below.
#include "memgate/bench/bench_compare.h"
#include "memgate/gate/budget.h"
#include "memgate/measure/cpu_allocator.h"
#include "memgate/measure/device.h"
#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/gate/fixture.h"
#include "memgate/measure/probe.h"
#include "memgate/gate/report.h"
#include "memgate/gate/summary.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr const char* kUsage = R"(usage: memgate <command> [options]

commands:
  profile --config <model.yaml> [--batch-sizes 1,8,32] [--device auto|cpu|cuda[:N]] [--output <file.json>]
          [--gpus <dir>] [--cpu-memory-limit-mib N]
      Measures each component of a training step at each batch size and prints the report; --output also
      writes it as JSON. An out-of-memory at one batch size is reported and the next batch sizes still run.

  summary --results <memgate-results.jsonl> [--output <summary.md>]
      Turns the memory suite's results into a Markdown table per fixture (component x batch size: baseline,
      measured, difference); appends it to $GITHUB_STEP_SUMMARY when that is set. Exits 1 when any
      component regressed, changed or ran out of memory.

  bench-compare <old.json> <new.json> [--threshold-pct 5] [--floor-sigmas 5] [--no-normalize] [--no-noise-floor]
      Compares two memgate_bench runs (Google Benchmark JSON, e.g. build/cpu/bench.json of `ctest --preset
      bench`) case by case: mean step time +- its standard deviation across repetitions, the change in %,
      and the peak allocated memory. Where both runs measured the machine (BM_Reference/cpu, /gpu: fixed
      LibTorch work), the new times are first divided by how much slower that reference got ("machine"
      column; --no-normalize compares raw times). Time is "slower"/"faster" only when the means differ by
      more than the threshold, AND by more than the between-run noise floor (--floor-sigmas x the robust
      spread of the changes of all cases on that machine, from 8 cases on; --no-noise-floor drops it), AND by more than
      3 standard errors of the difference of the means (from the repetitions' spread, and the
      reference's); else "same". Memory is deterministic:
      "grew"/"shrank" beyond 0.5%. Cases in one file only are listed as added/removed. Exits 1 when a case
      got slower or its memory grew.

  bench-merge <a.json> <b.json> [...] --output <merged.json>
      Pools several runs of one build (Google Benchmark JSON of memgate_bench) into one file, every
      repetition kept: compare pooled runs when one run each is too noisy to decide on time (a case slowed
      down for a whole run by another tenant of a shared runner).

  bench-convert <bench.json> --output <file.json>
      Writes the peak memory of each case in github-action-benchmark's customSmallerIsBetter format
      ([{"name": "<case> peak_allocated", "unit": "MiB", "value": ...}]); the time JSON itself goes to
      github-action-benchmark unchanged, with `tool: googlecpp`.

  help
      Prints this message.
)";

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "--flag value" pairs after the subcommand; every flag must be known and have a value.
std::map<std::string, std::string> parse_flags(int argc, char** argv, int first,
                                               const std::vector<std::string>& known,
                                               const std::vector<std::string>& switches = {}) {
  std::map<std::string, std::string> flags;
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool has_value = false;
    if (auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    if (std::find(switches.begin(), switches.end(), arg) != switches.end()) {
      if (has_value) throw UsageError("option " + arg + " takes no value");
      flags[arg] = "";
      continue;
    }
    if (std::find(known.begin(), known.end(), arg) == known.end()) {
      throw UsageError("unknown option '" + arg + "'");
    }
    if (!has_value) {
      if (i + 1 >= argc) throw UsageError("option " + arg + " needs a value");
      value = argv[++i];
    }
    flags[arg] = value;
  }
  return flags;
}

std::vector<std::int64_t> parse_batch_sizes(const std::string& text) {
  std::vector<std::int64_t> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    auto comma = text.find(',', start);
    auto item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    std::int64_t v = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || v < 1) {
      throw UsageError("--batch-sizes: expected positive integers separated by commas (e.g. 1,8,32), got '" +
                       text + "'");
    }
    out.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string default_gpus_dir() {
  if (const char* src = std::getenv("MEMGATE_SOURCE_DIR")) return std::string(src) + "/fixtures/gpus";
  return std::string(MEMGATE_SOURCE_DIR) + "/fixtures/gpus";
}

int run_profile_command(int argc, char** argv) {
  auto flags = parse_flags(argc, argv, 2,
                           {"--config", "--batch-sizes", "--device", "--output", "--gpus", "--cpu-memory-limit-mib"});
  if (!flags.count("--config")) throw UsageError("profile needs --config <model.yaml>");
  const auto fixture = memgate::load_fixture(flags["--config"]);
  const auto batch_sizes = flags.count("--batch-sizes") ? parse_batch_sizes(flags["--batch-sizes"]) : fixture.batch_sizes;
  const auto device = memgate::resolve_device(flags.count("--device") ? flags["--device"] : "auto");
  std::vector<memgate::GpuSpec> gpus;
  const auto gpus_dir = flags.count("--gpus") ? flags["--gpus"] : default_gpus_dir();
  if (std::filesystem::is_directory(gpus_dir)) gpus = memgate::load_gpus(gpus_dir);
  if (flags.count("--cpu-memory-limit-mib")) {
    std::int64_t mib = 0;
    const auto& text = flags["--cpu-memory-limit-mib"];
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), mib);
    if (ec != std::errc() || end != text.data() + text.size() || mib < 1) {
      throw UsageError("--cpu-memory-limit-mib: expected a positive integer, got '" + text + "'");
    }
    memgate::CountingCpuAllocator::install().set_limit(mib << 20);
  }
  const auto profile = memgate::run_profile(fixture, batch_sizes, device);
  std::cout << memgate::format_profile(profile, gpus);
  if (flags.count("--output")) {
    memgate::write_file_atomically(flags["--output"], memgate::profile_to_json(profile).dump(2) + "\n");
    std::cout << "\nwrote " << flags["--output"] << "\n";
  }
  return 0;
}

int run_summary_command(int argc, char** argv) {
  auto flags = parse_flags(argc, argv, 2, {"--results", "--output"});
  if (!flags.count("--results")) throw UsageError("summary needs --results <memgate-results.jsonl>");
  const auto summary = memgate::summarize_results(flags["--results"]);
  std::cout << summary.markdown;
  if (flags.count("--output")) memgate::write_file_atomically(flags["--output"], summary.markdown);
  if (const char* step = std::getenv("GITHUB_STEP_SUMMARY"); step != nullptr && *step != '\0') {
    std::ofstream(step, std::ios::app) << summary.markdown;
  }
  return summary.failed ? 1 : 0;
}

// Positional arguments and "--flag value" pairs after the subcommand, in any order.
std::vector<std::string> split_positionals(int argc, char** argv, int first, std::vector<std::string>& rest,
                                           const std::vector<std::string>& switches = {}) {
  std::vector<std::string> positionals;
  for (int i = first; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--", 0) == 0) {
      rest.push_back(arg);
      const bool is_switch = std::find(switches.begin(), switches.end(), arg) != switches.end();
      if (!is_switch && arg.find('=') == std::string::npos && i + 1 < argc) rest.emplace_back(argv[++i]);
    } else {
      positionals.push_back(arg);
    }
  }
  return positionals;
}

std::map<std::string, std::string> parse_rest(const std::vector<std::string>& rest,
                                              const std::vector<std::string>& known,
                                              const std::vector<std::string>& switches = {}) {
  std::vector<char*> args{nullptr};
  for (const auto& a : rest) args.push_back(const_cast<char*>(a.c_str()));
  return parse_flags(static_cast<int>(args.size()), args.data(), 1, known, switches);
}

int run_bench_compare_command(int argc, char** argv) {
  std::vector<std::string> rest;
  const std::vector<std::string> switches{"--no-normalize", "--no-noise-floor"};
  const auto files = split_positionals(argc, argv, 2, rest, switches);
  auto flags = parse_rest(rest, {"--threshold-pct", "--floor-sigmas"}, switches);
  if (files.size() != 2) throw UsageError("bench-compare needs <old.json> <new.json>");
  memgate::CompareOptions options;
  for (const auto& [flag, target] : {std::pair{"--threshold-pct", &options.threshold_pct},
                                     std::pair{"--floor-sigmas", &options.noise_floor_sigmas}}) {
    if (!flags.count(flag)) continue;
    const auto& text = flags[flag];
    std::size_t used = 0;
    double value = -1.0;
    try {
      value = std::stod(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != text.size() || value < 0.0) {
      throw UsageError(std::string(flag) + ": expected a number >= 0, got '" + text + "'");
    }
    *target = value;
  }
  options.normalize = flags.count("--no-normalize") == 0;
  options.noise_floor = flags.count("--no-noise-floor") == 0;
  const auto comparison =
      memgate::compare_bench(memgate::load_bench_json(files[0]), memgate::load_bench_json(files[1]), options);
  std::cout << comparison.text;
  return comparison.regressed ? 1 : 0;
}

int run_bench_merge_command(int argc, char** argv) {
  std::vector<std::string> rest;
  const auto files = split_positionals(argc, argv, 2, rest);
  auto flags = parse_rest(rest, {"--output"});
  if (files.size() < 2 || !flags.count("--output")) {
    throw UsageError("bench-merge needs <a.json> <b.json> [...] --output <merged.json>");
  }
  std::vector<nlohmann::json> docs;
  for (const auto& f : files) docs.push_back(memgate::read_bench_document(f));
  const auto merged = memgate::merge_bench_json(docs, flags["--output"]);
  memgate::write_file_atomically(flags["--output"], merged.dump(2) + "\n");
  std::cout << "merged " << files.size() << " runs into " << flags["--output"] << "\n";
  return 0;
}

int run_bench_convert_command(int argc, char** argv) {
  std::vector<std::string> rest;
  const auto files = split_positionals(argc, argv, 2, rest);
  auto flags = parse_rest(rest, {"--output"});
  if (files.size() != 1 || !flags.count("--output")) {
    throw UsageError("bench-convert needs <bench.json> --output <file.json>");
  }
  const auto entries = memgate::bench_memory_to_custom(memgate::load_bench_json(files[0]));
  memgate::write_file_atomically(flags["--output"], entries.dump(2) + "\n");
  std::cout << "wrote " << entries.size() << " entries to " << flags["--output"] << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string command = argv[1];
  try {
    if (command == "profile") return run_profile_command(argc, argv);
    if (command == "summary") return run_summary_command(argc, argv);
    if (command == "bench-compare") return run_bench_compare_command(argc, argv);
    if (command == "bench-convert") return run_bench_convert_command(argc, argv);
    if (command == "bench-merge") return run_bench_merge_command(argc, argv);
    if (command == "help" || command == "--help" || command == "-h") {
      std::cout << kUsage;
      return 0;
    }
    throw UsageError("unknown command '" + command + "'");
  } catch (const UsageError& e) {
    std::cerr << "memgate: " << e.what() << "\n\n" << kUsage;
    return 2;
  } catch (const memgate::Error& e) {
    std::cerr << "memgate: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "memgate: unexpected error: " << e.what() << "\n";
    return 1;
  }
}
