// A probe's per-module breakdown: its JSON read strictly, and the modules that changed against a baseline, the largest
// change first.
#include "memgate/base/error.h"
#include "memgate/base/module_breakdown.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace memgate {
namespace {

using ::testing::HasSubstr;

TEST(ModuleBreakdownJsonTest, RoundTripsAndRejectsWhatIsNotBytesByModule) {
  ModuleBreakdown b;
  b.components["activations"] = {{"blocks.0.attn", 65536}, {"head", 40}};
  b.components["step_peak"] = {{"(building the model)", 1000}};
  const auto j = module_breakdown_to_json(b);
  EXPECT_EQ(j["activations"]["blocks.0.attn"], 65536);
  EXPECT_EQ(module_breakdown_from_json(j, "f.json: probes[0].modules"), b);

  const auto error_of = [](const nlohmann::json& bad) {
    try {
      (void)module_breakdown_from_json(bad, "f.json: probes[0].modules");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(error_of(nlohmann::json::array()), HasSubstr("f.json: probes[0].modules: expected an object"));
  EXPECT_THAT(error_of({{"gradients", {{"a", 1}}}}),
              HasSubstr("f.json: probes[0].modules.gradients: unknown component"));
  EXPECT_THAT(error_of({{"activations", 3}}), HasSubstr("probes[0].modules.activations: expected an object"));
  EXPECT_THAT(error_of({{"activations", {{"head", 1.5}}}}),
              HasSubstr("probes[0].modules.activations.head: expected a whole number of bytes; got 1.5"));
}

TEST(ModuleChangesTest, TheLargestChangeFirstWithNewAndGoneModules) {
  const ModuleBytes baseline{{"encoder", 1000}, {"decoder", 4096}, {"gone", 512}, {"same", 7}};
  const ModuleBytes measured{{"encoder", 1000}, {"decoder", 8192}, {"new", 100}, {"same", 7}};
  const auto changes = module_changes(baseline, measured);
  ASSERT_EQ(changes.size(), 3U);
  EXPECT_EQ(changes[0].module, "decoder");
  EXPECT_EQ(changes[0].difference(), 4096);
  EXPECT_EQ(changes[1].module, "gone");
  EXPECT_EQ(changes[1].difference(), -512);
  EXPECT_EQ(changes[2].module, "new");
  EXPECT_EQ(describe_module_changes(changes, 2), "+4,096 B in decoder; -512 B in gone; and 1 more module");
  EXPECT_EQ(describe_module_changes(changes), "+4,096 B in decoder; -512 B in gone; +100 B in new");
  EXPECT_TRUE(module_changes(baseline, baseline).empty());
  EXPECT_EQ(describe_module_changes({}), "");
  EXPECT_EQ(format_byte_count(1234567), "1,234,567");
  EXPECT_EQ(format_byte_count(-1024), "-1,024");
  EXPECT_EQ(format_byte_count(999), "999");
}

}  // namespace
}  // namespace memgate
