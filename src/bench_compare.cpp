// Compares Google Benchmark JSON files: per case, mean step time with its spread and peak memory.
#include "memgate/bench_compare.h"

#include "memgate/error.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

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

std::string format(const char* fmt, double a) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, a);
  return buf;
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
  return format("%.3f", c.mean() / unit.seconds) + " " + unit.name + " ± " +
         format("%.3f", c.stddev() / unit.seconds) + " (n=" + std::to_string(c.seconds.size()) + ")";
}
std::string format_mib(const std::optional<double>& bytes) {
  return bytes ? format("%.3f", *bytes / kMiB) + " MiB" : "-";
}
std::string format_pct(double pct) { return format("%+.1f%%", pct); }

std::string pad(std::string s, std::size_t width) {
  // Counts UTF-8 code points, so that "±" takes one column.
  std::size_t columns = 0;
  for (unsigned char ch : s) columns += (ch & 0xC0) != 0x80;
  if (columns < width) s.append(width - columns, ' ');
  return s;
}

}  // namespace

double BenchCase::mean() const {
  if (seconds.empty()) return 0.0;
  double sum = 0.0;
  for (double s : seconds) sum += s;
  return sum / static_cast<double>(seconds.size());
}

double BenchCase::stddev() const {
  if (seconds.size() < 2) return 0.0;
  const double m = mean();
  double sq = 0.0;
  for (double s : seconds) sq += (s - m) * (s - m);
  return std::sqrt(sq / static_cast<double>(seconds.size() - 1));
}

std::map<std::string, BenchCase> parse_bench_json(const nlohmann::json& doc, const std::string& origin) {
  if (!doc.is_object() || !doc.contains("benchmarks") || !doc["benchmarks"].is_array()) {
    throw Error(origin + ": not a Google Benchmark JSON file (expected an object with a \"benchmarks\" array)");
  }
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
    const auto flag = [&b](const char* key) { return b.contains(key) && b[key].is_boolean() && b[key].get<bool>(); };
    if (flag("error_occurred") || flag("skipped")) {
      c.error = b.value("error_message", std::string("skipped"));
      continue;
    }
    try {
      const double time = b.at("real_time").get<double>();
      c.seconds.push_back(time * unit_seconds(b.value("time_unit", std::string("ns")), origin, name));
      std::optional<double> peak;
      if (b.contains("max_bytes_used")) {
        peak = b["max_bytes_used"].get<double>();
      } else if (b.contains("peak_allocated_MiB")) {
        peak = b["peak_allocated_MiB"].get<double>() * kMiB;
      }
      // Peaks are deterministic; should repetitions differ, the largest one counts.
      if (peak) c.peak_bytes = std::max(c.peak_bytes.value_or(*peak), *peak);
    } catch (const nlohmann::json::exception& e) {
      throw Error(origin + ": benchmark '" + name + "': " + e.what());
    }
  }
  return cases;
}

std::map<std::string, BenchCase> load_bench_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot read");
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(path + ": not valid JSON: " + e.what());
  }
  return parse_bench_json(doc, path);
}

