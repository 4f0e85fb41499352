// `memgate check`'s reports from verdicts built in memory (report/check_report.h): the screen it prints, JSON, JUnit
// XML, Markdown, HTML and the step summary, without a probe or a process.
#include "memgate/report/check_report.h"
#include "memgate/report/svg_chart.h"
#include "test_util.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace memgate {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// Sets an environment variable for one test (nullptr: unsets it), and puts back what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// The components every probe of a fixture without EMA has, as the gate judges them.
const std::vector<std::string> kComponents{"params",     "gradients",  "optimizer_state", "activations",
                                           "forward_peak", "eval_peak", "step_peak",      "step_peak_reserved"};

CheckedComponent judged(const std::string& fixture, std::int64_t batch, const std::string& component, Status status,
                        std::optional<std::int64_t> baseline, std::optional<std::int64_t> measured,
                        std::string message = "", bool fails = false, const std::string& device = "cpu") {
  ComponentVerdict v;
  v.status = status;
  v.fixture = fixture;
  v.batch_size = batch;
  v.component = component;
  v.baseline = baseline;
  v.measured = measured;
  if (baseline && measured) v.allowed = *baseline / 400;
  v.message = std::move(message);
  return {.verdict = std::move(v), .device = device, .fails = fails};
}

// A fixture at one batch size whose components all equal their baselines.
std::vector<CheckedComponent> all_ok(const std::string& fixture, std::int64_t batch, const std::string& device = "cpu") {
  std::vector<CheckedComponent> out;
  std::int64_t bytes = 1 << 20;
  for (const auto& c : kComponents) {
    out.push_back(judged(fixture, batch, c, Status::kOk, bytes, bytes, "", false, device));
    bytes += 1 << 18;
  }
  return out;
}

CheckedComponent& find(CheckReport& report, const std::string& component) {
  for (auto& c : report.components) {
    if (c.verdict.component == component) return c;
  }
  throw std::runtime_error("no " + component);
}

const nlohmann::json& row_of(const nlohmann::json& doc, const std::string& test) {
  for (const auto& row : doc.at("results")) {
    if (row.at("test") == test) return row;
  }
  throw std::runtime_error("no row " + test);
}

constexpr const char* kGrewMessage =
    "reported at batch 2: activations grew beyond its baseline: 1.5 MiB -> 1.7 MiB (+10.00%)\n"
    "  If this growth is intended, record the new baseline: memgate check --update-baselines --config reported.yaml";

// `reported` at batch 2 with its activations 10% above the baseline: a regression, as the gate judges it.
CheckReport grown_report() {
  CheckReport report{.components = all_ok("reported", 2), .probes = 1, .device = "cpu", .compared = 8};
  auto& grew = find(report, "activations");
  grew.verdict.status = Status::kRegression;
  grew.verdict.measured = *grew.verdict.baseline * 11 / 10;
  grew.verdict.message = kGrewMessage;
  grew.verdict.modules = {{"blocks.0.attn", 4096, 65536}};
  grew.fails = true;
  return report;
}

