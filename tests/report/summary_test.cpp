// `memgate summary`'s Markdown: the verdict first, then what changed, the rest folded; strict reading of rows.
#include "memgate/base/error.h"
#include "memgate/report/summary.h"
#include "test_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace memgate {
namespace {

using ::testing::HasSubstr;

std::string row(const std::string& fixture, int bs, const std::string& component, const std::string& status,
                std::int64_t baseline, std::int64_t measured) {
  return "{\"device\": \"cpu\", \"fixture\": \"" + fixture + "\", \"batch_size\": " + std::to_string(bs) +
         ", \"component\": \"" + component + "\", \"status\": \"" + status + "\", \"baseline\": " +
         std::to_string(baseline) + ", \"measured\": " + std::to_string(measured) + "}\n";
}

TEST(SummaryTest, LeadsWithTheVerdictAndTheRowsThatChanged) {
  testing::TempDir dir;
  testing::write_file(dir / "r.jsonl", row("gpt_tiny", 1, "activations", "regression", 174600, 175474) +
                                           row("gpt_tiny", 1, "params", "ok", 1000, 1000) +
                                           row("vit_tiny", 2, "params", "ok", 2000, 2000));
  const auto s = summarize_results(dir / "r.jsonl");
  EXPECT_TRUE(s.failed);
  EXPECT_THAT(s.markdown, HasSubstr("## memgate memory gate: FAILED"));
  EXPECT_THAT(s.markdown, HasSubstr("**1** regressions"));
  const auto changed = s.markdown.find("### What changed");
  const auto details = s.markdown.find("<details>");
  ASSERT_NE(changed, std::string::npos) << s.markdown;
  ASSERT_LT(changed, details);
  const auto first_row = s.markdown.find("| cpu / gpt_tiny | 1 | activations | 170.5 KiB | 171.4 KiB | +874 B (+0.50%)");
  EXPECT_LT(first_row, details) << s.markdown;
  EXPECT_EQ(s.markdown.find("| cpu / vit_tiny"), std::string::npos) << "unchanged rows stay folded";
}

// The HTML view of a changed fixture: its baseline against this run, at the batch sizes where every component has
// both; unchanged fixtures get none.
TEST(SummaryTest, ComparesEachChangedFixturesBaselineWithThisRun) {
  testing::TempDir dir;
  std::string rows;
  std::int64_t k = 0;
  for (const auto& info : kComponentTable) {
    ++k;
    const bool grew = info.name == "activations";
    rows += row("gpt_tiny", 2, std::string(info.name), grew ? "regression" : "ok", 1000 * k, 1000 * k + (grew ? 90 : 0));
    rows += row("vit_tiny", 2, std::string(info.name), "ok", 10 * k, 10 * k);
  }
  rows += row("gpt_tiny", 4, "params", "ok", 5, 5);  // a batch size with one component only: not compared
  testing::write_file(dir / "r.jsonl", rows);
  const auto s = summarize_results(dir / "r.jsonl");
  ASSERT_EQ(s.comparisons.size(), 1U);
  const auto& c = s.comparisons[0];
  EXPECT_EQ(c.title, "cpu / gpt_tiny");
  EXPECT_EQ(c.documents[0].label, "baseline");
  EXPECT_EQ(c.documents[1].label, "this run");
  EXPECT_EQ(c.comparison.common_batch_sizes, std::vector<std::int64_t>{2});
  bool found = false;
  for (const auto& d : c.comparison.differences) {
    if (d.component == "activations") {
      found = true;
      EXPECT_EQ(d.reference, 4000);
      EXPECT_EQ(d.delta(), 90);
    } else {
      EXPECT_EQ(d.delta(), 0) << d.component;
    }
  }
  EXPECT_TRUE(found);
  const auto html = render_comparisons_html(s.comparisons, {});
  EXPECT_NE(html.find("cpu / gpt_tiny"), std::string::npos);
  EXPECT_EQ(html.find("vit_tiny"), std::string::npos);
}

// A GPU suite split across runners: each runner's results file, one report; a regression on any runner fails it.
TEST(SummaryTest, ResultsOfSeveralRunnersMakeOneReport) {
  testing::TempDir dir;
  testing::write_file(dir / "runner1.jsonl", row("retfound_large_lora", 32, "params", "ok", 1000, 1000));
  testing::write_file(dir / "runner2.jsonl", row("lisa_7b_bf16", 2, "activations", "regression", 100, 200) +
                                                 row("lisa_7b_bf16", 2, "params", "ok", 10, 10));
  const auto s = summarize_results(std::vector<std::string>{dir / "runner1.jsonl", dir / "runner2.jsonl"});
  EXPECT_TRUE(s.failed) << "runner 2's regression";
  EXPECT_THAT(s.markdown, HasSubstr("of 3 components in 2 fixtures"));
  EXPECT_THAT(s.markdown, HasSubstr("| cpu / lisa_7b_bf16 | 2 | activations"));
  const auto one = summarize_results(std::vector<std::string>{dir / "runner1.jsonl"});
  EXPECT_FALSE(one.failed);
  EXPECT_THROW((void)summarize_results(std::vector<std::string>{dir / "runner1.jsonl", dir / "missing.jsonl"}), Error);
}

TEST(SummaryTest, AllEqualSaysSo) {
  testing::TempDir dir;
  testing::write_file(dir / "r.jsonl", row("a", 1, "params", "ok", 10, 10));
  const auto s = summarize_results(dir / "r.jsonl");
  EXPECT_FALSE(s.failed);
  EXPECT_THAT(s.markdown, HasSubstr("memgate memory gate: passed"));
  EXPECT_THAT(s.markdown, HasSubstr("equals its baseline to the byte"));
}

TEST(SummaryTest, BadRowsNameTheFileLineAndField) {
  testing::TempDir dir;
  const auto expect_error = [&](const std::string& text, const std::string& what) {
    testing::write_file(dir / "bad.jsonl", text);
    try {
      (void)summarize_results(dir / "bad.jsonl");
      ADD_FAILURE() << "no error for " << text;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(what)) << text;
    }
  };
  expect_error(row("a", 1, "params", "ok", 1, 1) + "{\"device\": \"cpu\", \"fixture\": \"a\", \"batch_size\": 1, "
               "\"component\": \"params\", \"status\": \"ok\", \"baseline\": 5}\n",
               "bad.jsonl:2: `baseline` and `measured`: expected both or neither");
  expect_error("{\"device\": \"cpu\", \"fixture\": \"a\", \"batch_size\": 1, \"component\": \"params\", "
               "\"status\": \"fine\"}\n", "bad.jsonl:1: `status`: expected one of ok");
  expect_error("[1, 2]\n", "bad.jsonl:1: not a JSON object");
  expect_error("", "no results");
  EXPECT_THROW((void)summarize_results(dir.path().string()), Error) << "a directory is no results file";
}

}  // namespace
}  // namespace memgate
