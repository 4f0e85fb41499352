// Hand-made Google Benchmark JSON documents, as memgate_bench writes them, for the bench tools' tests.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace memgate::testing {

constexpr double kMiB = 1024.0 * 1024.0;

// One case of a hand-made run: its repetitions' times (ms) and its peak bytes.
struct FakeCase {
  std::string name;
  std::vector<double> ms;
  double peak_bytes = 0.0;
};

// A Google Benchmark JSON document as memgate_bench writes it: per-repetition runs, then the aggregates (which
// the comparison must ignore: they get nonsense numbers here).
inline nlohmann::json bench_doc(const std::vector<FakeCase>& cases) {
  nlohmann::json doc = {{"context", {{"executable", "memgate_bench"}, {"num_cpus", 2}}},
                        {"benchmarks", nlohmann::json::array()}};
  for (const auto& c : cases) {
    const auto run_name = c.name + "/real_time";
    for (std::size_t i = 0; i < c.ms.size(); ++i) {
      doc["benchmarks"].push_back({{"name", run_name},
                                   {"run_name", run_name},
                                   {"run_type", "iteration"},
                                   {"repetitions", c.ms.size()},
                                   {"repetition_index", i},
                                   {"iterations", 10},
                                   {"real_time", c.ms[i]},
                                   {"cpu_time", c.ms[i]},
                                   {"time_unit", "ms"},
                                   {"allocs_per_iter", 100.0},
                                   {"max_bytes_used", c.peak_bytes},
                                   {"peak_allocated_MiB", c.peak_bytes / kMiB}});
    }
    for (const char* aggregate : {"mean", "median", "stddev", "cv"}) {
      doc["benchmarks"].push_back({{"name", run_name + "_" + aggregate},
                                   {"run_name", run_name},
                                   {"run_type", "aggregate"},
                                   {"aggregate_name", aggregate},
                                   {"real_time", 1e9},
                                   {"cpu_time", 1e9},
                                   {"time_unit", "ms"}});
    }
  }
  return doc;
}

}  // namespace memgate::testing