TEST(CheckReportTest, APassingCheckSaysPassedInEveryFormat) {
  const CheckReport report{.components = all_ok("steady", 4), .probes = 1, .device = "cpu", .compared = 8};
  EXPECT_EQ(check_verdict(report), "passed");
  EXPECT_EQ(check_counts(report), "1 probes on cpu, 8 components compared with a baseline: 8 ok");
  EXPECT_EQ(render_check_screen(report),
            "memgate check: passed (1 probes on cpu, 8 components compared with a baseline): 8 ok\n")
      << "nothing not ok: no table";

  const auto doc = nlohmann::json::parse(render_check_json(report));
  EXPECT_EQ(doc.at("verdict"), "passed");
  EXPECT_EQ(doc.at("summary"), check_counts(report));
  ASSERT_EQ(doc.at("results").size(), 8U);
  for (const auto& row : doc.at("results")) {
    EXPECT_EQ(row.at("device"), "cpu");
    EXPECT_EQ(row.at("status"), "ok");
    EXPECT_EQ(row.at("fails"), false);
    EXPECT_FALSE(row.contains("differs"));
  }
  EXPECT_EQ(doc.at("results")[3].at("test"), "steady_bs4_activations") << "in the order judged";
  EXPECT_EQ(doc.at("not_judged"), nlohmann::json::array());

  const auto xml = render_check_junit(report);
  EXPECT_THAT(xml, StartsWith("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"memgate check\" "
                              "tests=\"8\" failures=\"0\" errors=\"0\" skipped=\"0\">\n"));
  EXPECT_THAT(xml, HasSubstr("  <testsuite name=\"steady\" tests=\"8\" failures=\"0\" errors=\"0\" skipped=\"0\">\n"
                             "    <testcase classname=\"memgate.steady\" name=\"steady_bs4_params\"/>\n"));
  EXPECT_THAT(xml, EndsWith("  </testsuite>\n</testsuites>\n"));

  const auto md = render_check_markdown(report);
  EXPECT_THAT(md, StartsWith("## memgate memory gate: passed\n\n`memgate check`: 1 probes on cpu, 8 components "
                             "compared with a baseline: 8 ok\n"));
  EXPECT_THAT(md, HasSubstr("Every measured component equals its baseline to the byte."));
  EXPECT_THAT(md, Not(HasSubstr("What changed")));

  const auto html = render_check_html(report, "memgate 9.9.9");
  EXPECT_THAT(html, HasSubstr("<h1>memgate check: baseline against this run, per changed fixture</h1>"));
  EXPECT_THAT(html, HasSubstr("Nothing to compare."));
  EXPECT_THAT(html, HasSubstr("memgate 9.9.9"));
}

// A grown component is a failure with the gate's message in each format: its row in the JSON, a JUnit <failure>, the
// Markdown's "What changed", the screen's table with the message under it, and the HTML's baseline against this run.
TEST(CheckReportTest, AGrownComponentFailsWithTheGatesMessageInEveryFormat) {
  const auto report = grown_report();
  EXPECT_EQ(check_verdict(report), "FAILED");

  const auto doc = nlohmann::json::parse(render_check_json(report));
  EXPECT_EQ(doc.at("verdict"), "FAILED");
  EXPECT_THAT(doc.at("summary").get<std::string>(), HasSubstr("8 components compared with a baseline: 7 ok, 1 regression"));
  ASSERT_EQ(doc.at("results").size(), 8U);
  int regressions = 0;
  for (const auto& row : doc.at("results")) {
    EXPECT_EQ(row.at("device"), "cpu");
    EXPECT_EQ(row.at("batch_size"), 2);
    if (row.at("status") != "regression") continue;
    ++regressions;
    EXPECT_EQ(row.at("test"), "reported_bs2_activations");
    EXPECT_EQ(row.at("fails"), true);
    EXPECT_GT(row.at("measured").get<std::int64_t>(), row.at("baseline").get<std::int64_t>());
    EXPECT_EQ(row.at("message"), kGrewMessage);
    EXPECT_EQ(row.at("modules")[0].at("module"), "blocks.0.attn");
  }
  EXPECT_EQ(regressions, 1);

  const auto xml = render_check_junit(report);
  EXPECT_THAT(xml, HasSubstr("tests=\"8\" failures=\"1\" errors=\"0\" skipped=\"0\">"));
  EXPECT_THAT(xml, HasSubstr("<testcase classname=\"memgate.reported\" name=\"reported_bs2_activations\">\n"
                             "      <failure type=\"regression\" message=\"reported at batch 2: activations grew beyond "
                             "its baseline: 1.5 MiB -&gt; 1.7 MiB (+10.00%)\">reported at batch 2: activations grew "
                             "beyond its baseline"));
  EXPECT_THAT(xml, HasSubstr("If this growth is intended, record the new baseline"));
  EXPECT_EQ(std::count(xml.begin(), xml.end(), '<') - std::count(xml.begin(), xml.end(), '>'), 0);

  const auto md = render_check_markdown(report);
  EXPECT_THAT(md, StartsWith("## memgate memory gate: FAILED\n"));
  EXPECT_THAT(md, HasSubstr("| cpu / reported | 2 | activations |"));
  EXPECT_THAT(md, HasSubstr("**REGRESSION**"));
  EXPECT_THAT(md, HasSubstr("+60.0 KiB in `blocks.0.attn`")) << "the module that changed most";
  EXPECT_THAT(md, HasSubstr("**8** compared with a baseline"));

  const auto screen = render_check_screen(report);
  EXPECT_THAT(screen, StartsWith("status      test                                         baseline"));
  EXPECT_THAT(screen, HasSubstr("regression  reported_bs2_activations"));
  EXPECT_THAT(screen, HasSubstr("+10.00%  +60.0 KiB blocks.0.attn\n"));
  EXPECT_THAT(screen, HasSubstr("\n  reported at batch 2: activations grew beyond its baseline: 1.5 MiB -> 1.7 MiB "
                                "(+10.00%)\n    If this growth is intended")) << "the message under its row, indented";
  EXPECT_THAT(screen, EndsWith("memgate check: FAILED (1 probes on cpu, 8 components compared with a baseline): 7 ok, "
                               "1 regression\n"));

  const auto html = render_check_html(report, "memgate 9.9.9");
  EXPECT_THAT(html, HasSubstr("<section class=\"comparison\" id=\"comparison-0\"><h1>cpu / reported</h1>"));
  EXPECT_THAT(html, HasSubstr("<h2>By module</h2>"));
  EXPECT_THAT(html, HasSubstr("blocks.0.attn"));
  EXPECT_THAT(html, Not(HasSubstr("Nothing to compare.")));
}

