// bench-compare, bench-merge and bench-convert: verdicts on hand-made Google Benchmark JSON. No LibTorch.
#include "memgate/bench/bench_compare.h"
#include "memgate/base/error.h"
#include "bench_doc.h"
#include "test_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace memgate {
namespace {

namespace fs = std::filesystem;
using testing::bench_doc;
using testing::FakeCase;
using testing::kMiB;
using ::testing::HasSubstr;
using ::testing::Not;

std::map<std::string, BenchCase> cases_of(const std::vector<FakeCase>& cases) {
  return parse_bench_json(bench_doc(cases), "test");
}

const CaseComparison& find(const BenchComparison& c, const std::string& name) {
  for (const auto& x : c.cases) {
    if (x.name == name) return x;
  }
  throw std::runtime_error("no case " + name);
}

const std::vector<double> kSteady{10.0, 10.1, 9.9, 10.05, 9.95};

TEST(BenchCompareTest, ParsesRepetitionsAndIgnoresAggregates) {
  const auto cases = cases_of({{"BM_A", {10.0, 12.0, 14.0}, 8 * kMiB}});
  ASSERT_EQ(cases.size(), 1U);
  const auto& c = cases.at("BM_A/real_time");
  EXPECT_EQ(c.seconds.size(), 3U);
  EXPECT_NEAR(c.mean(), 0.012, 1e-12);
  EXPECT_NEAR(c.stddev(), 0.002, 1e-12);
  ASSERT_TRUE(c.peak_bytes.has_value());
  EXPECT_DOUBLE_EQ(*c.peak_bytes, 8 * kMiB);
}

TEST(BenchCompareTest, IdenticalRunsAreAllSame) {
  const std::vector<FakeCase> run{{"BM_A", kSteady, 8 * kMiB}, {"BM_B", {3.0, 3.1, 2.9}, 2 * kMiB}};
  const auto c = compare_bench(cases_of(run), cases_of(run));
  EXPECT_FALSE(c.regressed);
  ASSERT_EQ(c.cases.size(), 2U);
  for (const auto& x : c.cases) {
    EXPECT_EQ(x.status, "compared");
    EXPECT_EQ(x.time_verdict, "same") << x.name;
    EXPECT_EQ(x.memory_verdict, "same") << x.name;
  }
  EXPECT_THAT(c.text, HasSubstr("2 cases compared: 0 slower, 0 faster, 0 grew, 0 shrank"));
}

TEST(BenchCompareTest, FiftyPercentSlowerBeyondTheNoiseIsSlower) {
  std::vector<double> slow;
  for (double ms : kSteady) slow.push_back(ms * 1.5);
  const auto c = compare_bench(cases_of({{"BM_A", kSteady, 8 * kMiB}}), cases_of({{"BM_A", slow, 8 * kMiB}}));
  const auto& a = find(c, "BM_A/real_time");
  EXPECT_EQ(a.time_verdict, "slower");
  EXPECT_NEAR(a.time_change_pct, 50.0, 1e-9);
  EXPECT_EQ(a.memory_verdict, "same");
  EXPECT_TRUE(c.regressed);

  const auto back = compare_bench(cases_of({{"BM_A", slow, 8 * kMiB}}), cases_of({{"BM_A", kSteady, 8 * kMiB}}));
  EXPECT_EQ(find(back, "BM_A/real_time").time_verdict, "faster");
  EXPECT_FALSE(back.regressed) << "faster is no regression";
}

TEST(BenchCompareTest, TenPercentMoreMemoryGrew) {
  const auto c = compare_bench(cases_of({{"BM_A", kSteady, 100 * kMiB}}),
                               cases_of({{"BM_A", kSteady, 110 * kMiB}}));
  const auto& a = find(c, "BM_A/real_time");
  EXPECT_EQ(a.memory_verdict, "grew");
  ASSERT_TRUE(a.memory_change_pct.has_value());
  EXPECT_NEAR(*a.memory_change_pct, 10.0, 1e-9);
  EXPECT_EQ(a.time_verdict, "same");
  EXPECT_TRUE(c.regressed);
  EXPECT_THAT(c.text, HasSubstr("+10.0%"));

  const auto small = compare_bench(cases_of({{"BM_A", kSteady, 100 * kMiB}}),
                                   cases_of({{"BM_A", kSteady, 100.4 * kMiB}}));
  EXPECT_EQ(find(small, "BM_A/real_time").memory_verdict, "same") << "within 0.5%";
  const auto shrank = compare_bench(cases_of({{"BM_A", kSteady, 100 * kMiB}}),
                                    cases_of({{"BM_A", kSteady, 90 * kMiB}}));
  EXPECT_EQ(find(shrank, "BM_A/real_time").memory_verdict, "shrank");
  EXPECT_FALSE(shrank.regressed);
}

TEST(BenchCompareTest, NoisyRunsWithOverlappingSpreadsAreSame) {
  // +30% on the means, far beyond the 5% threshold, but the repetitions scatter by +-40%: within the noise.
  const auto c = compare_bench(cases_of({{"BM_A", {10.0, 14.0, 6.0, 12.0, 8.0}, 8 * kMiB}}),
                               cases_of({{"BM_A", {13.0, 9.0, 17.0, 11.0, 15.0}, 8 * kMiB}}));
  const auto& a = find(c, "BM_A/real_time");
  EXPECT_NEAR(a.time_change_pct, 30.0, 1e-9);
  EXPECT_GT(a.noise_seconds, 0.003);
  EXPECT_EQ(a.time_verdict, "same");
  EXPECT_FALSE(c.regressed);
}

TEST(BenchCompareTest, ChangesWithinTheThresholdAreSameEvenWithoutNoise) {
  const auto c = compare_bench(cases_of({{"BM_A", {10.0, 10.0, 10.0}, kMiB}}),
                               cases_of({{"BM_A", {10.4, 10.4, 10.4}, kMiB}}));
  EXPECT_EQ(find(c, "BM_A/real_time").time_verdict, "same");
  CompareOptions strict;
  strict.threshold_pct = 1.0;
  const auto s = compare_bench(cases_of({{"BM_A", {10.0, 10.0, 10.0}, kMiB}}),
                               cases_of({{"BM_A", {10.4, 10.4, 10.4}, kMiB}}), strict);
  EXPECT_EQ(find(s, "BM_A/real_time").time_verdict, "slower");
}

TEST(BenchCompareTest, CasesInOneFileAreAddedOrRemoved) {
  const auto c = compare_bench(cases_of({{"BM_A", kSteady, kMiB}, {"BM_Old", kSteady, kMiB}}),
                               cases_of({{"BM_A", kSteady, kMiB}, {"BM_New", kSteady, kMiB}}));
  EXPECT_EQ(find(c, "BM_Old/real_time").status, "removed");
  EXPECT_EQ(find(c, "BM_New/real_time").status, "added");
  EXPECT_FALSE(c.regressed);
  EXPECT_THAT(c.text, HasSubstr("added:   BM_New/real_time"));
  EXPECT_THAT(c.text, HasSubstr("removed: BM_Old/real_time"));
}

TEST(BenchCompareTest, SkippedCasesAreListedWithTheirError) {
  auto doc = bench_doc({});
  doc["benchmarks"].push_back({{"name", "BM_Gpu/manual_time"},
                               {"run_name", "BM_Gpu/manual_time"},
                               {"run_type", "iteration"},
                               {"error_occurred", true},
                               {"error_message", "no GPU: LibTorch sees no CUDA device"}});
  const auto cases = parse_bench_json(doc, "test");
  const auto c = compare_bench(cases, cases);
  EXPECT_EQ(find(c, "BM_Gpu/manual_time").status, "skipped");
  EXPECT_THAT(c.text, HasSubstr("skipped in both runs: 1 case: no GPU"));

  auto ran = bench_doc({});
  ran["benchmarks"].push_back({{"name", "BM_Gpu/manual_time"},
                               {"run_name", "BM_Gpu/manual_time"},
                               {"run_type", "iteration"},
                               {"real_time", 5.0},
                               {"time_unit", "ms"},
                               {"max_bytes_used", 1024}});
  const auto once = compare_bench(cases, parse_bench_json(ran, "test"));
  EXPECT_EQ(find(once, "BM_Gpu/manual_time").status, "skipped");
  EXPECT_THAT(once.text, HasSubstr("skipped in the old run: no GPU"));
  EXPECT_FALSE(c.regressed);
}

TEST(BenchCompareTest, BadFilesNameTheFile) {
  testing::TempDir dir;
  testing::write_file(dir / "bad.json", "{ not json");
  testing::write_file(dir / "other.json", "{\"results\": []}");
  EXPECT_THROW((void)load_bench_json(dir / "missing.json"), Error);
  try {
    (void)load_bench_json(dir / "bad.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("bad.json: not valid JSON"));
  }
  try {
    (void)load_bench_json(dir / "other.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("other.json: not a Google Benchmark JSON file"));
  }
}

// kSteady times `factor`.
std::vector<double> scaled(const std::vector<double>& ms, double factor) {
  std::vector<double> out;
  for (double x : ms) out.push_back(x * factor);
  return out;
}

TEST(BenchCompareTest, ReferencesAreFoundByName) {
  EXPECT_TRUE(is_reference_case("BM_Reference/cpu/real_time"));
  EXPECT_FALSE(is_reference_case("BM_TrainStep/fixture:vit_tiny_lora/bs:1/real_time"));
  EXPECT_EQ(reference_for("BM_TrainStep/fixture:vit_tiny_lora/bs:1/real_time"), "BM_Reference/cpu");
  EXPECT_EQ(reference_for("BM_TrainStep/gpu/fixture:retfound_large_lora/bs:32/manual_time"), "BM_Reference/gpu");
}

TEST(BenchCompareTest, AMachineThatGotSlowerIsNotASlowerStep) {
  // The whole new run is 15% slower, the reference with it: the steps are the same.
  const auto old_cases = cases_of({{"BM_Reference/cpu", {2.0, 2.02, 1.98, 2.01, 1.99}}, {"BM_A", kSteady, kMiB}});
  const auto new_cases =
      cases_of({{"BM_Reference/cpu", scaled({2.0, 2.02, 1.98, 2.01, 1.99}, 1.15)}, {"BM_A", scaled(kSteady, 1.15), kMiB}});
  const auto c = compare_bench(old_cases, new_cases);
  ASSERT_EQ(c.machine.count("BM_Reference/cpu"), 1U);
  EXPECT_NEAR(c.machine.at("BM_Reference/cpu").factor, 1.15, 1e-9);
  const auto& a = find(c, "BM_A/real_time");
  EXPECT_NEAR(a.time_change_pct, 15.0, 1e-9) << "the raw change is still reported";
  EXPECT_NEAR(a.machine_factor, 1.15, 1e-9);
  EXPECT_NEAR(a.normalized_change_pct, 0.0, 1e-9);
  EXPECT_EQ(a.time_verdict, "same");
  EXPECT_FALSE(c.regressed);
  EXPECT_EQ(find(c, "BM_Reference/cpu/real_time").status, "reference");
  EXPECT_THAT(c.text, HasSubstr("machine speed (BM_Reference/cpu)"));
  EXPECT_THAT(c.text, HasSubstr("+15.0%: the new times of its cases are divided by 1.150"));
  EXPECT_THAT(c.text, HasSubstr("1 cases compared: 0 slower")) << "the reference is not a case";

  CompareOptions raw;
  raw.normalize = false;
  const auto r = compare_bench(old_cases, new_cases, raw);
  EXPECT_EQ(find(r, "BM_A/real_time").time_verdict, "slower");
  EXPECT_THAT(r.text, HasSubstr("not applied (--no-normalize)"));
}

TEST(BenchCompareTest, AStepSlowerThanTheMachineIsSlower) {
  // The machine got 15% slower and the step 40%: 40/15 -> +21.7% of its own.
  const std::vector<double> ref{2.0, 2.02, 1.98, 2.01, 1.99};
  const auto c = compare_bench(cases_of({{"BM_Reference/cpu", ref}, {"BM_A", kSteady, kMiB}}),
                               cases_of({{"BM_Reference/cpu", scaled(ref, 1.15)}, {"BM_A", scaled(kSteady, 1.40), kMiB}}));
  const auto& a = find(c, "BM_A/real_time");
  EXPECT_NEAR(a.normalized_change_pct, 100.0 * (1.40 / 1.15 - 1.0), 1e-9);
  EXPECT_TRUE(c.noise_floor_pct.empty()) << "one case is too few for a between-run floor";
  EXPECT_EQ(a.time_verdict, "slower");
  EXPECT_TRUE(c.regressed);
}

TEST(BenchCompareTest, GpuCasesUseTheGpuReference) {
  // The CPU got 50% slower, the GPU did not: a GPU case at the same time is "same", not "faster".
  const std::vector<double> ref{2.0, 2.02, 1.98, 2.01, 1.99};
  const std::string gpu_case = "BM_TrainStep/gpu/fixture:x/bs:1";
  const auto c = compare_bench(
      cases_of({{"BM_Reference/cpu", ref}, {"BM_Reference/gpu", ref}, {gpu_case, kSteady, kMiB}}),
      cases_of({{"BM_Reference/cpu", scaled(ref, 1.5)}, {"BM_Reference/gpu", ref}, {gpu_case, kSteady, kMiB}}));
  const auto& g = find(c, gpu_case + "/real_time");
  EXPECT_NEAR(g.machine_factor, 1.0, 1e-9);
  EXPECT_EQ(g.time_verdict, "same");
  EXPECT_EQ(c.machine.size(), 2U);
}

TEST(BenchCompareTest, ANoisyReferenceWidensTheNoise) {
  const std::vector<double> steady_ref{2.0, 2.02, 1.98, 2.01, 1.99};
  const std::vector<double> noisy_ref{1.6, 2.4, 1.7, 2.3, 2.0};
  const auto run = [&](const std::vector<double>& ref) {
    return find(compare_bench(cases_of({{"BM_Reference/cpu", ref}, {"BM_A", kSteady, kMiB}}),
                              cases_of({{"BM_Reference/cpu", ref}, {"BM_A", scaled(kSteady, 1.3), kMiB}})),
                "BM_A/real_time");
  };
  const auto steady = run(steady_ref);
  const auto noisy = run(noisy_ref);
  EXPECT_GT(noisy.noise_seconds, 2.0 * steady.noise_seconds);
  EXPECT_EQ(steady.time_verdict, "slower");
  EXPECT_EQ(noisy.time_verdict, "same") << "a 30% change inside a reference that wanders by 20% is not a finding";
}

TEST(BenchCompareTest, AReferenceInOneRunOnlyComparesRawTimes) {
  const auto c = compare_bench(cases_of({{"BM_A", kSteady, kMiB}}),
                               cases_of({{"BM_Reference/cpu", {2.0, 2.1}}, {"BM_A", scaled(kSteady, 1.5), kMiB}}));
  EXPECT_TRUE(c.machine.empty());
  const auto& a = find(c, "BM_A/real_time");
  EXPECT_DOUBLE_EQ(a.machine_factor, 1.0);
  EXPECT_EQ(a.time_verdict, "slower");
  EXPECT_THAT(c.text, Not(HasSubstr("added:"))) << "a reference is no added case";
}

// `count` cases BM_C<i> of different speeds; in the new run case i is scaled by factor(i).
std::pair<std::map<std::string, BenchCase>, std::map<std::string, BenchCase>> many_cases(
    int count, const std::function<double(int)>& factor) {
  std::vector<FakeCase> old_cases;
  std::vector<FakeCase> new_cases;
  for (int i = 0; i < count; ++i) {
    const auto name = "BM_C" + std::to_string(i);
    const auto base = scaled(kSteady, 1.0 + 0.25 * i);
    old_cases.push_back({name, base, kMiB});
    new_cases.push_back({name, scaled(base, factor(i)), kMiB});
  }
  return {cases_of(old_cases), cases_of(new_cases)};
}

TEST(BenchCompareTest, TheBetweenRunNoiseFloorQuietsTwoRunsOfOneBuild) {
  // Every case wanders by up to 9% between the runs, each with a tight spread inside its run (as cases do across
  // processes on a shared runner): the repetition noise alone would call several of them slower or faster.
  const auto wander = [](int i) { return 1.0 + 0.09 * std::sin(2.3 * i); };
  const auto [old_cases, new_cases] = many_cases(20, wander);
  const auto c = compare_bench(old_cases, new_cases);
  ASSERT_EQ(c.noise_floor_pct.count("BM_Reference/cpu"), 1U);
  EXPECT_GT(c.noise_floor_pct.at("BM_Reference/cpu"), 9.0);
  EXPECT_THAT(c.text, HasSubstr("20 cases compared: 0 slower, 0 faster"));
  EXPECT_THAT(c.text, HasSubstr("between-run noise floor (cases measured by BM_Reference/cpu)"));
  EXPECT_FALSE(c.regressed);

  CompareOptions no_floor;
  no_floor.noise_floor = false;
  const auto raw = compare_bench(old_cases, new_cases, no_floor);
  EXPECT_TRUE(raw.noise_floor_pct.empty());
  EXPECT_TRUE(raw.regressed) << "without the floor the wandering reads as slower steps";

  // One case of the same two runs that got 60% slower stands out of the floor.
  auto [o2, n2] = many_cases(21, [&](int i) { return i == 20 ? 1.6 : wander(i); });
  const auto one = compare_bench(o2, n2);
  EXPECT_EQ(find(one, "BM_C20/real_time").time_verdict, "slower");
  int flagged = 0;
  for (const auto& x : one.cases) flagged += x.time_verdict != "same";
  EXPECT_EQ(flagged, 1);
}

TEST(BenchCompareTest, TheFloorDoesNotHideAStepThatGotSlowerEverywhere) {
  // A change that makes every step 30% slower (the reference, fixed LibTorch work, does not move).
  const auto [old_cases, new_cases] = many_cases(20, [](int i) { return 1.30 + 0.01 * std::sin(2.3 * i); });
  const auto c = compare_bench(old_cases, new_cases);
  EXPECT_LT(c.noise_floor_pct.at("BM_Reference/cpu"), 5.0);
  EXPECT_THAT(c.text, HasSubstr("20 cases compared: 20 slower"));
  EXPECT_TRUE(c.regressed);
}

TEST(BenchCompareTest, ProcessesMergeIntoOneRun) {
  // Two processes of one run: 3 and 2 repetitions of BM_A, and a GPU case that skipped in both.
  auto first = bench_doc({{"BM_A", {10.0, 11.0, 12.0}, kMiB}});
  auto second = bench_doc({{"BM_A", {13.0, 14.0}, kMiB}});
  for (auto* doc : {&first, &second}) {
    (*doc)["benchmarks"].push_back({{"name", "BM_Gpu/manual_time"},
                                    {"run_name", "BM_Gpu/manual_time"},
                                    {"run_type", "iteration"},
                                    {"error_occurred", true},
                                    {"error_message", "no GPU"}});
  }
  const auto merged = merge_bench_json({first, second}, "bench.json");
  EXPECT_EQ(merged["context"]["memgate_processes"], 2);
  EXPECT_EQ(merged["context"]["executable"], "memgate_bench");

  std::vector<nlohmann::json> runs;
  std::map<std::string, nlohmann::json> aggregates;
  for (const auto& b : merged["benchmarks"]) {
    if (b["run_name"] != "BM_A/real_time") continue;
    if (b["run_type"] == "iteration") runs.push_back(b);
    if (b["run_type"] == "aggregate") aggregates[b["aggregate_name"].get<std::string>()] = b;
  }
  ASSERT_EQ(runs.size(), 5U) << "the processes' aggregates are dropped, their repetitions kept";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i]["repetition_index"], i);
    EXPECT_EQ(runs[i]["repetitions"], 5);
    EXPECT_EQ(runs[i]["memgate_process"], i < 3 ? 0 : 1);
  }
  ASSERT_EQ(aggregates.size(), 4U);
  EXPECT_DOUBLE_EQ(aggregates["mean"]["real_time"].get<double>(), 12.0);
  EXPECT_DOUBLE_EQ(aggregates["median"]["real_time"].get<double>(), 12.0);
  EXPECT_NEAR(aggregates["stddev"]["real_time"].get<double>(), std::sqrt(2.5), 1e-12);
  EXPECT_NEAR(aggregates["cv"]["real_time"].get<double>(), std::sqrt(2.5) / 12.0, 1e-12);
  EXPECT_EQ(aggregates["cv"]["aggregate_unit"], "percentage");

