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
/// The same from an already parsed document; `origin` names it in errors.
[[nodiscard]] std::map<std::string, BenchCase> parse_bench_json(const nlohmann::json& doc, const std::string& origin);

/// How one case changed between the old and the new file.
struct CaseComparison {
  std::string name;
  std::string status;  ///< compared | added | removed | skipped (an error in either file)
  BenchCase old_case;
  BenchCase new_case;
  double time_change_pct = 0.0;    ///< (new mean - old mean) / old mean x 100
  double noise_seconds = 0.0;      ///< 3 x sqrt(sd_old^2 / n_old + sd_new^2 / n_new)
  std::string time_verdict;        ///< slower | faster | same ("" when not compared)
  std::optional<double> memory_change_pct;
  std::string memory_verdict;      ///< grew | shrank | same | n/a (no memory numbers) ("" when not compared)
};

/// Thresholds of a comparison.
struct CompareOptions {
  /// A time change must exceed this many percent (and the noise) to count as slower or faster.
  double threshold_pct = 5.0;
  /// Peak memory is deterministic: any change beyond this many percent counts as grew or shrank.
  double memory_threshold_pct = 0.5;
  /// The noise bound in standard errors of the difference of the means (Welch): 3.
  double noise_sigmas = 3.0;
};

/// The comparison of two files.
struct BenchComparison {
  std::vector<CaseComparison> cases;  ///< by name: compared, then added and removed ones in the same order
  std::string text;                   ///< the printed report
  bool regressed = false;             ///< a case got slower or its memory grew
};

/// Compares every case of `old_cases` with the same case of `new_cases`.
///
/// Time: a case is "slower" (or "faster") only when its mean time changed by more than `threshold_pct` percent
/// AND by more than the noise, |mean_new - mean_old| > noise_sigmas x sqrt(sd_old^2/n_old + sd_new^2/n_new)
/// (a Welch-style bound on the difference of two means, from the standard deviations across repetitions);
/// otherwise "same". Memory: "grew"/"shrank" on any change beyond `memory_threshold_pct`, else "same".
[[nodiscard]] BenchComparison compare_bench(const std::map<std::string, BenchCase>& old_cases,
                                            const std::map<std::string, BenchCase>& new_cases,
                                            const CompareOptions& options = {});

/// github-action-benchmark's customSmallerIsBetter entries of a file's peak memory:
/// [{"name": "<case> peak_allocated", "unit": "MiB", "value": <MiB>}, ...], one per case with a memory number.
[[nodiscard]] nlohmann::json bench_memory_to_custom(const std::map<std::string, BenchCase>& cases);

}  // namespace memgate