// A missing baseline: skipped where it does not fail (on a desk), a failure where it does (strict, or under CI); the
// screen says where it was looked for and how to record it, once for all of them.
TEST(CheckReportTest, AMissingBaselineSaysWhereItWasLookedForAndHowToRecordIt) {
  const ScopedEnv no_ci("CI", nullptr), no_strict("MEMGATE_STRICT", nullptr);
  CheckReport report{.probes = 1, .device = "cpu", .compared = 0, .searched = {"/p/baselines/cpu"},
                     .record_hint = "memgate check --update-baselines --config new.yaml"};
  for (const auto& c : kComponents) {
    report.components.push_back(judged("new", 2, c, Status::kMissing, std::nullopt, std::nullopt,
                                       "no baseline /p/baselines/cpu/new.json for device cpu"));
  }
  const auto screen = render_check_screen(report);
  EXPECT_EQ(screen, "memgate check: passed (1 probes on cpu, 0 components compared with a baseline): 8 missing\n"
                    "  8 components have no baseline (looked in /p/baselines/cpu); record them with: memgate check "
                    "--update-baselines --config new.yaml; NOTHING WAS COMPARED: this pass checked nothing\n")
      << "no table: a missing baseline is said once";
  EXPECT_THAT(render_check_junit(report), HasSubstr("tests=\"8\" failures=\"0\" errors=\"0\" skipped=\"8\">"));
  EXPECT_THAT(render_check_junit(report),
              HasSubstr("<skipped message=\"no baseline /p/baselines/cpu/new.json for device cpu\"/>"));
  EXPECT_THAT(render_check_markdown(report), HasSubstr("no baseline"));
  EXPECT_THAT(render_check_markdown(report), HasSubstr("**0** compared with a baseline"));
  EXPECT_THAT(render_check_markdown(report), HasSubstr("Nothing was compared"));

  // One component compared beside one missing: no shout.
  auto one = report;
  one.components.resize(1);
  one.compared = 1;
  one.components.push_back(judged("old", 2, "params", Status::kOk, 10, 10));
  EXPECT_THAT(render_check_screen(one), EndsWith("1 component has no baseline (looked in /p/baselines/cpu); record it "
                                                 "with: memgate check --update-baselines --config new.yaml\n"));

  // Under CI, and in strict mode, it fails, and the screen says why.
  for (auto& c : report.components) c.fails = true;
  report.missing_fails = true;
  EXPECT_EQ(check_verdict(report), "FAILED");
  EXPECT_THAT(render_check_screen(report),
              EndsWith("; under CI (CI=true) a missing baseline fails: a gate that compared nothing is not a pass "
                       "(MEMGATE_STRICT=0 lets it pass)\n"));
  EXPECT_EQ(nlohmann::json::parse(render_check_json(report)).at("results")[0].at("fails"), true);
  report.strict = true;
  EXPECT_THAT(render_check_screen(report), EndsWith("; strict mode fails a missing baseline\n"));
  EXPECT_THAT(render_check_junit(report), HasSubstr("tests=\"8\" failures=\"8\" errors=\"0\" skipped=\"0\">"));
  EXPECT_THAT(render_check_junit(report), HasSubstr("<failure type=\"missing\""));
}

