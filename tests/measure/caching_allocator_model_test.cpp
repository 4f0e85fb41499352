// The CUDA caching allocator's model: pools, segment sizes, best fit, splitting, merging and empty_cache, each on a
// sequence whose reserved bytes the policy fixes.
#include "memgate/measure/caching_allocator_model.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

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

TEST(CachingAllocatorModelTest, ExpandableSegmentsGrowOneSegmentByPages) {
  CachingAllocatorModel plain;
  CachingAllocatorModel expandable(/*expandable_segments=*/true);
  for (auto* m : {&plain, &expandable}) {
    m->malloc(1, 100);
    m->malloc(2, 30 * kMiB);
    m->malloc(3, 5 * kMiB);
  }
  // Plain: a 2 MiB small segment, a 30 MiB segment for the 30 MiB request, a 20 MiB one for the 5 MiB request.
  EXPECT_EQ(plain.reserved(), (2 + 30 + 20) * kMiB);
  // Expandable: a 2 MiB small page; two 20 MiB large pages for 30 MiB, whose 10 MiB rest holds the 5 MiB request.
  EXPECT_EQ(expandable.reserved(), (2 + 40) * kMiB);
  EXPECT_EQ(expandable.segments(), 2u) << "one segment per pool";
  // Freed, the large blocks merge into one free tail of 40 MiB; 50 MiB maps one more page after it.
  expandable.free(2);
  expandable.free(3);
  expandable.malloc(4, 50 * kMiB);
  EXPECT_EQ(expandable.reserved(), (2 + 60) * kMiB);
  EXPECT_EQ(expandable.peak_reserved(), (2 + 60) * kMiB);
  // The 10 MiB free tail holds a 9 MiB request (split: any rest of 512 bytes or more): no new page.
  expandable.malloc(5, 9 * kMiB);
  EXPECT_EQ(expandable.reserved(), (2 + 60) * kMiB);
  // empty_cache unmaps the whole pages of the free tail: 1 MiB of the last page is still free, the page stays.
  expandable.empty_cache();
  EXPECT_EQ(expandable.reserved(), (2 + 60) * kMiB);
  expandable.free(5);
  expandable.empty_cache();
  EXPECT_EQ(expandable.reserved(), (2 + 60) * kMiB) << "the 50 MiB block still ends in the third page";
  expandable.free(4);
  expandable.free(1);
  expandable.empty_cache();
  EXPECT_EQ(expandable.reserved(), 0);
  EXPECT_EQ(expandable.allocated(), 0);
  // And it grows again from nothing.
  expandable.malloc(6, 21 * kMiB);
  EXPECT_EQ(expandable.reserved(), 40 * kMiB);
}

// Any sequence: allocated within reserved, reserved in whole pages, and nothing left once all is freed.
TEST(CachingAllocatorModelTest, KeepsItsInvariantsOnALongSequence) {
  for (const bool expandable : {false, true}) {
    CachingAllocatorModel m(expandable);
    std::uint64_t state = 12345;
    auto next = [&state] { return state = state * 6364136223846793005ULL + 1442695040888963407ULL; };
    std::vector<std::uint64_t> live;
    for (std::uint64_t id = 1; id <= 5000; ++id) {
      if (!live.empty() && next() % 3 == 0) {
        const auto at = next() % live.size();
        m.free(live[at]);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(at));
      } else {
        const auto kind = next() % 4;
        const auto bytes = static_cast<std::int64_t>(kind == 0 ? next() % 64 * kMiB : next() % (2 * kMiB)) + 1;
        m.malloc(id, bytes);
        live.push_back(id);
      }
      ASSERT_LE(m.allocated(), m.reserved()) << "expandable " << expandable << " at " << id;
      ASSERT_EQ(m.reserved() % (2 * kMiB), 0) << "expandable " << expandable << " at " << id;
      if (id % 1000 == 0) m.empty_cache();
    }
    for (const auto id : live) m.free(id);
    EXPECT_EQ(m.allocated(), 0);
    m.empty_cache();
    EXPECT_EQ(m.reserved(), 0) << "expandable " << expandable;
  }
}

}  // namespace
}  // namespace memgate
