// memgate bench-compare, bench-merge and bench-convert: memgate_bench's JSON compared, pooled and converted.
#include "cli.h"

#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/bench/bench_compare.h"

#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

namespace memgate::cli {

Run add_bench_compare(CLI::App& app) {
  struct Options {
    std::string old_json;
    std::string new_json;
    memgate::CompareOptions compare;
    bool no_normalize = false;
    bool no_noise_floor = false;
  };
  auto o = std::make_shared<Options>();
  const auto number = check_value(is_finite_non_negative, "a finite number >= 0");
  app.add_option("old.json", o->old_json, "Google Benchmark JSON of the old build")->required();
  app.add_option("new.json", o->new_json, "Google Benchmark JSON of the new build")->required();
  app.add_option("--threshold-pct", o->compare.threshold_pct, "Smallest change of the mean time that counts, in %")
      ->capture_default_str()
      ->check(number);
  app.add_option("--floor-sigmas", o->compare.noise_floor_sigmas,
                 "The between-run noise floor in robust standard deviations of all cases' changes")
      ->capture_default_str()
      ->check(number);
  app.add_flag("--no-normalize", o->no_normalize, "Compare raw times (do not divide by the machine factor)")
      ->disable_flag_override();
  app.add_flag("--no-noise-floor", o->no_noise_floor, "No between-run noise floor")->disable_flag_override();
  app.footer(footer(
      "Compares two memgate_bench runs (Google Benchmark JSON, e.g. build/cpu/bench.json of `ctest --preset\n"
      "bench`) case by case: mean step time +- its standard deviation across repetitions, the change in %, and\n"
      "the peak allocated memory. Where both runs measured the machine (BM_Reference/cpu, /gpu: fixed LibTorch\n"
      "work), the new times are first divided by how much slower that reference got (\"machine\" column;\n"
      "--no-normalize compares raw times). Time is \"slower\"/\"faster\" only when the means differ by more than\n"
      "the threshold, AND by more than the between-run noise floor (--floor-sigmas x the robust spread of the\n"
      "changes of all cases on that machine, from 8 cases on; --no-noise-floor drops it), AND by more than 3\n"
      "standard errors of the difference of the means (from the repetitions' spread, and the reference's); else\n"
      "\"same\". Memory is deterministic: \"grew\"/\"shrank\" beyond 0.5%. Cases in one file only are listed as\n"
      "added/removed. Exits 1 when a case got slower or its memory grew."));
  return [o] {
    auto options = o->compare;
    options.normalize = !o->no_normalize;
    options.noise_floor = !o->no_noise_floor;
    const auto comparison =
        memgate::compare_bench(memgate::load_bench_json(o->old_json), memgate::load_bench_json(o->new_json), options);
    fmt::print("{}", comparison.text);
    return comparison.regressed ? kFailed : kOk;
  };
}

Run add_bench_merge(CLI::App& app) {
  struct Options {
    std::vector<std::string> files;
    std::string output;
  };
  auto o = std::make_shared<Options>();
  app.add_option("runs.json", o->files, "Google Benchmark JSON files of one build, two or more")
      ->required()
      ->expected(2, -1);
  app.add_option("--output", o->output, "The merged JSON")->required()->type_name("FILE");
  app.footer(footer(
      "Pools several runs of one build (Google Benchmark JSON of memgate_bench) into one file, every repetition\n"
      "kept: compare pooled runs when one run each is too noisy to decide on time (a case slowed down for a\n"
      "whole run by another tenant of a shared runner)."));
  return [o] {
    std::vector<FileArg> inputs;
    for (const auto& f : o->files) inputs.push_back({"runs.json", f});
    refuse_colliding_files(inputs, {{"--output", o->output}});
    std::vector<nlohmann::json> docs;
    for (const auto& f : o->files) docs.push_back(memgate::read_bench_document(f));
    const auto merged = memgate::merge_bench_json(docs, o->output);
    write_output("--output", o->output, merged.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    fmt::print("merged {} runs into {}\n", o->files.size(), o->output);
    return kOk;
  };
}

Run add_bench_convert(CLI::App& app) {
  struct Options {
    std::string input;
    std::string output;
  };
  auto o = std::make_shared<Options>();
  app.add_option("bench.json", o->input, "Google Benchmark JSON of memgate_bench")->required();
  app.add_option("--output", o->output, "The customSmallerIsBetter JSON")->required()->type_name("FILE");
  app.footer(footer(
      "Writes the peak memory of each case in github-action-benchmark's customSmallerIsBetter format ([{\"name\":\n"
      "\"<case> peak_allocated\", \"unit\": \"MiB\", \"value\": ...}]); the time JSON itself goes to\n"
      "github-action-benchmark unchanged, with `tool: googlecpp`."));
  return [o] {
    refuse_colliding_files({{"bench.json", o->input}}, {{"--output", o->output}});
    const auto entries = memgate::bench_memory_to_custom(memgate::load_bench_json(o->input));
    if (entries.empty()) {
      throw memgate::Error(o->input + ": no case has a peak_allocated_bytes counter: nothing to convert");
    }
    write_output("--output", o->output, entries.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    fmt::print("wrote {} entries to {}\n", entries.size(), o->output);
    return kOk;
  };
}

}  // namespace memgate::cli