// A budget that a GPU cannot hold (the component is the GPU): an over-budget failure in each format.
TEST(CheckReportTest, ABudgetThatDoesNotFitFailsInEveryFormat) {
  CheckReport report{.probes = 1, .device = "cuda:0", .compared = 0};
  report.components.push_back(judged("vit_big", 64, "a100_40gb", Status::kOverBudget, 40LL << 30, 45LL << 30,
                                     "vit_big at batch 64 does not fit A100 40GB: needs 48318382080 bytes", true,
                                     "cuda"));
  report.components.push_back(judged("vit_big", 8, "a100_40gb", Status::kOk, 40LL << 30, 10LL << 30,
                                     "vit_big at batch 8 fits A100 40GB", false, "cuda"));
  EXPECT_EQ(check_verdict(report), "FAILED");
  const auto screen = render_check_screen(report);
  EXPECT_THAT(screen, HasSubstr("over-budget vit_big_bs64_a100_40gb"));
  EXPECT_THAT(screen, HasSubstr("40.00 GiB    45.00 GiB     +5.00 GiB   +12.50%  -\n"));
  EXPECT_THAT(screen, Not(HasSubstr("vit_big_bs8_a100_40gb"))) << "what is ok stays off the table";
  EXPECT_THAT(screen, HasSubstr("1 ok, 1 over-budget\n"));
  const auto xml = render_check_junit(report);
  EXPECT_THAT(xml, HasSubstr("<failure type=\"over-budget\" message=\"vit_big at batch 64 does not fit A100 40GB"));
  EXPECT_THAT(xml, HasSubstr("<system-out>ok: vit_big at batch 8 fits A100 40GB</system-out>"))
      << "a passing verdict with a message keeps it";
  EXPECT_THAT(render_check_markdown(report), HasSubstr("| cuda / vit_big | 64 | a100_40gb |"));
  EXPECT_THAT(render_check_markdown(report), HasSubstr("**over budget**"));
  EXPECT_EQ(nlohmann::json::parse(render_check_json(report)).at("results")[0].at("status"), "over-budget");
  EXPECT_THAT(render_check_html(report, "memgate"), HasSubstr("Nothing to compare.")) << "a GPU is not a component";
}

// Verdicts of one fixture on two devices are reported apart: a row each with its device in the JSON, a section each
// in the Markdown and the HTML.
TEST(CheckReportTest, SeveralDevicesAreReportedApart) {
  CheckReport report{.probes = 2, .device = "cuda:0", .compared = 16};
  for (auto& c : all_ok("vit", 8, "a100")) report.components.push_back(std::move(c));
  for (auto& c : all_ok("vit", 8, "h100")) report.components.push_back(std::move(c));
  report.components[11].verdict.status = Status::kStale;
  report.components[11].verdict.measured = *report.components[11].verdict.baseline / 2;
  report.components[11].verdict.message = "vit at batch 8: activations shrank";
  const auto doc = nlohmann::json::parse(render_check_json(report));
  EXPECT_EQ(doc.at("results")[0].at("device"), "a100");
  EXPECT_EQ(doc.at("results")[11].at("device"), "h100");
  EXPECT_EQ(doc.at("summary"), "2 probes on cuda:0, 16 components compared with a baseline: 15 ok, 1 stale");
  const auto md = render_check_markdown(report);
  EXPECT_THAT(md, HasSubstr("### a100 / vit\n"));
  EXPECT_THAT(md, HasSubstr("### h100 / vit\n"));
  EXPECT_THAT(md, HasSubstr("| h100 / vit | 8 | activations |"));
  EXPECT_THAT(md, Not(HasSubstr("| a100 / vit | 8 |"))) << "a100 did not change";
  const auto html = render_check_html(report, "memgate");
  EXPECT_THAT(html, HasSubstr("<h1>h100 / vit</h1>"));
  EXPECT_THAT(html, Not(HasSubstr("<h1>a100 / vit</h1>")));
  EXPECT_THAT(render_check_screen(report), HasSubstr("stale       vit_bs8_activations"));
  EXPECT_EQ(check_verdict(report), "passed") << "stale passes where it does not fail";
}

