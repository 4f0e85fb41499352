// Compares two Google Benchmark JSON files of memgate_bench (step time and peak memory per case), and converts
// one into github-action-benchmark's customSmallerIsBetter format.
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace memgate {

/// One benchmark case of one file: its repetitions ("run_type": "iteration" entries sharing a run_name).
struct BenchCase {
  std::string name;                  ///< run_name (`BM_TrainStep/fixture:vit_tiny_lora/bs:8/manual_time`)
  std::vector<double> seconds;       ///< real_time of each repetition, per iteration, in seconds
  std::optional<double> peak_bytes;  ///< max_bytes_used (the memory manager), else peak_allocated_MiB x 2^20
  std::string error;                 ///< the error message of a case that was skipped (no GPU, ...)

  [[nodiscard]] double mean() const;
  /// Sample standard deviation across repetitions (0 for fewer than two).
  [[nodiscard]] double stddev() const;
};

/// Reads a Google Benchmark JSON file (--benchmark_out_format=json) into its cases, keyed by run_name. Aggregate
/// entries (mean, median, stddev, cv) are ignored: the repetitions are re-aggregated here. Throws memgate::Error
/// naming the file for a file that cannot be read or is not a Google Benchmark JSON document.
[[nodiscard]] std::map<std::string, BenchCase> load_bench_json(const std::string& path);
/// A Google Benchmark JSON file as it is, once it has passed load_bench_json's checks (errors name the file).
[[nodiscard]] nlohmann::json read_bench_document(const std::string& path);
/// The same from an already parsed document; `origin` names it in errors.
[[nodiscard]] std::map<std::string, BenchCase> parse_bench_json(const nlohmann::json& doc, const std::string& origin);

/// Whether a case is a machine-speed reference (`BM_Reference/<device>/...`, see benchmarks/train_step_bench.cpp).
[[nodiscard]] bool is_reference_case(const std::string& name);
/// The reference that measures the machine a case ran on: `BM_Reference/gpu` for the GPU suite's cases
/// (`BM_TrainStep/gpu/...`), `BM_Reference/cpu` for the others.
[[nodiscard]] std::string reference_for(const std::string& name);

/// How much slower the new run's machine was than the old run's, from a reference case in both files.
struct MachineSpeed {
  std::string reference;      ///< BM_Reference/cpu | BM_Reference/gpu
  BenchCase old_case;
  BenchCase new_case;
  double factor = 1.0;        ///< new mean / old mean of the reference (1.08: the new machine was 8% slower)
  double factor_rel_se = 0.0; ///< the relative standard error of `factor`
};

/// How one case changed between the old and the new file.
struct CaseComparison {
  std::string name;
  std::string status;  ///< compared | added | removed | skipped (an error in either file) | reference
  BenchCase old_case;
  BenchCase new_case;
  double time_change_pct = 0.0;    ///< (new mean - old mean) / old mean x 100, as measured
  /// The change once the new times are divided by the machine factor (the time change when there is none).
  double normalized_change_pct = 0.0;
  double machine_factor = 1.0;     ///< the factor the new times were divided by (1: not normalized)
  /// noise_sigmas x the standard error of (normalized) mean_new - mean_old, in seconds: the repetitions' spread
  /// of both cases and, when normalized, of the reference.
  double noise_seconds = 0.0;
  /// The between-run noise floor of the case's machine, in percent (0: none, too few cases).
  double noise_floor_pct = 0.0;
  std::string time_verdict;        ///< slower | faster | same ("" when not compared)
  std::optional<double> memory_change_pct;
  std::string memory_verdict;      ///< grew | shrank | same | n/a (no memory numbers) ("" when not compared)
};

/// Thresholds of a comparison.
struct CompareOptions {
  /// A time change must exceed this many percent (and the noise) to count as slower or faster.
  double threshold_pct = 5.0;
  /// Divide the new run's times by the machine factor of their reference, where both files have it.
  bool normalize = true;
  /// Require a time change beyond the between-run noise floor: noise_floor_sigmas x 1.4826 x the median absolute
  /// deviation of the (normalized) changes of all compared cases of one machine, where there are at least
  /// noise_floor_min_cases of them.
  bool noise_floor = true;
  /// 5, not 3: between two runs of one build, unchanged cases wander with heavy tails (a case slowed down for a
  /// whole run by another tenant of a shared runner). On the 2-core CI machine, 4 of 9 such pairs of runs held a
  /// case 4 to 6.6 robust standard deviations out; at 5 none of the 3 pairs of the current build did, and every
  /// deliberate change (+56% and more) still stood out.
  double noise_floor_sigmas = 5.0;
  std::size_t noise_floor_min_cases = 8;
  /// Peak memory is deterministic: any change beyond this many percent counts as grew or shrank.
  double memory_threshold_pct = 0.5;
  /// The noise bound in standard errors of the difference of the means (Welch): 3.
  double noise_sigmas = 3.0;
};

/// The comparison of two files.
struct BenchComparison {
  std::vector<CaseComparison> cases;  ///< by name: compared, then added, removed and reference ones in turn
  std::map<std::string, MachineSpeed> machine;  ///< by reference name, the references both files measured
  std::map<std::string, double> noise_floor_pct;  ///< by reference name: the between-run noise floor of its cases
  std::string text;                   ///< the printed report
  bool regressed = false;             ///< a case got slower or its memory grew
};

/// Compares every case of `old_cases` with the same case of `new_cases`.
///
/// Machine speed: where both files hold a case's reference (reference_for), the new run's times are divided by
/// factor = mean_new(reference) / mean_old(reference), so that a runner that got slower (another tenant, a lower
/// clock) is not read as a slower step. The reference is fixed LibTorch work, independent of the fixtures and of
/// memgate's models, so a change to them does not move it.
///
/// Time: a case is "slower" (or "faster") only when its (normalized) mean time changed by more than
/// `threshold_pct` percent, AND by more than the between-run noise floor of its machine (see
/// CompareOptions::noise_floor: how much all the cases of this comparison wandered; it assumes most cases did not
/// change, and widens, so stays quiet, when many changed by different amounts), AND by more than the repetition
/// noise, |mean_new/factor - mean_old| > noise_sigmas x
/// sqrt(sd_old^2/n_old + (sd_new/factor)^2/n_new + (mean_new/factor)^2 x rel_se(factor)^2) (a Welch-style bound
/// on the difference of two means, from the standard deviations across repetitions); otherwise "same".
/// Memory: "grew"/"shrank" on any change beyond `memory_threshold_pct`, else "same".
[[nodiscard]] BenchComparison compare_bench(const std::map<std::string, BenchCase>& old_cases,
                                            const std::map<std::string, BenchCase>& new_cases,
                                            const CompareOptions& options = {});

/// Merges Google Benchmark JSON documents into one: the processes of one run (memgate_bench
/// --memgate_processes), or whole runs of one build (memgate bench-merge). The result has the first one's context
/// (with "memgate_processes": N, the number of parts), every repetition of every part under its case in the order
/// the cases first appear, renumbered (repetition_index, repetitions) and tagged "memgate_process": i (the part),
/// then the mean, median, stddev and cv of real_time and cpu_time over all of them. The parts' own aggregates are
/// dropped. `origin` names the result in errors.
[[nodiscard]] nlohmann::json merge_bench_json(const std::vector<nlohmann::json>& docs, const std::string& origin);

/// github-action-benchmark's customSmallerIsBetter entries of a file's peak memory:
/// [{"name": "<case> peak_allocated", "unit": "MiB", "value": <MiB>}, ...], one per case with a memory number
/// (the machine references left out).
[[nodiscard]] nlohmann::json bench_memory_to_custom(const std::map<std::string, BenchCase>& cases);

}  // namespace memgate
