// `memgate summary`'s Markdown: the verdict first, then what changed, the rest folded; strict reading of rows.
#include "memgate/base/error.h"
#include "memgate/report/summary.h"
#include "memgate/report/svg_chart.h"
#include "test_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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

// Every cell of every table: a `|` in a name (a module called x|y) must not split its row, a backquote must not end
// a code span early. A row's cells are counted by its unescaped `|`.
TEST(SummaryTest, EscapesPipesAndBackquotesInEveryCell) {
  const auto unescaped_pipes = [](const std::string& line) {
    int n = 0;
    for (std::size_t i = 0; i < line.size(); ++i) n += line[i] == '|' && (i == 0 || line[i - 1] != '\\');
    return n;
  };
  nlohmann::json r = {{"device", "c`pu"}, {"fixture", "a|b"}, {"batch_size", 1}, {"component", "params"},
                      {"status", "regression"}, {"baseline", 100}, {"measured", 200},
                      {"modules", {{{"module", "blocks.0|attn`q"}, {"baseline", 10}, {"measured", 110}}}}};
  const auto s = summarize_result_rows({r});
  int rows = 0;
  for (std::size_t at = 0, end; at < s.markdown.size(); at = end + 1) {
    end = s.markdown.find('\n', at);
    if (end == std::string::npos) end = s.markdown.size();
    const auto line = s.markdown.substr(at, end - at);
    if (!line.starts_with("| ")) continue;
    ++rows;
    // What changed: 8 cells (9 bars); each fixture's table: 6 cells (7 bars).
    EXPECT_TRUE(unescaped_pipes(line) == 9 || unescaped_pipes(line) == 7) << line;
    if (line.find("a\\|b") != std::string::npos) EXPECT_THAT(line, HasSubstr("``blocks.0\\|attn`q``")) << line;
  }
  EXPECT_EQ(rows, 4) << s.markdown;  // two headers and a row in each table
  EXPECT_THAT(s.markdown, HasSubstr("| c\\`pu / a\\|b | 1 | params |"));
}

TEST(MarkdownTest, CodeSpansTakeAFenceLongerThanTheBackquotesTheyHold) {
  EXPECT_EQ(markdown_code("blocks.0"), "`blocks.0`");
  EXPECT_EQ(markdown_code("a`b|c"), "``a`b\\|c``");
  EXPECT_EQ(markdown_code("``x"), "``` ``x ```");
  EXPECT_EQ(markdown_code("two\nlines"), "`two lines`");
  EXPECT_EQ(markdown_text("a|b`c\\d\ne"), "a\\|b\\`c\\\\d e");
  EXPECT_EQ(markdown_text("ti\xffny"), "ti\xEF\xBF\xBDny");
}

TEST(Utf8Test, ReplacesEachInvalidByteAndKeepsEveryValidSequence) {
  EXPECT_EQ(valid_utf8("plain"), "plain");
  EXPECT_EQ(valid_utf8("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"), "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");
  const std::string r = "\xEF\xBF\xBD";  // U+FFFD
  EXPECT_EQ(valid_utf8("ti\xffny"), "ti" + r + "ny");
  EXPECT_EQ(valid_utf8("\xC0\xAF"), r + r) << "an overlong '/'";
  EXPECT_EQ(valid_utf8("\xED\xA0\x80"), r + r + r) << "a surrogate";
  EXPECT_EQ(valid_utf8("\xF4\x90\x80\x80"), r + r + r + r) << "beyond U+10FFFF";
  EXPECT_EQ(valid_utf8("x\xE2\x82"), "x" + r + r) << "cut short";
  EXPECT_EQ(valid_utf8("\xE2\x82" "a"), r + r + "a");
}

// JUnit of a fixture whose file name is not UTF-8, with a message holding a control character: well-formed XML (UTF-8,
// no character XML 1.0 forbids), the name recognisable.
TEST(JunitTest, KeepsANameThatIsNotUtf8AndDropsControlCharacters) {
  nlohmann::json r = {{"device", "cpu"}, {"fixture", "ti\xffny"}, {"batch_size", 1}, {"component", "params"},
                      {"status", "regression"}, {"baseline", 1}, {"measured", 2}, {"message", "grew\x01 a <lot>"}};
  const auto xml = render_junit({r}, {{"b\xfe.yaml", "b\xfe.yaml: bad\x02"}}, false);
  EXPECT_EQ(valid_utf8(xml), xml);
  EXPECT_THAT(xml, HasSubstr("name=\"ti\xEF\xBF\xBDny_bs1_params\""));
  EXPECT_THAT(xml, HasSubstr("message=\"grew a &lt;lot&gt;\""));
  EXPECT_THAT(xml, HasSubstr("<testsuite name=\"b\xEF\xBF\xBD.yaml\""));
  for (const char c : xml) EXPECT_FALSE(static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t' && c != '\r');
}

}  // namespace
}  // namespace memgate
