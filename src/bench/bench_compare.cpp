// Compares Google Benchmark JSON files: per case, mean step time with its spread and peak memory.
#include "memgate/bench/bench_compare.h"

#include "memgate/base/error.h"
#include "memgate/base/files.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace memgate {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

double unit_seconds(const std::string& unit, const std::string& origin, const std::string& name) {
  if (unit == "ns") return 1e-9;
  if (unit == "us") return 1e-6;
  if (unit == "ms") return 1e-3;
  if (unit == "s") return 1.0;
  throw Error(origin + ": benchmark '" + name + "': unknown time_unit '" + unit + "'");
}

// A time and its spread in one unit chosen from the larger of the two means: "12.35 ms ± 0.12".
struct TimeUnit {
  const char* name;
  double seconds;
};
TimeUnit pick_unit(double seconds) {
  if (seconds >= 1.0) return {"s", 1.0};
  if (seconds >= 1e-3) return {"ms", 1e-3};
  return {"us", 1e-6};
}
std::string format_time(const BenchCase& c, TimeUnit unit) {
  if (c.seconds.empty()) return "-";
  return fmt::format("{:.3f} {} ± {:.3f} (n={})", c.mean() / unit.seconds, unit.name, c.stddev() / unit.seconds,
                     c.seconds.size());
}
std::string format_pct(double pct) { return fmt::format("{:+.1f}%", pct); }

constexpr const char* kReferencePrefix = "BM_Reference/";

double mean_of(const std::vector<double>& v) {
  if (v.empty()) return 0.0;
  double sum = 0.0;
  for (double x : v) sum += x;
  return sum / static_cast<double>(v.size());
}

// The sample standard deviation (0 for fewer than two values).
double stddev_of(const std::vector<double>& v) {
  if (v.size() < 2) return 0.0;
  const double m = mean_of(v);
  double sq = 0.0;
  for (double x : v) sq += (x - m) * (x - m);
  return std::sqrt(sq / static_cast<double>(v.size() - 1));
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Whether a benchmark entry holds no measurement: an error, or a skip.
bool entry_failed(const nlohmann::json& b) {
  const auto flag = [&b](const char* key) { return b.contains(key) && b[key].is_boolean() && b[key].get<bool>(); };
  return flag("error_occurred") || flag("skipped");
}

// The reference a run name belongs to: `BM_Reference/cpu/real_time` -> `BM_Reference/cpu`.
std::string reference_name(const std::string& run_name) {
  return run_name.substr(0, run_name.find('/', std::string(kReferencePrefix).size()));
}

// A JSON file, with errors that name it.
nlohmann::json read_json_file(const std::string& path) {
  const auto text = read_text_file(path, "a Google Benchmark JSON file");
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // a syntax error, or a number out of range (1e309)
    throw Error(path + ": not valid JSON: " + e.what());
  }
}

// The standard error of a case's mean time: sd / sqrt(n).
double standard_error(const BenchCase& c) {
  return c.seconds.empty() ? 0.0 : c.stddev() / std::sqrt(static_cast<double>(c.seconds.size()));
}

}  // namespace

double BenchCase::mean() const { return mean_of(seconds); }

double BenchCase::stddev() const { return stddev_of(seconds); }

namespace {
std::map<std::string, BenchCase> parse_bench_entries(const nlohmann::json& doc, const std::string& origin);
}  // namespace

std::map<std::string, BenchCase> parse_bench_json(const nlohmann::json& doc, const std::string& origin) {
  if (!doc.is_object() || !doc.contains("benchmarks") || !doc["benchmarks"].is_array()) {
    throw Error(origin + ": not a Google Benchmark JSON file (expected an object with a \"benchmarks\" array)");
  }
  try {
    return parse_bench_entries(doc, origin);
  } catch (const nlohmann::json::exception& e) {  // a field of another type than Google Benchmark writes
    throw Error(origin + ": not a Google Benchmark JSON file: " + e.what());
  }
}