// Names with XML's and HTML's specials, a Markdown table's pipe and backquote, a control character and a byte that is
// not UTF-8: each format stays well formed.
TEST(CheckReportTest, OddNamesAreEscapedInXmlHtmlAndMarkdown) {
  const std::string odd = "a<b>&\"c'|d`e\x01\xff";
  CheckReport report{.components = all_ok(odd, 1), .probes = 1, .device = "cpu", .compared = 8};
  auto& grew = find(report, "params");
  grew.verdict.status = Status::kRegression;
  grew.verdict.measured = *grew.verdict.baseline * 2;
  grew.verdict.message = "grew: <" + odd + ">";
  grew.fails = true;
  report.not_judged.push_back({"x<y|z.yaml", "x<y|z.yaml:3: bad & worse\nsecond line"});
  const auto xml = render_check_junit(report);
  EXPECT_THAT(xml, HasSubstr("<testsuite name=\"a&lt;b&gt;&amp;&quot;c&#39;|d`e\xEF\xBF\xBD\""))
      << "valid UTF-8: the byte that was not is U+FFFD";
  EXPECT_THAT(xml, HasSubstr("<failure type=\"regression\" message=\"grew: &lt;a&lt;b&gt;&amp;&quot;c&#39;|d`e"));
  EXPECT_THAT(xml, HasSubstr("<error type=\"not judged\" message=\"x&lt;y|z.yaml:3: bad &amp; worse\">"));
  EXPECT_EQ(xml.find('\x01'), std::string::npos) << "XML 1.0 holds no control characters";
  EXPECT_EQ(xml.find(odd), std::string::npos);

  const auto html = render_check_html(report, "memgate");
  EXPECT_THAT(html, HasSubstr("<h1>cpu / a&lt;b&gt;&amp;&quot;c&#39;|d`e"));
  EXPECT_EQ(html.find("a<b>"), std::string::npos);

  const auto md = render_check_markdown(report);
  EXPECT_THAT(md, HasSubstr("| cpu / a<b>&\"c'\\|d\\`e\x01\xEF\xBF\xBD | 1 | params |")) << "the pipe stays in its cell";
  EXPECT_THAT(md, HasSubstr("- `x<y\\|z.yaml`: x<y\\|z.yaml:3: bad & worse\n")) << "the first line of the error";
  EXPECT_EQ(md.find("second line"), std::string::npos);

  const auto json = render_check_json(report);
  EXPECT_TRUE(nlohmann::json::accept(json)) << "bytes that are not UTF-8 replaced";
  EXPECT_THAT(json, HasSubstr("d`e\\u0001\xEF\xBF\xBD"));

  // A fixture file whose name is not UTF-8, not judged: the byte is U+FFFD in each format, and each stays UTF-8.
  report.not_judged.push_back({"/p/ti\xffny.yaml", "/p/ti\xffny.yaml:1: name: expected letters, digits"});
  const std::string kept = "/p/ti\xEF\xBF\xBDny.yaml";
  EXPECT_EQ(nlohmann::json::parse(render_check_json(report)).at("not_judged")[1].at("fixture"), kept);
  EXPECT_THAT(render_check_junit(report), HasSubstr("<error type=\"not judged\" message=\"" + kept + ":1: name:"));
  EXPECT_THAT(render_check_markdown(report), HasSubstr("- `" + kept + "`: " + kept + ":1: name:"));
  for (const auto& text : {render_check_junit(report), render_check_markdown(report), render_check_html(report, "m")}) {
    EXPECT_EQ(valid_utf8(text), text);
  }
}

