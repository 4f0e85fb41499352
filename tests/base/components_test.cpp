// The component table drives reading and writing every component; byte counts print in a unit that shows them.
#include "memgate/base/components.h"
#include "memgate/base/error.h"
#include "memgate/base/units.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace memgate {
namespace {

TEST(ComponentTableTest, EveryComponentIsReadAndWrittenThroughItsOwnMember) {
  Components c;
  std::int64_t bytes = 1;
  for (const auto& info : kComponentTable) c.set(info.name, bytes++);
  bytes = 1;
  std::set<std::int64_t> seen;
  for (const auto& info : kComponentTable) {
    EXPECT_EQ(c.get(info.name), bytes) << info.name;
    EXPECT_EQ(c.*info.member, bytes) << info.name;
    seen.insert(c.*info.member);
    ++bytes;
  }
  EXPECT_EQ(seen.size(), kComponentTable.size()) << "two rows share a member";
  EXPECT_EQ(c.*kComponentTable.back().member, static_cast<std::int64_t>(kComponentTable.size()));
  EXPECT_TRUE(c.keeps_ema) << "setting an optional component makes it present";
}

// `ema` is a component only where a fixture keeps an EMA copy: absent, it is not compared, and two results that
// differ only in an absent component's bytes are equal.
TEST(ComponentTableTest, AnOptionalComponentCountsOnlyWhereItIsPresent) {
  Components a, b;
  const auto* ema = find_component("ema");
  ASSERT_NE(ema, nullptr);
  EXPECT_FALSE(has_component(a, *ema));
  EXPECT_TRUE(has_component(a, *find_component("params")));
  b.ema = 512;
  EXPECT_EQ(a, b) << "absent in both: its bytes are not compared";
  b.keeps_ema = true;
  EXPECT_NE(a, b) << "present in one only";
  a.set("ema", 512);
  EXPECT_EQ(a, b);
}

TEST(ComponentTableTest, OnlyReservedBytesMoveBySegments) {
  for (const auto& info : kComponentTable) {
    EXPECT_EQ(info.kind == ComponentKind::kReserved, info.name == "step_peak_reserved") << info.name;
  }
}

TEST(ComponentTableTest, AnUnknownNameIsAnErrorThatListsTheKnownOnes) {
  Components c;
  try {
    (void)c.get("activation");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown component 'activation'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("activations"), std::string::npos) << e.what();
  }
  EXPECT_THROW(c.set("", 1), Error);
}

TEST(UnitsTest, BytesPrintInAUnitThatShowsASmallChange) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(174600), "170.5 KiB");
  EXPECT_EQ(format_bytes(412 << 20), "412.0 MiB");
  EXPECT_EQ(format_bytes(std::int64_t{5} << 29), "2.50 GiB");
  EXPECT_EQ(format_bytes(-2048), "-2.0 KiB");
  EXPECT_EQ(format_bytes_delta(873), "+873 B");
  EXPECT_EQ(format_bytes_delta(-873), "-873 B");
  EXPECT_EQ(format_mib(3 << 19), "1.5 MiB");
}

}  // namespace
}  // namespace memgate
