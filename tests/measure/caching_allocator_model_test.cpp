// The CUDA caching allocator's model: pools, segment sizes, best fit, splitting, merging and empty_cache, each on a
// sequence whose reserved bytes the policy fixes.
#include "memgate/measure/caching_allocator_model.h"

#include <gtest/gtest.h>

namespace memgate {
namespace {

constexpr std::int64_t kMiB = 1 << 20;

TEST(CachingAllocatorModelTest, RoundsRequestsAndSizesSegmentsAsTheAllocator) {
  EXPECT_EQ(CachingAllocatorModel::round_size(1), 512);
  EXPECT_EQ(CachingAllocatorModel::round_size(513), 1024);
  EXPECT_EQ(CachingAllocatorModel::segment_size(512), 2 * kMiB) << "small pool";
  EXPECT_EQ(CachingAllocatorModel::segment_size(kMiB), 2 * kMiB);
  EXPECT_EQ(CachingAllocatorModel::segment_size(kMiB + 512), 20 * kMiB) << "large pool, below 10 MiB";
  EXPECT_EQ(CachingAllocatorModel::segment_size(10 * kMiB), 10 * kMiB) << "from 10 MiB: rounded to 2 MiB";
  EXPECT_EQ(CachingAllocatorModel::segment_size(11 * kMiB), 12 * kMiB);
}

TEST(CachingAllocatorModelTest, SmallRequestsShareA2MiBSegment) {
  CachingAllocatorModel m;
  m.malloc(1, 100);
  EXPECT_EQ(m.allocated(), 512);
  EXPECT_EQ(m.reserved(), 2 * kMiB);
  for (std::uint64_t id = 2; id <= 4096; ++id) m.malloc(id, 512);  // 4096 blocks of 512 B fill one segment
  EXPECT_EQ(m.reserved(), 2 * kMiB);
  m.malloc(5000, 512);
  EXPECT_EQ(m.reserved(), 4 * kMiB) << "the first segment is full";
  EXPECT_EQ(m.segments(), 2U);
}

TEST(CachingAllocatorModelTest, LargeRequestsSplitA20MiBSegmentWhileMoreThan1MiBIsLeft) {
  CachingAllocatorModel m;
  m.malloc(1, 5 * kMiB);
  m.malloc(2, 5 * kMiB);
  m.malloc(3, 5 * kMiB);
  EXPECT_EQ(m.reserved(), 20 * kMiB) << "three 5 MiB blocks from one 20 MiB segment";
  m.malloc(4, 4 * kMiB + 512 * 1024);  // 4.5 MiB of the 5 MiB left: the 0.5 MiB rest is not split off
  EXPECT_EQ(m.reserved(), 20 * kMiB);
  EXPECT_EQ(m.allocated(), 20 * kMiB) << "the block keeps the whole rest";
  m.malloc(5, 12 * kMiB);
  EXPECT_EQ(m.reserved(), 32 * kMiB) << "a request from 10 MiB gets a segment of its own size";
}

TEST(CachingAllocatorModelTest, FreedBlocksMergeAreReusedAndEmptyCacheGivesBackWholeSegments) {
  CachingAllocatorModel m;
  m.malloc(1, 5 * kMiB);
  m.malloc(2, 5 * kMiB);
  m.malloc(3, 5 * kMiB);
  m.free(1);
  m.free(2);  // merges with 1: a free 10 MiB block at the segment's start
  m.malloc(4, 9 * kMiB);
  EXPECT_EQ(m.reserved(), 20 * kMiB) << "best fit in the merged block";
  m.malloc(5, 6 * kMiB);
  EXPECT_EQ(m.reserved(), 40 * kMiB) << "5 + 1 MiB left: no fit, a new segment";
  m.free(5);
  m.empty_cache();
  EXPECT_EQ(m.reserved(), 20 * kMiB) << "the wholly free segment goes back";
  m.free(3);
  m.free(4);
  m.empty_cache();
  EXPECT_EQ(m.reserved(), 0);
  EXPECT_EQ(m.allocated(), 0);
  EXPECT_EQ(m.peak_reserved(), 40 * kMiB);
  m.reset_peak();
  EXPECT_EQ(m.peak_reserved(), 0);
  m.free(999);  // never allocated here: ignored
}

}  // namespace
}  // namespace memgate
