// The CUDA caching allocator's model: pools, streams, segment sizes, best fit, splitting, merging, empty_cache, the
// settings (roundup_power2_divisions, max_split_size) and a capacity's release-and-retry, each on a sequence whose
// reserved bytes the policy fixes.
#include "memgate/allocator/caching_allocator_model.h"

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

TEST(CachingAllocatorModelTest, RoundsToPowerOfTwoDivisions) {
  AllocatorSettings four;
  four.roundup_power2_divisions.fill(4);
  EXPECT_EQ(CachingAllocatorModel::round_size(5 * kMiB + 1, four), 6 * kMiB) << "quarters of [4, 8) MiB";
  EXPECT_EQ(CachingAllocatorModel::round_size(4 * kMiB, four), 4 * kMiB) << "a power of two stays";
  EXPECT_EQ(CachingAllocatorModel::round_size(kMiB + 1, four), kMiB + 256 * 1024) << "quarters of [1, 2) MiB";
  EXPECT_EQ(CachingAllocatorModel::round_size(1000, four), 1024) << "up to 4 x 512 bytes: 512-byte steps";
  EXPECT_EQ(CachingAllocatorModel::round_size(5 * kMiB + 1), 5 * kMiB + 512) << "the default";
  CachingAllocatorModel m(four);
  m.malloc(1, 5 * kMiB + 1);
  EXPECT_EQ(m.allocated(), 6 * kMiB);
  EXPECT_EQ(m.requested(), 5 * kMiB + 1);
}

TEST(CachingAllocatorModelTest, OversizeBlocksAreNotSplitAndServeOnlyNearbyLargeRequests) {
  CachingAllocatorModel m(AllocatorSettings{.max_split_size = 20 * kMiB});
  m.malloc(1, 30 * kMiB);
  m.free(1);
  m.malloc(2, 6 * kMiB);
  EXPECT_EQ(m.reserved(), 50 * kMiB) << "the free 30 MiB block is oversize: a 6 MiB request gets a new segment";
  m.malloc(3, 25 * kMiB);
  EXPECT_EQ(m.reserved(), 50 * kMiB) << "25 MiB is within 20 MiB of the 30 MiB block: served by it";
  EXPECT_EQ(m.allocated(), 36 * kMiB) << "6 MiB split from its segment; the oversize block is not split (30)";
  m.free(3);
  m.malloc(4, 8 * kMiB);
  EXPECT_EQ(m.reserved(), 50 * kMiB) << "the 14 MiB rest of the 20 MiB segment holds 8 MiB";
  m.malloc(5, 52 * kMiB);
  EXPECT_EQ(m.reserved(), 102 * kMiB) << "no free block holds 52 MiB: a new segment";
}

TEST(CachingAllocatorModelTest, EachStreamHasItsOwnFreeBlocks) {
  CachingAllocatorModel m;
  m.record_segment_events(true);
  const auto a = m.malloc(1, 5 * kMiB, /*stream=*/0);
  m.free(1);
  const auto b = m.malloc(2, 5 * kMiB, /*stream=*/7);
  EXPECT_EQ(m.reserved(), 40 * kMiB) << "stream 0's free segment does not serve stream 7";
  ASSERT_TRUE(a && b);
  EXPECT_NE(*a, *b);
  const auto c = m.malloc(3, 5 * kMiB, /*stream=*/0);
  EXPECT_EQ(c, a) << "stream 0 reuses its own";
  m.free(2);
  m.free(3);
  m.clear_segment_events();
  m.empty_cache();
  ASSERT_EQ(m.segment_events().size(), 2u);
  EXPECT_EQ(m.segment_events()[0].stream, 0u) << "in pool order: stream, then size, then address";
  EXPECT_EQ(m.segment_events()[1].stream, 7u);
  EXPECT_EQ(m.reserved(), 0);
}

TEST(CachingAllocatorModelTest, ACapacityFreesCachedBlocksAndRetriesBeforeItFails) {
  // max_split_size: one oversize cached block is freed first, as release_available_cached_blocks does.
  CachingAllocatorModel m(AllocatorSettings{.max_split_size = 20 * kMiB});
  m.set_capacity(60 * kMiB);
  m.record_segment_events(true);
  m.malloc(1, 30 * kMiB);
  m.free(1);
  m.malloc(2, 6 * kMiB);  // 50 MiB reserved
  m.clear_segment_events();
  EXPECT_TRUE(m.malloc(3, 16 * kMiB)) << "66 MiB would not fit: the oversize 30 MiB block goes back first";
  ASSERT_EQ(m.segment_events().size(), 2u);
  EXPECT_EQ(m.segment_events()[0].kind, SegmentEvent::Kind::free);
  EXPECT_EQ(m.segment_events()[0].size, 30 * kMiB);
  EXPECT_EQ(m.segment_events()[1].kind, SegmentEvent::Kind::alloc);
  EXPECT_EQ(m.reserved(), 36 * kMiB);
  EXPECT_EQ(m.alloc_retries(), 0) << "the last resort (free every cached segment) was not needed";
  // Without max_split_size: every wholly free segment goes, then the retry; and past that, out of memory.
  CachingAllocatorModel d;
  d.set_capacity(40 * kMiB);
  d.malloc(1, 6 * kMiB);
  d.malloc(2, 6 * kMiB, /*stream=*/1);
  d.free(2);
  EXPECT_TRUE(d.malloc(3, 16 * kMiB)) << "56 MiB would not fit: stream 1's free segment is given back";
  EXPECT_EQ(d.alloc_retries(), 1);
  EXPECT_EQ(d.reserved(), 36 * kMiB);
  EXPECT_FALSE(d.malloc(4, 16 * kMiB)) << "52 MiB, and nothing cached is wholly free";
  EXPECT_EQ(d.ooms(), 1);
  EXPECT_EQ(d.reserved(), 36 * kMiB);
  EXPECT_TRUE(d.malloc(5, 8 * kMiB)) << "a request that fits still does after an out of memory";
}

TEST(CachingAllocatorModelTest, SeededSegmentsAreUsedAsTheirBlocksSay) {
  CachingAllocatorModel m;
  m.add_segment(0x1000000, 0, /*small=*/false, {{6 * kMiB, 7, 6 * kMiB}, {14 * kMiB, std::nullopt, 0}});
  EXPECT_EQ(m.reserved(), 20 * kMiB);
  EXPECT_EQ(m.allocated(), 6 * kMiB);
  EXPECT_EQ(m.malloc(1, 4 * kMiB), 0x1000000 + 6 * kMiB) << "the free block after the seeded allocation";
  m.free(7);
  m.free(1);
  EXPECT_EQ(m.largest_free_block(), 20 * kMiB) << "freed, the seeded block merges with its neighbours";
  EXPECT_TRUE(m.overlaps_segment(0x1000000 + 19 * kMiB, kMiB));
  EXPECT_FALSE(m.overlaps_segment(0x1000000 + 20 * kMiB, kMiB));
}

}  // namespace
}  // namespace memgate