namespace {

std::map<std::string, BenchCase> parse_bench_entries(const nlohmann::json& doc, const std::string& origin) {
  std::map<std::string, BenchCase> cases;
  for (const auto& b : doc["benchmarks"]) {
    if (!b.is_object() || !b.contains("name") || !b["name"].is_string()) {
      throw Error(origin + ": a benchmark entry without a \"name\"");
    }
    const auto name = b["name"].get<std::string>();
    // Aggregates (mean, median, stddev, cv) are recomputed from the repetitions.
    if (b.value("run_type", std::string("iteration")) != "iteration") continue;
    const auto run_name = b.contains("run_name") && b["run_name"].is_string() ? b["run_name"].get<std::string>() : name;
    auto& c = cases[run_name];
    c.name = run_name;
    if (entry_failed(b)) {
      c.error = b.value("error_message", std::string("skipped"));
      continue;
    }
    try {
      const double time = b.at("real_time").get<double>();
      // A time or a peak below zero is no measurement: a hand-edited or corrupt file, which would compare as
      // faster or smaller than anything and pass.
      if (!std::isfinite(time) || time < 0) {
        throw Error(fmt::format("{}: benchmark '{}': \"real_time\" must be a time of zero or more, got {}", origin,
                                name, b.at("real_time").dump()));
      }
      if (b.contains("cpu_time") && b["cpu_time"].is_number() && b["cpu_time"].get<double>() < 0) {
        throw Error(fmt::format("{}: benchmark '{}': \"cpu_time\" must be a time of zero or more, got {}", origin,
                                name, b["cpu_time"].dump()));
      }
      c.seconds.push_back(time * unit_seconds(b.value("time_unit", std::string("ns")), origin, name));
      std::optional<double> peak;
      const char* peak_key = nullptr;
      if (b.contains("max_bytes_used")) {
        peak_key = "max_bytes_used";
        peak = b["max_bytes_used"].get<double>();
      } else if (b.contains("peak_allocated_MiB")) {
        peak_key = "peak_allocated_MiB";
        peak = b["peak_allocated_MiB"].get<double>() * kMiB;
      }
      if (peak && (!std::isfinite(*peak) || *peak < 0)) {
        throw Error(fmt::format("{}: benchmark '{}': \"{}\" must be a byte count of zero or more, got {}", origin,
                                name, peak_key, b[peak_key].dump()));
      }
      // Peaks are deterministic; should repetitions differ, the largest one counts.
      if (peak) c.peak_bytes = std::max(c.peak_bytes.value_or(*peak), *peak);
    } catch (const nlohmann::json::exception& e) {
      throw Error(origin + ": benchmark '" + name + "': " + e.what());
    }
  }
  return cases;
}

}  // namespace

nlohmann::json read_bench_document(const std::string& path) {
  auto doc = read_json_file(path);
  (void)parse_bench_json(doc, path);  // the same checks as a comparison makes, naming the file
  return doc;
}

std::map<std::string, BenchCase> load_bench_json(const std::string& path) {
  auto cases = parse_bench_json(read_json_file(path), path);
  // A run without cases would compare nothing and pass: a failed or filtered-out run, not a result.
  if (cases.empty()) throw Error(path + ": no benchmarks in it: an empty run compares nothing");
  return cases;
}

bool is_reference_case(const std::string& name) { return name.rfind(kReferencePrefix, 0) == 0; }

std::string reference_for(const std::string& name) {
  return name.rfind("BM_TrainStep/gpu/", 0) == 0 ? "BM_Reference/gpu" : "BM_Reference/cpu";
}

