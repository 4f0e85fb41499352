// The verdict files the measuring tests leave for the component tests: a round trip, and strict reading.
#include "memgate/base/error.h"
#include "memgate/base/verdict_file.h"
#include "test_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace memgate {
namespace {

using ::testing::HasSubstr;

TEST(VerdictFileTest, RoundTripsEveryField) {
  testing::TempDir dir;
  VerdictFile f{.suite = "cpu", .fixture = "vit_tiny_lora", .device = "cpu"};
  f.components.push_back({Status::kRegression, "vit_tiny_lora", 8, "activations", 1000, 1010, 2, "grew by 10 bytes"});
  f.components.push_back({Status::kMissing, "vit_tiny_lora", 8, "params", std::nullopt, std::nullopt, std::nullopt,
                          "no baseline"});
  f.budgets.push_back({Status::kOverBudget, "vit_tiny_lora", 8, "t4_16gb", 100, 200, std::nullopt, "over by 100"});
  write_verdict_file(dir / "v.json", f);
  const auto back = read_verdict_file(dir / "v.json");
  EXPECT_EQ(back.suite, "cpu");
  EXPECT_FALSE(back.skipped);
  ASSERT_EQ(back.components.size(), 2U);
  const auto* grew = back.find(8, "activations");
  ASSERT_NE(grew, nullptr);
  EXPECT_EQ(grew->status, Status::kRegression);
  EXPECT_EQ(grew->baseline, 1000);
  EXPECT_EQ(grew->measured, 1010);
  EXPECT_EQ(grew->allowed, 2);
  EXPECT_EQ(grew->message, "grew by 10 bytes");
  EXPECT_FALSE(back.find(8, "params")->measured);
  EXPECT_EQ(back.find(4, "activations"), nullptr);
  EXPECT_EQ(back.find_budget(8, "t4_16gb")->status, Status::kOverBudget);
  EXPECT_EQ(back.find_budget(8, "activations"), nullptr);

  f.skipped = "no GPU here";
  f.error = "bad.json: not valid JSON";
  write_verdict_file(dir / "v.json", f);
  EXPECT_EQ(read_verdict_file(dir / "v.json").skipped, "no GPU here");
  EXPECT_EQ(read_verdict_file(dir / "v.json").error, "bad.json: not valid JSON");
}

TEST(VerdictFileTest, BadFilesNameThePathAndTheField) {
  testing::TempDir dir;
  auto error_of = [&](const std::string& text) {
    testing::write_file(dir / "v.json", text);
    try {
      (void)read_verdict_file(dir / "v.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string head = R"({"format": "memgate-verdicts", "version": 1, "suite": "cpu", "fixture": "x", "device": "cpu",)";
  EXPECT_THAT(error_of("{ not json"), HasSubstr("v.json: not a verdict file"));
  EXPECT_THAT(error_of(R"({"format": "other"})"), HasSubstr("v.json: `format`: expected \"memgate-verdicts\""));
  EXPECT_THAT(error_of(R"({"format": "memgate-verdicts", "version": 2})"), HasSubstr("`version`: expected 1"));
  EXPECT_THAT(error_of(head + R"("budgets": []})"), HasSubstr("`components`: expected a list"));
  EXPECT_THAT(error_of(head + R"("budgets": [], "components": [{"status": "fine"}]})"),
              HasSubstr("`components[0]`: `status`: expected one of ok, regression, stale, missing, changed, oom, "
                        "over-budget, not-repeatable, got 'fine'"));
  EXPECT_THAT(error_of(head + R"("budgets": [], "components": [{"status": "ok", "fixture": "x", "batch_size": 2,
      "component": "params", "message": "", "measured": "12"}]})"),
              HasSubstr("`measured`: expected an integer (bytes)"));
  EXPECT_THAT(error_of(head + R"("budgets": [], "components": [{"status": "ok", "fixture": "x", "batch_size": "2"}]})"),
              HasSubstr("`batch_size`: expected an integer"));
  std::string absent;
  try {
    (void)read_verdict_file(dir / "absent.json");
  } catch (const Error& e) {
    absent = e.what();
  }
  EXPECT_THAT(absent, HasSubstr("absent.json: no such file"));
}

TEST(StatusTest, FailsFollowsStrictness) {
  for (const auto s : {Status::kRegression, Status::kChanged, Status::kOom, Status::kOverBudget}) {
    EXPECT_TRUE(fails(s, false));
    EXPECT_TRUE(fails(s, true));
  }
  for (const auto s : {Status::kStale, Status::kMissing}) {
    EXPECT_FALSE(fails(s, false));
    EXPECT_TRUE(fails(s, true));
  }
  EXPECT_FALSE(fails(Status::kOk, true));
}

}  // namespace
}  // namespace memgate
