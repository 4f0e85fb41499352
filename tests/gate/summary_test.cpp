// `memgate summary`'s Markdown: the verdict first, then what changed, the rest folded; strict reading of rows.
#include "memgate/base/error.h"
#include "memgate/gate/summary.h"
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