  // What bench-compare reads back: all five repetitions, the peak, and the skipped case with its reason.
  const auto cases = parse_bench_json(merged, "bench.json");
  EXPECT_EQ(cases.at("BM_A/real_time").seconds.size(), 5U);
  EXPECT_NEAR(cases.at("BM_A/real_time").mean(), 0.012, 1e-12);
  EXPECT_DOUBLE_EQ(cases.at("BM_A/real_time").peak_bytes.value_or(0.0), kMiB);
  EXPECT_EQ(cases.at("BM_Gpu/manual_time").error, "no GPU");

  try {
    (void)merge_bench_json({first, nlohmann::json::array()}, "bench.json");
    ADD_FAILURE() << "a process without benchmarks must not merge";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("bench.json: part 1: not a Google Benchmark JSON file"));
  }
  EXPECT_THROW((void)merge_bench_json({}, "bench.json"), Error);
}

TEST(BenchCompareTest, MemoryConvertsToCustomSmallerIsBetter) {
  EXPECT_EQ(bench_memory_to_custom(cases_of({{"BM_Reference/cpu", kSteady, kMiB}})).size(), 0U)
      << "the machine reference is not a tracked memory series";
  const auto j = bench_memory_to_custom(cases_of({{"BM_A", kSteady, 12.5 * kMiB}}));
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 1U);
  EXPECT_EQ(j[0]["name"], "BM_A/real_time peak_allocated");
  EXPECT_EQ(j[0]["unit"], "MiB");
  EXPECT_DOUBLE_EQ(j[0]["value"].get<double>(), 12.5);
}

TEST(BenchInputTest, AnEmptyRunOrADirectoryIsAnErrorNamingIt) {
  testing::TempDir dir;
  testing::write_file(dir / "empty.json", "{\"benchmarks\": []}");
  auto error_of = [](const std::string& path) {
    try {
      (void)load_bench_json(path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of(dir / "empty.json").find("empty.json: no benchmarks in it"), std::string::npos);
  EXPECT_NE(error_of(dir.path().string()).find(": is a directory"), std::string::npos);
}

}  // namespace
}  // namespace memgate