BenchComparison compare_bench(const std::map<std::string, BenchCase>& old_cases,
                              const std::map<std::string, BenchCase>& new_cases, const CompareOptions& options) {
  BenchComparison out;
  std::vector<CaseComparison> added;
  std::vector<CaseComparison> removed;
  for (const auto& [name, o] : old_cases) {
    CaseComparison c;
    c.name = name;
    c.old_case = o;
    auto it = new_cases.find(name);
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
    const double diff = n.mean() - o.mean();
    c.time_change_pct = o.mean() > 0.0 ? 100.0 * diff / o.mean() : 0.0;
    const double no = static_cast<double>(o.seconds.size());
    const double nn = static_cast<double>(n.seconds.size());
    c.noise_seconds = options.noise_sigmas * std::sqrt(o.stddev() * o.stddev() / no + n.stddev() * n.stddev() / nn);
    const bool beyond = std::abs(c.time_change_pct) > options.threshold_pct && std::abs(diff) > c.noise_seconds;
    c.time_verdict = !beyond ? "same" : diff > 0 ? "slower" : "faster";
    if (o.peak_bytes && n.peak_bytes) {
      const double d = *n.peak_bytes - *o.peak_bytes;
      c.memory_change_pct = *o.peak_bytes > 0.0 ? 100.0 * d / *o.peak_bytes : (d == 0.0 ? 0.0 : 100.0);
      c.memory_verdict = std::abs(*c.memory_change_pct) <= options.memory_threshold_pct ? "same"
                         : d > 0                                                      ? "grew"
                                                                                      : "shrank";
    } else {
      c.memory_verdict = "n/a";
    }
    out.regressed = out.regressed || c.time_verdict == "slower" || c.memory_verdict == "grew";
    out.cases.push_back(std::move(c));
  }
  for (const auto& [name, n] : new_cases) {
    if (old_cases.count(name) != 0) continue;
    CaseComparison c;
    c.name = name;
    c.status = "added";
    c.new_case = n;
    added.push_back(std::move(c));
  }

  std::ostringstream text;
  std::size_t width = 4;
  for (const auto& c : out.cases) width = std::max(width, c.name.size());
  int compared = 0, skipped = 0, slower = 0, faster = 0, grew = 0, shrank = 0;
  std::map<std::string, int> skipped_alike;  // skipped in both runs for the same reason: one line per reason
  text << pad("case", width) << "  " << pad("old time", 30) << pad("new time", 30) << pad("change", 9)
       << pad("time", 8) << "| " << pad("old peak", 14) << pad("new peak", 14) << pad("change", 9) << "memory\n";
  for (const auto& c : out.cases) {
    if (c.status == "skipped") {
      ++skipped;
      const bool both = c.old_case.seconds.empty() && c.new_case.seconds.empty() && c.old_case.error == c.new_case.error;
      if (both) {
        ++skipped_alike[c.old_case.error.empty() ? "no runs" : c.old_case.error];
        continue;
      }
      const auto& why = c.old_case.seconds.empty() ? c.old_case.error : c.new_case.error;
      text << pad(c.name, width) << "  skipped in the " << (c.old_case.seconds.empty() ? "old" : "new")
           << " run: " << (why.empty() ? "no runs" : why) << "\n";
      continue;
    }
    const auto unit = pick_unit(std::max(c.old_case.mean(), c.new_case.mean()));
    text << pad(c.name, width) << "  " << pad(format_time(c.old_case, unit), 30)
         << pad(format_time(c.new_case, unit), 30) << pad(format_pct(c.time_change_pct), 9)
         << pad(c.time_verdict, 8) << "| " << pad(format_mib(c.old_case.peak_bytes), 14)
         << pad(format_mib(c.new_case.peak_bytes), 14)
         << pad(c.memory_change_pct ? format_pct(*c.memory_change_pct) : "-", 9) << c.memory_verdict << "\n";
    ++compared;
    slower += c.time_verdict == "slower";
    faster += c.time_verdict == "faster";
    grew += c.memory_verdict == "grew";
    shrank += c.memory_verdict == "shrank";
  }
  for (const auto& [why, count] : skipped_alike) {
    text << "skipped in both runs: " << count << (count == 1 ? " case" : " cases") << ": " << why << "\n";
  }
  for (const auto& c : added) text << "added:   " << c.name << "\n";
  for (const auto& c : removed) text << "removed: " << c.name << "\n";
  text << "\n"
       << compared << " cases compared: " << slower << " slower, " << faster << " faster, " << grew
       << " grew, " << shrank << " shrank; " << skipped << " skipped, " << added.size() << " added, " << removed.size()
       << " removed.\n"
       << "time: slower/faster when |change| > " << format("%g", options.threshold_pct) << "% and |mean_new - mean_old| > "
       << format("%g", options.noise_sigmas)
       << " x sqrt(sd_old^2/n_old + sd_new^2/n_new); memory: grew/shrank beyond "
       << format("%g", options.memory_threshold_pct) << "%.\n";
  out.text = text.str();
  for (auto& c : added) out.cases.push_back(std::move(c));
  for (auto& c : removed) out.cases.push_back(std::move(c));
  return out;
}

nlohmann::json bench_memory_to_custom(const std::map<std::string, BenchCase>& cases) {
  auto out = nlohmann::json::array();
  for (const auto& [name, c] : cases) {
    if (!c.peak_bytes) continue;
    out.push_back({{"name", name + " peak_allocated"}, {"unit", "MiB"}, {"value", *c.peak_bytes / kMiB}});
  }
  return out;
}

}  // namespace memgate