BenchComparison compare_bench(const std::map<std::string, BenchCase>& old_cases,
                              const std::map<std::string, BenchCase>& new_cases, const CompareOptions& options) {
  BenchComparison out;
  std::vector<CaseComparison> added;
  std::vector<CaseComparison> removed;
  std::vector<CaseComparison> references;

  // The machine factors: a reference's run_name is `BM_Reference/<device>/<real_time|manual_time>`.
  for (const auto& [name, o] : old_cases) {
    if (!is_reference_case(name)) continue;
    auto it = new_cases.find(name);
    if (it == new_cases.end() || o.seconds.empty() || it->second.seconds.empty() || o.mean() <= 0.0) continue;
    const auto& n = it->second;
    MachineSpeed m;
    m.reference = reference_name(name);
    m.old_case = o;
    m.new_case = n;
    m.factor = n.mean() / o.mean();
    m.factor_rel_se = std::sqrt(std::pow(standard_error(o) / o.mean(), 2) + std::pow(standard_error(n) / n.mean(), 2));
    out.machine[m.reference] = m;
  }

  for (const auto& [name, o] : old_cases) {
    CaseComparison c;
    c.name = name;
    c.old_case = o;
    auto it = new_cases.find(name);
    if (is_reference_case(name)) {
      c.status = "reference";
      if (it != new_cases.end()) c.new_case = it->second;
      references.push_back(std::move(c));
      continue;
    }
    if (it == new_cases.end()) {
      c.status = "removed";
      removed.push_back(std::move(c));
      continue;
    }
    c.new_case = it->second;
    const auto& n = it->second;
    if (o.seconds.empty() || n.seconds.empty()) {
      c.status = "skipped";
      out.cases.push_back(std::move(c));
      continue;
    }
    c.status = "compared";
    double factor_rel_se = 0.0;
    if (options.normalize) {
      auto m = out.machine.find(reference_for(name));
      if (m != out.machine.end()) {
        c.machine_factor = m->second.factor;
        factor_rel_se = m->second.factor_rel_se;
      }
    }
    c.time_change_pct = o.mean() > 0.0 ? 100.0 * (n.mean() - o.mean()) / o.mean() : 0.0;
    const double new_mean = n.mean() / c.machine_factor;
    const double diff = new_mean - o.mean();
    c.normalized_change_pct = o.mean() > 0.0 ? 100.0 * diff / o.mean() : 0.0;
    const double se_new = standard_error(n) / c.machine_factor;
    c.noise_seconds = options.noise_sigmas * std::sqrt(std::pow(standard_error(o), 2) + se_new * se_new +
                                                       std::pow(new_mean * factor_rel_se, 2));
    if (o.peak_bytes && n.peak_bytes) {
      const double d = *n.peak_bytes - *o.peak_bytes;
      c.memory_change_pct = *o.peak_bytes > 0.0 ? 100.0 * d / *o.peak_bytes : (d == 0.0 ? 0.0 : 100.0);
      c.memory_verdict = std::abs(*c.memory_change_pct) <= options.memory_threshold_pct ? "same"
                         : d > 0                                                      ? "grew"
                                                                                      : "shrank";
    } else {
      c.memory_verdict = "n/a";
    }
    out.cases.push_back(std::move(c));
  }

  // The between-run noise floor of each machine (the cases of one reference): k x the robust spread (1.4826 x
  // the median absolute deviation) of the changes of all its compared cases. Two runs of one build still differ
  // case by case (another process's memory layout, the runner's neighbours): most cases do not change, so how
  // much they wandered is how much one case may wander without a cause.
  if (options.noise_floor) {
    std::map<std::string, std::vector<double>> changes;
    for (const auto& c : out.cases) {
      if (c.status == "compared") changes[reference_for(c.name)].push_back(c.normalized_change_pct);
    }
    for (auto& [ref, v] : changes) {
      if (v.size() < options.noise_floor_min_cases) continue;
      const double med = median(v);
      std::vector<double> deviations;
      for (double x : v) deviations.push_back(std::abs(x - med));
      out.noise_floor_pct[ref] = options.noise_floor_sigmas * 1.4826 * median(deviations);
    }
  }
  for (auto& c : out.cases) {
    if (c.status != "compared") continue;
    const auto floor = out.noise_floor_pct.find(reference_for(c.name));
    c.noise_floor_pct = floor == out.noise_floor_pct.end() ? 0.0 : floor->second;
    const double change = std::abs(c.normalized_change_pct);
    const double diff = c.new_case.mean() / c.machine_factor - c.old_case.mean();
    const bool beyond = change > options.threshold_pct && change > c.noise_floor_pct && std::abs(diff) > c.noise_seconds;
    c.time_verdict = !beyond ? "same" : diff > 0 ? "slower" : "faster";
    out.regressed = out.regressed || c.time_verdict == "slower" || c.memory_verdict == "grew";
  }

  for (const auto& [name, n] : new_cases) {
    if (old_cases.count(name) != 0 || is_reference_case(name)) continue;
    CaseComparison c;
    c.name = name;
    c.status = "added";
    c.new_case = n;
    added.push_back(std::move(c));
  }

  // The report: fmt pads by display width, so that "±" takes one column.
  auto text = std::back_inserter(out.text);
  std::size_t width = 4;
  for (const auto& c : out.cases) width = std::max(width, c.name.size());
  int compared = 0, skipped = 0, slower = 0, faster = 0, grew = 0, shrank = 0;
  std::map<std::string, int> skipped_alike;  // skipped in both runs for the same reason: one line per reason
  for (const auto& [ref, m] : out.machine) {
    const auto unit = pick_unit(std::max(m.old_case.mean(), m.new_case.mean()));
    fmt::format_to(text, "machine speed ({}): {} -> {}, {}: {}\n", ref, format_time(m.old_case, unit),
                   format_time(m.new_case, unit), format_pct(100.0 * (m.factor - 1.0)),
                   options.normalize ? fmt::format("the new times of its cases are divided by {:.3f}", m.factor)
                                     : std::string("not applied (--no-normalize)"));
  }
  for (const auto& r : references) {
    if (out.machine.count(reference_name(r.name)) != 0) continue;
    if (r.old_case.seconds.empty() && r.new_case.seconds.empty()) continue;  // skipped in both (no GPU)
    fmt::format_to(text, "machine speed ({}): not in both runs, raw times compared\n", r.name);
  }
  for (const auto& [ref, floor] : out.noise_floor_pct) {
    fmt::format_to(text, "between-run noise floor (cases measured by {}): {:.1f}%, {:g} x the robust spread of their "
                         "changes\n",
                   ref, floor, options.noise_floor_sigmas);
  }
  constexpr const char* kRow = "{:<{}}  {:<30}{:<30}{:<9}{:<9}{:<8}| {:<14}{:<14}{:<9}{}\n";
  fmt::format_to(text, kRow, "case", width, "old time", "new time", "change", "machine", "time", "old peak",
                 "new peak", "change", "memory");
  const auto peak = [](const std::optional<double>& bytes) {
    return bytes ? fmt::format("{:.3f} MiB", *bytes / kMiB) : std::string("-");
  };
  for (const auto& c : out.cases) {
    if (c.status == "skipped") {
      ++skipped;
      const bool both = c.old_case.seconds.empty() && c.new_case.seconds.empty() && c.old_case.error == c.new_case.error;
      if (both) {
        ++skipped_alike[c.old_case.error.empty() ? "no runs" : c.old_case.error];
        continue;
      }
      const auto& why = c.old_case.seconds.empty() ? c.old_case.error : c.new_case.error;
      fmt::format_to(text, "{:<{}}  skipped in the {} run: {}\n", c.name, width,
                     c.old_case.seconds.empty() ? "old" : "new", why.empty() ? "no runs" : why);
      continue;
    }
    const auto unit = pick_unit(std::max(c.old_case.mean(), c.new_case.mean()));
    fmt::format_to(text, kRow, c.name, width, format_time(c.old_case, unit), format_time(c.new_case, unit),
                   format_pct(c.time_change_pct), c.machine_factor != 1.0 ? format_pct(c.normalized_change_pct) : "-",
                   c.time_verdict, peak(c.old_case.peak_bytes), peak(c.new_case.peak_bytes),
                   c.memory_change_pct ? format_pct(*c.memory_change_pct) : "-", c.memory_verdict);
    ++compared;
    slower += c.time_verdict == "slower";
    faster += c.time_verdict == "faster";
    grew += c.memory_verdict == "grew";
    shrank += c.memory_verdict == "shrank";
  }
  for (const auto& [why, count] : skipped_alike) {
    fmt::format_to(text, "skipped in both runs: {} {}: {}\n", count, count == 1 ? "case" : "cases", why);
  }
  for (const auto& c : added) fmt::format_to(text, "added:   {}\n", c.name);
  for (const auto& c : removed) fmt::format_to(text, "removed: {}\n", c.name);
  fmt::format_to(text,
                 "\n{} cases compared: {} slower, {} faster, {} grew, {} shrank; {} skipped, {} added, {} removed.\n"
                 "time: slower/faster when the change (\"machine\": after dividing the new times by the machine "
                 "factor) is beyond {:g}%, beyond the between-run noise floor and beyond {:g} standard errors of the "
                 "difference of the means (the repetitions' spread); memory: grew/shrank beyond {:g}%.\n",
                 compared, slower, faster, grew, shrank, skipped, added.size(), removed.size(), options.threshold_pct,
                 options.noise_sigmas, options.memory_threshold_pct);
  for (auto& c : added) out.cases.push_back(std::move(c));
  for (auto& c : removed) out.cases.push_back(std::move(c));
  for (auto& c : references) out.cases.push_back(std::move(c));
  return out;
}