// A change that grows every component at every batch size reads in one screen: a table of what is not ok, the largest
// change first, the gate's message under the first three rows, the rest folded into a count; the JSON keeps them all.
TEST(CheckReportTest, AFailingCheckReadsInOneScreen) {
  CheckReport report{.probes = 3, .device = "cpu", .compared = 24};
  for (const std::int64_t b : {1, 2, 4}) {
    for (const auto& c : kComponents) {
      // Each batch size's components grown by another fraction: batch 4's activations by the most.
      const std::int64_t pct = (c == "activations" ? 20 : 10) + b;
      report.components.push_back(judged("wide", b, c, Status::kRegression, 100000, 100000 + 1000 * pct,
                                         fmt::format("wide at batch {}: {} grew\n  by module: x", b, c), true));
    }
  }
  const auto screen = render_check_screen(report);
  EXPECT_LE(std::count(screen.begin(), screen.end(), '\n'), 40) << screen;
  EXPECT_THAT(screen, HasSubstr("regression  wide_bs4_activations"));
  EXPECT_LT(screen.find("wide_bs4_activations"), screen.find("wide_bs1_activations")) << "the largest change first";
  EXPECT_LT(screen.find("wide_bs1_activations"), screen.find("wide_bs4_params")) << screen;
  EXPECT_EQ(testing::count(screen, "\n  wide at batch"), 3) << "a message under the first three rows only";
  EXPECT_THAT(screen, HasSubstr("\n  wide at batch 4: activations grew\n    by module: x\n"));
  EXPECT_THAT(screen, HasSubstr("... and 9 more not ok (every one, with its message: --json FILE or --junit FILE)"));
  EXPECT_THAT(screen, HasSubstr("24 components compared with a baseline): 24 regression\n"));
  EXPECT_EQ(nlohmann::json::parse(render_check_json(report)).at("results").size(), 24U) << "none folded";

  // Up to fifteen rows: each shown, the messages beyond the third counted.
  report.components.resize(5);
  EXPECT_THAT(render_check_screen(report), HasSubstr("(the messages of the other 2: --json FILE or --junit FILE)\n"));
  // What fails comes before what does not, however large the change.
  report.components[4].verdict.status = Status::kStale;
  report.components[4].verdict.measured = 1;
  report.components[4].fails = false;
  const auto mixed = render_check_screen(report);
  EXPECT_LT(mixed.find("wide_bs1_activations"), mixed.find("stale       wide_bs1_forward_peak")) << mixed;
}

// --exact: a component within its tolerance whose bytes are not its baseline's is a difference of its own: a row
// "differs" with the bytes, counted as "differs", failing the gate; the JSON marks it.
TEST(CheckReportTest, ExactCountsAComponentThatDiffersOnItsOwn) {
  CheckReport report{.components = all_ok("exact", 1), .probes = 1, .device = "cpu", .compared = 8, .strict = true};
  auto& moved = find(report, "gradients");
  moved.verdict.measured = *moved.verdict.baseline + 512;
  moved.differs = true;
  EXPECT_EQ(check_verdict(report), "FAILED");
  const auto screen = render_check_screen(report);
  EXPECT_THAT(screen, HasSubstr("differs     exact_bs1_gradients"));
  EXPECT_THAT(screen, HasSubstr("\n  baseline 1310720 bytes, measured 1311232 (+512 bytes); --exact wants the same "
                                "bytes\n"));
  EXPECT_THAT(screen, EndsWith("8 components compared with a baseline): 7 ok, 1 differs\n"));
  const auto row = row_of(nlohmann::json::parse(render_check_json(report)), "exact_bs1_gradients");
  EXPECT_EQ(row.at("differs"), true);
  EXPECT_EQ(row.at("fails"), true);
  EXPECT_EQ(row.at("status"), "ok") << "the gate's own status, as it judged it";
}

// A fixture that could not be judged: the check's verdict is ERROR, the JSON lists it, JUnit has an <error>, the
// Markdown a section with the first line of its error; a check that judged nothing says so.
TEST(CheckReportTest, AFixtureNotJudgedIsAnErrorInEveryFormat) {
  auto report = grown_report();
  report.not_judged.push_back({"broken.yaml", "broken.yaml:4: model.colour: unknown key\n  expected one of ..."});
  EXPECT_EQ(check_verdict(report), "ERROR");
  EXPECT_THAT(render_check_screen(report),
              EndsWith("memgate check: ERROR (1 probes on cpu, 8 components compared with a baseline): 7 ok, "
                       "1 regression, 1 fixture not judged\n"));
  const auto doc = nlohmann::json::parse(render_check_json(report));
  EXPECT_EQ(doc.at("verdict"), "ERROR");
  ASSERT_EQ(doc.at("not_judged").size(), 1U);
  EXPECT_EQ(doc.at("not_judged")[0].at("fixture"), "broken.yaml");
  EXPECT_THAT(doc.at("not_judged")[0].at("error").get<std::string>(), HasSubstr("colour"));
  const auto xml = render_check_junit(report);
  EXPECT_THAT(xml, HasSubstr("<testsuites name=\"memgate check\" tests=\"9\" failures=\"1\" errors=\"1\" skipped=\"0\">"));
  EXPECT_THAT(xml, HasSubstr("<testcase classname=\"memgate.broken.yaml\" name=\"broken.yaml\">\n      <error type=\"not "
                             "judged\" message=\"broken.yaml:4: model.colour: unknown key\">"));
  const auto md = render_check_markdown(report);
  EXPECT_THAT(md, StartsWith("## memgate memory gate: ERROR\n"));
  EXPECT_THAT(md, EndsWith("\n### Not judged (1)\n\n- `broken.yaml`: broken.yaml:4: model.colour: unknown key\n"));

  CheckReport nothing{.probes = 0, .device = "cpu"};
  nothing.not_judged = {{"a.yaml", "a"}, {"b.yaml", "b"}};
  EXPECT_EQ(check_counts(nothing), "0 probes on cpu, 0 components compared with a baseline: 2 fixtures not judged");
  EXPECT_THAT(render_check_markdown(nothing), StartsWith("## memgate memory gate: ERROR\n\n`memgate check`: 0 probes "
                                                         "on cpu, 0 components compared with a baseline: 2 fixtures "
                                                         "not judged\n\nNothing was judged.\n"));
  EXPECT_THAT(render_check_html(nothing, "memgate"), HasSubstr("Nothing to compare."));
  nothing.not_judged.clear();
  EXPECT_EQ(check_counts(nothing), "0 probes on cpu, 0 components compared with a baseline: nothing to judge");
  EXPECT_EQ(check_verdict(nothing), "passed");
}

