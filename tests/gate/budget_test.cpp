// Budget arithmetic and the GPU fixtures.
#include "memgate/gate/budget.h"
#include "memgate/base/error.h"
#include "memgate/gate/suite.h"
#include "fixture_util.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace memgate {
namespace {

constexpr std::int64_t kGiB = 1LL << 30, kMiB = 1LL << 20;

GpuSpec gpu(double gib, double fraction, std::int64_t outside) {
  GpuSpec g;
  g.id = "test";
  g.name = "Test GPU";
  g.memory_bytes = static_cast<std::int64_t>(gib * static_cast<double>(kGiB));
  g.usable_fraction = fraction;
  g.outside_allocator_bytes = outside;
  return g;
}

TEST(BudgetTest, FitsWhenReservedIsWithinTheUsableMemory) {
  // Usable: memory x usable_fraction - outside the allocator, the one definition every output prints.
  const auto g = gpu(24, 0.90, 512 * kMiB);
  EXPECT_EQ(g.usable_bytes(), static_cast<std::int64_t>(0.9 * 24 * static_cast<double>(kGiB)) - 512 * kMiB);
  EXPECT_EQ(format_usable(g.usable_bytes()), "21606.4 MiB");
  const auto edge = static_cast<std::int64_t>(0.9 * 24 * static_cast<double>(kGiB)) - 512 * kMiB;
  EXPECT_TRUE(check_budget(edge, g).fits());
  EXPECT_EQ(check_budget(edge, g).headroom(), 0);
  EXPECT_FALSE(check_budget(edge + 1, g).fits());
  EXPECT_EQ(check_budget(edge + 1, g).headroom(), -1);
}

TEST(BudgetTest, LargestFittingBatchSkipsOutOfMemory) {
  Profile p;
  for (std::int64_t bs : {1, 2, 4, 8}) {
    ProbeResult r;
    r.batch_size = bs;
    r.components.step_peak_reserved = bs * kGiB;
    p.probes.push_back(r);
  }
  p.probes.back().oom = true;
  EXPECT_EQ(largest_fitting_batch(p, gpu(8, 0.9, 0)), 4);  // 7.2 GiB usable; batch 8 ran out of memory
  EXPECT_EQ(largest_fitting_batch(p, gpu(3, 0.9, 0)), 2);
  EXPECT_FALSE(largest_fitting_batch(p, gpu(1, 0.9, 0)).has_value());
}

TEST(BudgetTest, CommittedGpuFixturesLoad) {
  const auto gpus = load_gpus(testing::source_dir() + "/fixtures/gpus");
  ASSERT_GE(gpus.size(), 8U);
  const auto& t4 = find_gpu(gpus, "t4_16gb");
  EXPECT_NEAR(static_cast<double>(t4.memory_bytes) / static_cast<double>(kGiB), 14.74, 0.005);
  for (const auto& g : gpus) {
    EXPECT_GT(g.usable_bytes(), 0) << g.id;
    EXPECT_LE(g.usable_fraction, 1.0) << g.id;
  }
  EXPECT_THROW((void)find_gpu(gpus, "tpu"), Error);
  // Each carries what an estimate needs of it, with its sources; only the GPU memgate ran on says it was measured.
  for (const auto& g : gpus) {
    EXPECT_FALSE(g.compute_capability.empty()) << g.id;
    EXPECT_GT(g.multiprocessors, 0) << g.id;
    EXPECT_GT(g.max_threads_per_multiprocessor, 0) << g.id;
    EXPECT_FALSE(g.sources.empty()) << g.id;
    EXPECT_EQ(g.measured, g.id == "h200_141gb") << g.id;
  }
  EXPECT_EQ(t4.multiprocessors, 40);
  EXPECT_EQ(t4.max_threads_per_multiprocessor, 1024);
  EXPECT_EQ(find_gpu(gpus, "a100_80gb").multiprocessors, 108);
  // torch 2.11's cuBLAS workspaces: 65 MiB on an H200 (as memgate measured there), 17.25 MiB on a T4.
  EXPECT_EQ(find_gpu(gpus, "h200_141gb").library_workspace_bytes(), 65LL << 20);
  EXPECT_EQ(t4.library_workspace_bytes(), 2 * 8'519'680 + (1 << 20));
  EXPECT_EQ(GpuSpec{}.library_workspace_bytes(), 65LL << 20) << "unknown: the larger";
}

TEST(BudgetTest, AMalformedComputeCapabilityNamesTheKey) {
  testing::TempDir dir;
  for (const auto* bad : {"nine", "9", "9.0.1", ".5"}) {
    testing::write_file(dir / "cc.yaml", fmt::format("name: X\nmemory_gib: 24\ncompute_capability: \"{}\"\n", bad));
    try {
      (void)load_gpu(dir / "cc.yaml");
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("cc.yaml:3: compute_capability")) << bad;
      EXPECT_THAT(e.what(), ::testing::HasSubstr("major.minor")) << bad;
    }
  }
}

TEST(BudgetTest, AGpuWithNoUsableMemoryIsRefusedNamingTheKey) {
  testing::TempDir dir;
  testing::write_file(dir / "small.yaml", "name: X\nmemory_gib: 1\nusable_fraction: 0.5\noutside_allocator_mib: 600\n");
  try {
    (void)load_gpu(dir / "small.yaml");
    FAIL() << "a GPU whose allowance outside the allocator exceeds its usable fraction loaded";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("small.yaml:4: outside_allocator_mib"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("less than memory_gib x usable_fraction"));
  }
}

TEST(BudgetTest, BadGpuFixtureNamesTheKey) {
  testing::TempDir dir;
  testing::write_file(dir / "bad.yaml", "name: X\nmemory_gib: 24\nusable_fraction: 1.5\n");
  try {
    (void)load_gpu(dir / "bad.yaml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("bad.yaml:3: usable_fraction"));
  }
}

}  // namespace
}  // namespace memgate