nlohmann::json merge_bench_json(const std::vector<nlohmann::json>& docs, const std::string& origin) {
  if (docs.empty()) throw Error(origin + ": no benchmark output to merge");
  std::vector<std::string> order;
  std::map<std::string, std::vector<nlohmann::json>> runs;
  for (std::size_t i = 0; i < docs.size(); ++i) {
    const auto& doc = docs[i];
    if (!doc.is_object() || !doc.contains("benchmarks") || !doc["benchmarks"].is_array()) {
      throw Error(origin + ": part " + std::to_string(i) +
                  ": not a Google Benchmark JSON file (expected an object with a \"benchmarks\" array)");
    }
    for (const auto& b : doc["benchmarks"]) {
      if (!b.is_object() || !b.contains("name") || !b["name"].is_string()) {
        throw Error(origin + ": part " + std::to_string(i) + ": a benchmark entry without a \"name\"");
      }
      if (b.value("run_type", std::string("iteration")) != "iteration") continue;
      const auto run_name = b.contains("run_name") && b["run_name"].is_string() ? b["run_name"].get<std::string>()
                                                                                 : b["name"].get<std::string>();
      if (runs.count(run_name) == 0) order.push_back(run_name);
      auto entry = b;
      entry["memgate_process"] = i;
      runs[run_name].push_back(std::move(entry));
    }
  }

  nlohmann::json out = {{"context", docs[0].value("context", nlohmann::json::object())},
                        {"benchmarks", nlohmann::json::array()}};
  out["context"]["memgate_processes"] = docs.size();
  for (const auto& run_name : order) {
    auto& entries = runs[run_name];
    std::vector<const nlohmann::json*> measured;
    for (std::size_t k = 0; k < entries.size(); ++k) {
      entries[k]["repetition_index"] = k;
      entries[k]["repetitions"] = entries.size();
    }
    for (const auto& e : entries) {
      out["benchmarks"].push_back(e);
      if (!entry_failed(e) && e.contains("real_time") && e.contains("cpu_time")) measured.push_back(&e);
    }
    if (measured.size() < 2) continue;
    const auto column = [&](const char* key) {
      std::vector<double> v;
      for (const auto* e : measured) v.push_back((*e)[key].get<double>());
      return v;
    };
    const auto real = column("real_time");
    const auto cpu = column("cpu_time");
    const auto& first = *measured.front();
    const auto aggregate = [&](const char* name, const char* unit, double real_value, double cpu_value) {
      nlohmann::json a = {{"name", run_name + "_" + name},
                          {"run_name", run_name},
                          {"run_type", "aggregate"},
                          {"repetitions", entries.size()},
                          {"threads", first.value("threads", 1)},
                          {"aggregate_name", name},
                          {"aggregate_unit", unit},
                          {"iterations", measured.size()},
                          {"real_time", real_value},
                          {"cpu_time", cpu_value},
                          {"time_unit", first.value("time_unit", std::string("ns"))}};
      for (const char* key : {"family_index", "per_family_instance_index"}) {
        if (first.contains(key)) a[key] = first[key];
      }
      out["benchmarks"].push_back(std::move(a));
    };
    aggregate("mean", "time", mean_of(real), mean_of(cpu));
    aggregate("median", "time", median(real), median(cpu));
    aggregate("stddev", "time", stddev_of(real), stddev_of(cpu));
    aggregate("cv", "percentage", stddev_of(real) / mean_of(real), stddev_of(cpu) / mean_of(cpu));
  }
  return out;
}

nlohmann::json bench_memory_to_custom(const std::map<std::string, BenchCase>& cases) {
  auto out = nlohmann::json::array();
  for (const auto& [name, c] : cases) {
    if (!c.peak_bytes || is_reference_case(name)) continue;
    out.push_back({{"name", name + " peak_allocated"}, {"unit", "MiB"}, {"value", *c.peak_bytes / kMiB}});
  }
  return out;
}

}  // namespace memgate