// $GITHUB_STEP_SUMMARY gets the Markdown, appended after what earlier steps wrote: it starts with its own heading and
// ends its last line, so that the next step's starts a line of its own.
TEST(CheckReportTest, TheStepSummaryIsAHeadedMarkdownThatEndsItsLastLine) {
  for (const auto& report : {grown_report(), CheckReport{.probes = 0, .device = "cpu"}}) {
    const auto md = render_check_markdown(report);
    EXPECT_THAT(md, StartsWith("## memgate memory gate: "));
    EXPECT_THAT(md, EndsWith("\n"));
    EXPECT_THAT(md, Not(HasSubstr("\n\n\n"))) << md;
  }
  EXPECT_THAT(render_check_markdown(grown_report()), EndsWith("</details>\n")) << "every result, folded";
}

// The pytest plugin (python/memgate/pytest_plugin.py) reads the JSON: each result's test (its pytest item's name),
// status, fails, message, baseline and measured, and the errors of the fixtures not judged.
TEST(CheckReportTest, JsonHoldsWhatThePytestPluginReads) {
  auto report = grown_report();
  report.components.push_back(judged("reported", 4, "params", Status::kMissing, std::nullopt, std::nullopt,
                                     "no baseline for batch 4"));
  report.not_judged.push_back({"other.yaml", "other.yaml: not a fixture"});
  const auto doc = nlohmann::json::parse(render_check_json(report));
  const auto& grew = row_of(doc, "reported_bs2_activations");
  EXPECT_EQ(grew.at("status"), "regression");
  EXPECT_EQ(grew.at("fails"), true);
  EXPECT_EQ(grew.at("message"), kGrewMessage);
  EXPECT_TRUE(grew.at("baseline").is_number_integer());
  EXPECT_TRUE(grew.at("measured").is_number_integer());
  const auto& missing = row_of(doc, "reported_bs4_params");
  EXPECT_EQ(missing.at("status"), "missing");
  EXPECT_EQ(missing.at("fails"), false);
  EXPECT_EQ(missing.at("message"), "no baseline for batch 4");
  EXPECT_FALSE(missing.contains("baseline"));
  EXPECT_EQ(doc.at("not_judged")[0].at("error"), "other.yaml: not a fixture");
}

// The memory suite's measuring test prints a line per judged fixture with the same counts.
TEST(CheckReportTest, TheMemorySuitesLineCountsEachStatus) {
  std::vector<ComponentVerdict> verdicts;
  for (const auto& c : grown_report().components) verdicts.push_back(c.verdict);
  EXPECT_EQ(render_judged_fixture_line("reported", 1, "cpu", 8, verdicts),
            "reported: 1 probes measured on cpu, 8 components compared with a baseline, 7 ok, 1 regression\n");
  EXPECT_EQ(render_judged_fixture_line("empty", 0, "cpu", 0, {}),
            "empty: 0 probes measured on cpu, 0 components compared with a baseline\n");
  EXPECT_EQ(format_status_counts(verdicts), "7 ok, 1 regression");
}

}  // namespace
}  // namespace memgate
