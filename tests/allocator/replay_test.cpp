// memgate replay on traces whose outcome is known by hand, one allocator rule each, and on real GPU traces: the
// replay of the recorded settings is exact where the allocator's rules say so and names the first event where it
// is not; the what-if answers (settings, capacity, fragmentation) are the ones the rules give.
#include "memgate/base/error.h"
#include "memgate/allocator/replay.h"
#include "memgate/report/replay_report.h"
#include "memgate/allocator/snapshot_pickle.h"
#include "test_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <tuple>
#include <string>
#include <vector>

namespace memgate {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr std::int64_t kMiB = 1 << 20;
constexpr std::uint64_t A = 0x7f0000000000;  // segment addresses, far apart
constexpr std::uint64_t B = 0x7f0010000000;
constexpr std::uint64_t C = 0x7f0020000000;
constexpr std::uint64_t S = 0x7f0030000000;

std::uint64_t at(std::uint64_t base, std::int64_t offset_mib) {
  return base + static_cast<std::uint64_t>(offset_mib * kMiB);
}

// A snapshot written by hand: the trace, then the final segments as the real allocator would leave them.
class Trace {
 public:
  Trace& seg_alloc(std::uint64_t addr, std::int64_t size, std::uint64_t stream = 0) {
    return event("segment_alloc", addr, size, stream);
  }
  Trace& seg_free(std::uint64_t addr, std::int64_t size, std::uint64_t stream = 0) {
    return event("segment_free", addr, size, stream);
  }
  Trace& alloc(std::uint64_t addr, std::int64_t size, std::uint64_t stream = 0) {
    return event("alloc", addr, size, stream);
  }
  Trace& free(std::uint64_t addr, std::int64_t size, std::uint64_t stream = 0) {
    event("free_requested", addr, size, stream);
    return event("free_completed", addr, size, stream);
  }
  Trace& oom(std::int64_t size, std::uint64_t stream = 0) {
    events_.push_back({{"action", "oom"}, {"device_free", 1 << 20}, {"size", size}, {"stream", stream}, {"time_us", 0}});
    return *this;
  }
  Trace& event(const std::string& action, std::uint64_t addr, std::int64_t size, std::uint64_t stream = 0) {
    events_.push_back({{"action", action}, {"addr", addr}, {"size", size}, {"stream", stream}, {"time_us", 0},
                       {"frames", json::array({{{"filename", "train.py"}, {"line", events_.size()}, {"name", "step"}}})}});
    return *this;
  }
  /// A final segment: its blocks as (size, allocated), from its address up.
  Trace& segment(std::uint64_t addr, std::vector<std::pair<std::int64_t, bool>> blocks, std::uint64_t stream = 0) {
    json list = json::array();
    std::int64_t total = 0;
    for (const auto& [size, allocated] : blocks) {
      list.push_back({{"address", addr + static_cast<std::uint64_t>(total)}, {"size", size}, {"requested_size", size},
                      {"state", allocated ? "active_allocated" : "inactive"}});
      total += size;
    }
    segments_.push_back({{"device", 0}, {"address", addr}, {"total_size", total}, {"stream", stream},
                         {"segment_type", total == 2 * kMiB ? "small" : "large"}, {"segment_pool_id", {0, 0}},
                         {"is_expandable", false}, {"blocks", list}});
    return *this;
  }
  [[nodiscard]] std::int64_t size() const { return static_cast<std::int64_t>(events_.size()); }
  [[nodiscard]] json snapshot() const {
    return {{"segments", segments_},
            {"device_traces", json::array({events_})},
            {"allocator_settings", {{"PYTORCH_CUDA_ALLOC_CONF", ""}, {"max_split_size", -1},
                                    {"garbage_collection_threshold", 0.0}, {"expandable_segments", false}}}};
  }
  [[nodiscard]] DeviceReplay replay(const std::vector<WhatIfSpec>& what_ifs = {}) const {
    const auto report = replay_snapshot(read_snapshot(snapshot(), "hand.pickle"), what_ifs);
    EXPECT_EQ(report.devices.size(), 1u);
    return report.devices.at(0);
  }

 private:
  json events_ = json::array();
  json segments_ = json::array();
};

// An event's action as written, and where its request was made (alloc).
std::string event_name(const Snapshot& snap, const TraceEvent& e) { return std::string(snap.name(e)); }
std::string event_where(const Snapshot& snap, const TraceEvent& e) { return std::string(snap.where(e)); }

std::string divergence_of(const DeviceReplay& d) {
  if (!d.first_divergence) return "none";
  return "event " + std::to_string(d.first_divergence->event) + ": recorded " + d.first_divergence->expected +
         "; replayed " + d.first_divergence->replayed;
}

// Best fit, no split of a rest of 1 MiB or less, a split of a larger rest: a 20 MiB segment serving 5, 5, 4 and
// 8 MiB requests.
TEST(ReplayTest, AColdTraceOfBestFitAndSplittingIsExact) {
  // The 4 MiB request takes the smallest free block that holds it (5 MiB at A, not the 10 MiB tail) and keeps
  // its 1 MiB rest; the 8 MiB request splits the tail, leaving 2 MiB free.
  Trace t;
  t.seg_alloc(A, 20 * kMiB).alloc(A, 5 * kMiB).alloc(at(A, 5), 5 * kMiB).free(A, 5 * kMiB);
  t.alloc(A, 4 * kMiB).alloc(at(A, 10), 8 * kMiB);
  t.segment(A, {{5 * kMiB, true}, {5 * kMiB, true}, {8 * kMiB, true}, {2 * kMiB, false}});
  const auto d = t.replay();
  EXPECT_TRUE(d.exact) << divergence_of(d);
  EXPECT_FALSE(d.first_divergence);
  EXPECT_EQ(d.addresses_compared, 4);
  EXPECT_EQ(d.initial_reserved, 0);
  EXPECT_EQ(d.recorded.peak_reserved, 20 * kMiB);
  EXPECT_EQ(d.replayed.peak_reserved, 20 * kMiB);
  EXPECT_EQ(d.replayed.segment_allocs, 1);
  EXPECT_EQ(d.recorded.peak_allocated, 17 * kMiB) << "the live requests: 5 + 4 + 8 MiB";
  EXPECT_EQ(d.replayed.peak_allocated, 17 * kMiB);
  // torch.cuda.max_memory_allocated() counts blocks: the 4 MiB request holds its unsplit 5 MiB block.
  ASSERT_TRUE(d.replayed.peak_allocated_blocks);
  EXPECT_EQ(*d.replayed.peak_allocated_blocks, 18 * kMiB);
  EXPECT_FALSE(d.recorded.peak_allocated_blocks) << "a trace records requests, not blocks";
}

TEST(ReplayTest, NamesTheFirstEventWhereTheRealAllocatorDidOtherwise) {
  // A recording where the 4 MiB request went to the 10 MiB tail: not what best fit does.
  Trace t;
  t.seg_alloc(A, 20 * kMiB).alloc(A, 5 * kMiB).alloc(at(A, 5), 5 * kMiB).free(A, 5 * kMiB);
  t.alloc(at(A, 10), 4 * kMiB);
  t.segment(A, {{5 * kMiB, false}, {5 * kMiB, true}, {4 * kMiB, true}, {6 * kMiB, false}});
  const auto d = t.replay();
  EXPECT_FALSE(d.exact);
  ASSERT_TRUE(d.first_divergence);
  EXPECT_EQ(d.first_divergence->event, 5) << "the 4 MiB alloc (after segment_alloc, 2 allocs, a free's 2 events)";
  EXPECT_EQ(d.first_divergence->action, "alloc");
  EXPECT_THAT(d.first_divergence->expected, HasSubstr("0x7f0000a00000"));
  EXPECT_THAT(d.first_divergence->replayed, HasSubstr("0x7f0000000000"));
  EXPECT_THAT(d.first_divergence->context, ::testing::Contains(HasSubstr("> #5 alloc")));
}

TEST(ReplayTest, AWarmTraceStartsFromTheFinalStateWithTheTraceUndone) {
  // A block allocated before the trace and freed in it: its size is its request rounded (3 MiB + 512), the rest
  // of the segment free; freed, the segment is one free block that a 12 MiB request splits.
  Trace t;
  t.free(B, 3 * kMiB + 100).alloc(B, 12 * kMiB);
  t.segment(B, {{12 * kMiB, true}, {8 * kMiB, false}});
  const auto d = t.replay();
  EXPECT_TRUE(d.exact) << divergence_of(d);
  EXPECT_EQ(d.initial_segments, 1);
  EXPECT_EQ(d.initial_reserved, 20 * kMiB);
  EXPECT_EQ(d.initial_allocated, 3 * kMiB + 512);
}

TEST(ReplayTest, ABlockOfUnknownSizeEndsWhereTheTraceAllocatesWithin1MiBOfIt) {
  // Allocated before the trace: 4 MiB asked, but the real allocator kept a 0.5 MiB rest (it splits only rests
  // above 1 MiB), as the 2 MiB alloc right after it, while it lives, shows.
  Trace t;
  t.alloc(at(C, 4) + 512 * 1024, 2 * kMiB).free(C, 4 * kMiB);
  t.segment(C, {{4 * kMiB + 512 * 1024, false}, {2 * kMiB, true}, {13 * kMiB + 512 * 1024, false}});
  const auto d = t.replay();
  EXPECT_TRUE(d.exact) << divergence_of(d);
  EXPECT_EQ(d.initial_allocated, 4 * kMiB + 512 * 1024);
}

TEST(ReplayTest, SegmentFreesNoRequestExplainsAreTheProgramsEmptyCache) {
  Trace t;
  t.seg_alloc(A, 20 * kMiB).alloc(A, 5 * kMiB).seg_alloc(S, 2 * kMiB).alloc(S, 1000).free(S, 1000);
  t.seg_free(S, 2 * kMiB).alloc(at(A, 5), 5 * kMiB);
  t.segment(A, {{5 * kMiB, true}, {5 * kMiB, true}, {10 * kMiB, false}});
  const auto d = t.replay();
  EXPECT_TRUE(d.exact) << divergence_of(d);
  EXPECT_EQ(d.external_releases, 1);
  EXPECT_EQ(d.replayed.segment_frees, 1);
  EXPECT_EQ(d.replayed.peak_reserved, 22 * kMiB);
}

TEST(ReplayTest, AReleaseThatIsNotEmptyCachesDiverges) {
  // Both segments are wholly free, but the recording gives back only the small one: not what empty_cache does.
  Trace t;
  t.seg_alloc(A, 20 * kMiB).alloc(A, 5 * kMiB).seg_alloc(S, 2 * kMiB).alloc(S, 1000).free(S, 1000);
  t.free(A, 5 * kMiB).seg_free(S, 2 * kMiB).alloc(A, 5 * kMiB);
  t.segment(A, {{5 * kMiB, true}, {15 * kMiB, false}});
  const auto d = t.replay();
  EXPECT_FALSE(d.exact);
  ASSERT_TRUE(d.first_divergence);
  EXPECT_EQ(d.first_divergence->event, 9) << divergence_of(d);
  EXPECT_EQ(d.first_divergence->expected, "segment_free 0x7f0030000000 size=2097152 (2.0 MiB)");
  EXPECT_THAT(d.first_divergence->replayed, HasSubstr("segment_free 0x7f0000000000"));
}

TEST(ReplayTest, EachStreamHasItsOwnFreeBlocks) {
  // A 20 MiB block free on stream 0 does not serve stream 7: a new segment.
  Trace t;
  t.seg_alloc(A, 20 * kMiB).alloc(A, 5 * kMiB).free(A, 5 * kMiB);
  t.seg_alloc(B, 20 * kMiB, 7).alloc(B, 5 * kMiB, 7);
  t.segment(A, {{20 * kMiB, false}}).segment(B, {{5 * kMiB, true}, {15 * kMiB, false}}, 7);
  auto d = t.replay();
  EXPECT_TRUE(d.exact) << divergence_of(d);
  // A recording where stream 7 reused stream 0's block is not the allocator's.
  Trace wrong;
  wrong.seg_alloc(A, 20 * kMiB).alloc(A, 5 * kMiB).free(A, 5 * kMiB).alloc(A, 5 * kMiB, 7);
  wrong.segment(A, {{5 * kMiB, true}, {15 * kMiB, false}});
  d = wrong.replay();
  EXPECT_FALSE(d.exact);
  ASSERT_TRUE(d.first_divergence);
  EXPECT_EQ(d.first_divergence->event, 4);
}

TEST(ReplayTest, NamesWhatTheModelCannotFollow) {
  // An action a later PyTorch may add: named, and the replay goes on without it.
  Trace t;
  t.seg_alloc(A, 20 * kMiB).alloc(A, 5 * kMiB).event("segment_defragment", 0, 0).event("segment_defragment", 0, 0);
  t.segment(A, {{5 * kMiB, true}, {15 * kMiB, false}});
  const auto d = t.replay();
  EXPECT_TRUE(d.exact) << divergence_of(d);
  EXPECT_THAT(d.not_followed, ::testing::Contains(HasSubstr("2 'segment_defragment' event(s)")));
}

// PyTorch records a 'snapshot' event whenever a snapshot is taken, and a 'user_defined' one for an annotation
// (record_function): neither changes the allocator's state, so neither is a gap in an exact replay.
TEST(ReplayTest, SnapshotAndAnnotationEventsAreFollowedAsNoOps) {
  Trace t;
  t.event("snapshot", 0, 0).seg_alloc(A, 20 * kMiB).alloc(A, 5 * kMiB).event("snapshot", 0, 0);
  t.event("user_defined", 0, 0).alloc(at(A, 5), 5 * kMiB).event("snapshot", 0, 0);
  t.segment(A, {{5 * kMiB, true}, {5 * kMiB, true}, {10 * kMiB, false}});
  const auto report = replay_snapshot(read_snapshot(t.snapshot(), "hand.pickle"));
  const auto& d = report.devices.at(0);
  EXPECT_TRUE(d.exact) << divergence_of(d);
  EXPECT_TRUE(d.compared);
  EXPECT_THAT(d.not_followed, ::testing::IsEmpty());
  EXPECT_EQ(d.events, 7);
  EXPECT_EQ(d.requests, 2);
  EXPECT_EQ(d.addresses_compared, 2);
  const auto j = replay_to_json(report);
  EXPECT_EQ(j["devices"][0]["not_followed"], json::array());
  EXPECT_THAT(replay_summary(report), ::testing::Not(HasSubstr("not followed")));
}

// Three 6 MiB requests in a 20 MiB segment, a fourth in a second one; everything freed; 6 MiB again, then 30 MiB.
// Recorded (no limit): 70 MiB reserved at the end.
Trace what_if_trace() {
  Trace t;
  t.seg_alloc(A, 20 * kMiB).alloc(A, 6 * kMiB).alloc(at(A, 6), 6 * kMiB).alloc(at(A, 12), 6 * kMiB);  // 0..3
  t.seg_alloc(B, 20 * kMiB).alloc(B, 6 * kMiB);                                                       // 4, 5
  t.free(B, 6 * kMiB).free(A, 6 * kMiB).free(at(A, 6), 6 * kMiB).free(at(A, 12), 6 * kMiB);           // 6..13
  t.alloc(A, 6 * kMiB);                                                                               // 14
  t.seg_alloc(C, 30 * kMiB).alloc(C, 30 * kMiB);                                                      // 15, 16
  t.segment(A, {{6 * kMiB, true}, {14 * kMiB, false}}).segment(B, {{20 * kMiB, false}});
  t.segment(C, {{30 * kMiB, true}});
  return t;
}

TEST(ReplayTest, WhatIfACapacityFreesTheCacheAndRetriesBeforeItFails) {
  const auto t = what_if_trace();
  const auto d = t.replay({{"30 MiB", std::nullopt, 30 * kMiB},
                           {"40 MiB", std::nullopt, 40 * kMiB},
                           {"50 MiB", std::nullopt, 50 * kMiB},
                           {"unlimited", std::nullopt, std::nullopt}});
  EXPECT_TRUE(d.exact) << divergence_of(d);
  EXPECT_EQ(d.replayed.peak_reserved, 70 * kMiB);
  ASSERT_EQ(d.what_if.size(), 4u);
  // 30 MiB: the second segment does not fit, and no segment is wholly free to give back.
  EXPECT_FALSE(d.what_if[0].fits);
  EXPECT_EQ(d.what_if[0].first_oom_event, 5);
  EXPECT_EQ(d.what_if[0].first_oom_size, 6 * kMiB);
  EXPECT_EQ(d.what_if[0].ooms, 2) << "the 30 MiB request fails too";
  // 40 MiB: the 30 MiB request frees the free 20 MiB segment B, but 20 + 30 MiB still do not fit.
  EXPECT_FALSE(d.what_if[1].fits);
  EXPECT_EQ(d.what_if[1].first_oom_event, 16);
  EXPECT_EQ(d.what_if[1].ooms, 1);
  // 50 MiB: freeing B makes room: it fits, with one retry, at 50 MiB reserved.
  EXPECT_TRUE(d.what_if[2].fits);
  EXPECT_EQ(d.what_if[2].retries, 1);
  EXPECT_EQ(d.what_if[2].totals.peak_reserved, 50 * kMiB);
  EXPECT_EQ(d.what_if[2].totals.segment_frees, 1);
  // No limit: the recording itself.
  EXPECT_TRUE(d.what_if[3].fits);
  EXPECT_EQ(d.what_if[3].totals.peak_reserved, d.recorded.peak_reserved);
  EXPECT_EQ(d.what_if[3].totals.segment_allocs, d.recorded.segment_allocs);
}

TEST(ReplayTest, WhatIfOtherAllocatorSettings) {
  const auto t = what_if_trace();
  const auto d = t.replay({{"max_split_size_mb:20", AllocatorSettings::parse("max_split_size_mb:20", "test"), {}},
                           {"gc", AllocatorSettings::parse("garbage_collection_threshold:0.5", "test"), 50 * kMiB},
                           {"expandable", AllocatorSettings::parse("expandable_segments:True", "test"), {}}});
  ASSERT_EQ(d.what_if.size(), 3u);
  // max_split_size 20 MiB: the free 20 MiB segments are oversize and serve no 6 MiB request: a third segment.
  EXPECT_EQ(d.what_if[0].totals.peak_reserved, 90 * kMiB);
  EXPECT_EQ(d.what_if[0].totals.segment_allocs, 4);
  // garbage collection at half of 50 MiB frees B (free longest) before the 30 MiB segment: no retry needed.
  EXPECT_TRUE(d.what_if[1].fits);
  EXPECT_EQ(d.what_if[1].retries, 0);
  EXPECT_EQ(d.what_if[1].totals.peak_reserved, 50 * kMiB);
  // Expandable: one large segment mapped in 20 MiB pages: 18 MiB, then a second page, then the freed 40 MiB
  // holds the 6 and the 30 MiB requests.
  EXPECT_EQ(d.what_if[2].totals.peak_reserved, 40 * kMiB);
}

TEST(ReplayTest, FragmentationAtThePeakNamesTheEmptiestSegmentsAndTheirRequests) {
  const auto d = what_if_trace().replay();
  const auto& f = d.fragmentation;
  EXPECT_EQ(f.event, 16) << "reserved peaks when the 30 MiB segment is made";
  EXPECT_EQ(f.reserved, 70 * kMiB);
  EXPECT_EQ(f.allocated, 36 * kMiB);
  EXPECT_EQ(f.largest_free_block, 20 * kMiB);
  ASSERT_EQ(f.emptiest.size(), 2u);
  EXPECT_EQ(f.emptiest[0].address, B);
  EXPECT_EQ(f.emptiest[0].allocated, 0);
  EXPECT_EQ(f.emptiest[0].made_by_event, 5);
  EXPECT_EQ(f.emptiest[0].made_by_size, 6 * kMiB);
  EXPECT_EQ(f.emptiest[0].where, "train.py:5 step");
  EXPECT_EQ(f.emptiest[1].address, A);
  EXPECT_EQ(f.emptiest[1].allocated, 6 * kMiB);
}

TEST(ReplayTest, AnOutOfMemoryIsFollowedAsTheAllocatorRaisedIt) {
  // The real allocator found no cached block for 30 MiB, freed the free small segment, and failed.
  Trace t;
  t.seg_alloc(A, 20 * kMiB).alloc(A, 9 * kMiB).seg_alloc(S, 2 * kMiB).alloc(S, 512).free(S, 512);
  t.seg_free(S, 2 * kMiB);
  t.oom(30 * kMiB);
  t.segment(A, {{9 * kMiB, true}, {11 * kMiB, false}});
  const auto d = t.replay();
  EXPECT_TRUE(d.exact) << divergence_of(d);
  EXPECT_EQ(d.external_releases, 1);
}

TEST(ReplayTest, JsonHoldsTheContractsKeys) {
  const auto report = replay_snapshot(read_snapshot(what_if_trace().snapshot(), "hand.pickle"),
                                      {{"50 MiB", std::nullopt, 50 * kMiB}});
  const auto j = replay_to_json(report);
  EXPECT_EQ(j["file"], "hand.pickle");
  const auto& d = j["devices"][0];
  EXPECT_EQ(d["device"], 0);
  EXPECT_EQ(d["events"], 17);
  EXPECT_EQ(d["exact"], true);
  EXPECT_EQ(d["recorded"]["peak_reserved"], 70 * kMiB);
  EXPECT_EQ(d["replayed"]["segment_allocs"], 3);
  EXPECT_TRUE(d["replayed"]["peak_allocated_blocks"].is_number_integer());
  EXPECT_FALSE(d["recorded"].contains("peak_allocated_blocks"));
  EXPECT_TRUE(d["what_if"][0]["replayed"]["peak_allocated_blocks"].is_number_integer());
  EXPECT_TRUE(d["first_divergence"].is_null());
  EXPECT_EQ(d["what_if"][0]["fits"], true);
  EXPECT_EQ(d["what_if"][0]["capacity"], 50 * kMiB);
  const auto html = replay_html(report);
  EXPECT_THAT(html, HasSubstr("<svg"));
  EXPECT_THAT(html, HasSubstr("reserved, 50 MiB"));
}

// What read_snapshot says of `data` as the file bad.pickle: its error, or "no error".
std::string error_of(const json& data) {
  try {
    (void)read_snapshot(data, "bad.pickle");
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(ReplayTest, BadSnapshotsAreClearErrorsNamingTheKey) {
  auto snap = what_if_trace().snapshot();
  EXPECT_THAT(error_of(json::array()), HasSubstr("bad.pickle: expected a memory snapshot"));
  auto no_trace = snap;
  no_trace.erase("device_traces");
  EXPECT_THAT(error_of(no_trace), HasSubstr("_record_memory_history"));
  auto negative = snap;
  negative["device_traces"][0][1]["size"] = -5;
  EXPECT_THAT(error_of(negative), HasSubstr("bad.pickle: device_traces[0][1].size: expected a size in bytes"));
  auto string_addr = snap;
  string_addr["device_traces"][0][2]["addr"] = "0x10";
  EXPECT_THAT(error_of(string_addr), HasSubstr("device_traces[0][2].addr: expected an address"));
  auto no_action = snap;
  no_action["device_traces"][0][3].erase("action");
  EXPECT_THAT(error_of(no_action), HasSubstr("device_traces[0][3]: the key 'action' is missing"));
  auto bad_state = snap;
  bad_state["segments"][0]["blocks"][0]["state"] = "lost";
  EXPECT_THAT(error_of(bad_state), HasSubstr("segments[0].blocks[0].state: expected 'active_allocated'"));
  auto short_blocks = snap;
  short_blocks["segments"][0]["total_size"] = 21 * kMiB;
  EXPECT_THAT(error_of(short_blocks), HasSubstr("segments[0].blocks: blocks that sum to total_size"));
}

// Values no PyTorch writes (a size past any GPU, a device index past 16 bits, a negative address, a threshold
// outside (0, 1)) are errors naming the file, the event or segment and the key, and what was expected; the values
// a real snapshot can hold next to them still read.
TEST(ReplayTest, ValuesPytorchCannotWriteAreErrorsNamingTheEventAndKey) {
  const auto snap = what_if_trace().snapshot();
  const auto with = [&](const json::json_pointer& key, const json& value) {
    auto s = snap;
    s[key] = value;
    return error_of(s);
  };
  using P = json::json_pointer;
  const std::string size = "bad.pickle: device_traces[0][1].size: expected a size in bytes (an integer from 0 to 2^60";
  EXPECT_THAT(with(P("/device_traces/0/1/size"), INT64_MAX), HasSubstr(size));
  EXPECT_THAT(with(P("/device_traces/0/1/size"), std::uint64_t{1} << 63), HasSubstr(size));
  EXPECT_THAT(with(P("/device_traces/0/1/size"), (std::int64_t{1} << 60) + 1), HasSubstr(size));
  EXPECT_THAT(with(P("/device_traces/0/1/size"), -1), HasSubstr(size));
  EXPECT_EQ(with(P("/device_traces/0/1/size"), std::int64_t{1} << 60), "no error") << "1 EiB: the most a size holds";
  EXPECT_THAT(with(P("/segments/0/blocks/0/size"), std::int64_t{1} << 61),
              HasSubstr("bad.pickle: segments[0].blocks[0].size: expected a size in bytes"));
  EXPECT_THAT(with(P("/segments/0/blocks/0/size"), std::int64_t{1} << 60),
              HasSubstr("segments[0].blocks[0].size: blocks that end within the segment's total_size 20971520"));
  EXPECT_THAT(with(P("/segments/0/total_size"), std::int64_t{1} << 61),
              HasSubstr("segments[0].total_size: expected a size in bytes"));
  // A live block holds at least its request; a free one keeps its last request, whatever it was.
  EXPECT_THAT(with(P("/segments/0/blocks/0/requested_size"), 7 * kMiB),
              HasSubstr("segments[0].blocks[0].requested_size: expected at most the block's size 6291456, got the "
                        "integer 7340032"));
  EXPECT_EQ(with(P("/segments/0/blocks/1/requested_size"), 30 * kMiB), "no error");

  for (const json& device : {json(std::int64_t{1} << 32), json(std::int64_t{1} << 40), json(-1), json(65536)}) {
    EXPECT_THAT(with(P("/segments/0/device"), device),
                HasSubstr("bad.pickle: segments[0].device: expected a device index (an integer from 0 to 65535)"))
        << device;
  }
  EXPECT_EQ(with(P("/segments/0/device"), 65535), "no error");
  EXPECT_THAT(with(P("/device_traces/0/2/addr"), -4096),
              HasSubstr("bad.pickle: device_traces[0][2].addr: expected an address (an integer from 0), got the "
                        "integer -4096"));
  EXPECT_THAT(with(P("/segments/1/address"), -1), HasSubstr("segments[1].address: expected an address"));
  EXPECT_THAT(with(P("/device_traces/0/2/addr"), UINT64_MAX - 100),
              HasSubstr("device_traces[0][2].size: expected memory that ends within the 64-bit address space"));
  auto exabytes = snap;  // five events of 1 EiB each: more bytes than a replay can add up in 64 bits
  for (int i = 0; i < 5; ++i) exabytes["device_traces"][0][i]["size"] = std::int64_t{1} << 60;
  EXPECT_THAT(error_of(exabytes),
              HasSubstr("device_traces[0][4].size: expected sizes that sum to at most 2^62 bytes over the trace"));

  const std::string gc = "bad.pickle: allocator_settings.garbage_collection_threshold: expected 0 (off) or a fraction "
                         "above 0 and below 1";
  for (const double t : {std::nan(""), 1.0, 1.5, -0.25, HUGE_VAL}) {
    EXPECT_THAT(with(P("/allocator_settings/garbage_collection_threshold"), t), HasSubstr(gc)) << t;
  }
  for (const double t : {0.0, 0.6, 0.999}) {
    EXPECT_EQ(with(P("/allocator_settings/garbage_collection_threshold"), t), "no error") << t;
  }
  EXPECT_THAT(with(P("/allocator_settings/roundup_power2_divisions"), {{"1", 3}}),
              HasSubstr("allocator_settings.roundup_power2_divisions.1: expected 0 or a power of two"));
  EXPECT_EQ(with(P("/allocator_settings/roundup_power2_divisions"), {{"1", 0}, {"2", 4}}), "no error");
  EXPECT_EQ(with(P("/allocator_settings/max_split_size"), -1048576), "no error")
      << "PyTorch writes SIZE_MAX rounded to MiB as int64: no limit";
}

// A program may ask for more than any GPU holds (a shape computed wrong): PyTorch records the out-of-memory with that
// size. It is read, fits no cached block, and runs out of memory in every what-if; its device_free is what a GPU had.
TEST(ReplayTest, AnOutOfMemoryPastAnyGpuIsReadAndFitsNowhere) {
  Trace t;
  t.seg_alloc(A, 20 * kMiB).alloc(A, 9 * kMiB).oom(INT64_MAX).oom(std::int64_t{1} << 60);
  t.segment(A, {{9 * kMiB, true}, {11 * kMiB, false}});
  auto snap = t.snapshot();
  snap["device_traces"][0][2]["device_free"] = (std::int64_t{1} << 60) + 1;
  EXPECT_THAT([&] {
    try {
      (void)read_snapshot(snap, "bad.pickle");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  }(), HasSubstr("device_traces[0][2].device_free: expected a size in bytes"));
  const auto d = t.replay({{"unlimited", std::nullopt, std::nullopt}, {"1 GiB", std::nullopt, 1024 * kMiB}});
  EXPECT_TRUE(d.exact) << divergence_of(d);
  ASSERT_EQ(d.what_if.size(), 2u);
  for (const auto& w : d.what_if) {
    EXPECT_EQ(w.first_oom_event, 2) << w.spec.label;
    EXPECT_EQ(w.first_oom_size, INT64_MAX) << w.spec.label;
  }
  EXPECT_EQ(d.what_if[0].ooms, 1) << "without a capacity, 1 EiB is a request like any other";
  EXPECT_EQ(d.what_if[1].ooms, 2);
}

// A frame's file name or function that is not UTF-8 (a directory in Latin-1, a C++ symbol's raw bytes) is carried
// escaped from the pickle to every report: replay, JSON, text and HTML, as is a snapshot file name that is not UTF-8.
TEST(ReplayTest, FramesThatAreNotUtf8ReplayIntoEveryReport) {
  testing::TempDir dir;
  const auto file = dir / "snap_\xff.pickle";
  const auto script = dir / "make.py";
  // 'QQQ' becomes bytes no str holds (the pickle's length byte stays right); the file name is surrogateescape's.
  testing::write_file(script, R"(import pickle, sys
frames = [{'filename': '/home/caf\udce9/tr\udce9in.py', 'line': 3, 'name': 'QQQ'}]
trace = [{'action': 'segment_alloc', 'addr': 2**40, 'size': 20 << 20, 'stream': 0, 'frames': frames},
         {'action': 'alloc', 'addr': 2**40, 'size': 5 << 20, 'stream': 0, 'frames': frames},
         {'action': 'snapshot', 'addr': 0, 'size': 0, 'stream': 0, 'frames': frames}]
blocks = [{'address': 2**40, 'size': 5 << 20, 'requested_size': 5 << 20, 'state': 'active_allocated', 'frames': frames},
          {'address': 2**40 + (5 << 20), 'size': 15 << 20, 'requested_size': 0, 'state': 'inactive', 'frames': []}]
s = {'segments': [{'device': 0, 'address': 2**40, 'total_size': 20 << 20, 'stream': 0, 'segment_type': 'large',
                   'segment_pool_id': (0, 0), 'is_expandable': False, 'frames': frames, 'blocks': blocks}],
     'device_traces': [trace]}
data = pickle.dumps(s, protocol=4).replace(b'QQQ', b'\xff\xc0\xaf')
open(sys.argv[1].encode('utf-8', 'surrogateescape'), 'wb').write(data)
)");
  std::string log;
  ASSERT_EQ(testing::run(std::string(MEMGATE_TEST_PYTHON) + " " + script + " '" + file + "'", &log), 0) << log;
  const auto report = replay_snapshot(load_snapshot(file));
  ASSERT_EQ(report.devices.size(), 1u);
  const auto& d = report.devices[0];
  EXPECT_TRUE(d.exact) << divergence_of(d);
  ASSERT_FALSE(d.fragmentation.emptiest.empty());
  EXPECT_EQ(d.fragmentation.emptiest[0].where, "tr\\xe9in.py:3 \\xff\\xc0\\xaf");
  std::string text;
  ASSERT_NO_THROW(text = replay_to_json(report).dump(2));
  const auto j = json::parse(text);
  EXPECT_EQ(j["file"], dir / "snap_\\xff.pickle");
  EXPECT_EQ(j["devices"][0]["fragmentation"]["emptiest_segments"][0]["where"], "tr\\xe9in.py:3 \\xff\\xc0\\xaf");
  EXPECT_THAT(replay_summary(report), HasSubstr("snap_\\xff.pickle"));
  EXPECT_THAT(replay_html(report), HasSubstr("snap_\\xff.pickle"));
}

TEST(ReplayTest, AllocatorSettingsParseAsPytorchCudaAllocConf) {
  const auto s = AllocatorSettings::parse(
      "expandable_segments:True, max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2,>:8],"
      "garbage_collection_threshold:0.6,backend:native", "conf");
  EXPECT_TRUE(s.expandable_segments);
  EXPECT_EQ(s.max_split_size, 128 * kMiB);
  EXPECT_EQ(s.roundup_power2_divisions[0], 1);
  EXPECT_EQ(s.roundup_power2_divisions[8], 1) << "256 MiB";
  EXPECT_EQ(s.roundup_power2_divisions[9], 2) << "512 MiB";
  EXPECT_EQ(s.roundup_power2_divisions[10], 8);
  EXPECT_EQ(s.roundup_power2_divisions[15], 8);
  EXPECT_DOUBLE_EQ(s.garbage_collection_threshold, 0.6);
  EXPECT_EQ(AllocatorSettings::parse(s.to_string(), "round trip"), s);
  const auto error_of = [](const std::string& conf) {
    try {
      (void)AllocatorSettings::parse(conf, "--allocator");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(error_of("max_split_size_mb:lots"), HasSubstr("--allocator: allocator setting 'max_split_size_mb'"));
  EXPECT_THAT(error_of("roundup_power2_divisions:3"), HasSubstr("a power of two"));
  EXPECT_THAT(error_of("garbage_collection_threshold:1.5"), HasSubstr("between 0 and 1"));
  EXPECT_THAT(error_of("expandable_segment:True"), HasSubstr("unknown allocator setting 'expandable_segment'"));
  EXPECT_THAT(error_of("expandable_segments"), HasSubstr("expected key:value"));
}

// What CUDA counts as allocated is blocks, not requests: in a real trace of a GPT-style LM (128.6 M fp32
// parameters), the token embedding and the output layer (10,000 x 768 fp32, 30,720,000 bytes each) each hold a
// whole 31,457,280-byte segment, as the 737,280 bytes left are too few to split off a large block. The model hands
// out the same block, and an estimate for CUDA counts it (tests/launch/estimate_test.cpp); the replay's
// peak_allocated_blocks is what torch.cuda.max_memory_allocated() said.
TEST(ReplayTest, ARealTraceHoldsUnsplitBlocksWholeAsTheModelDoes) {
  const auto snap = load_snapshot(std::string(MEMGATE_TEST_SOURCE_DIR) +
                                  "/tests/data/snapshots/cs336_silmont2000_memory_forward_fp32_128.pickle");
  int whole = 0;
  for (const auto& seg : snap.segments) {
    for (const auto& b : seg.blocks) {
      if (b.allocated && b.requested == 30720000) {
        EXPECT_EQ(b.size, 31457280);
        EXPECT_EQ(seg.size, 31457280) << "its own segment";
        ++whole;
      }
    }
  }
  EXPECT_EQ(whole, 2) << "the embedding and the output layer";
  CachingAllocatorModel model;
  (void)model.malloc(1, 30720000);
  EXPECT_EQ(model.allocated(), 31457280);
  EXPECT_EQ(model.requested(), 30720000);
  const auto d = replay_snapshot(snap).devices.at(0);
  ASSERT_TRUE(d.exact) << divergence_of(d);
  ASSERT_TRUE(d.replayed.peak_allocated_blocks);
  EXPECT_GT(*d.replayed.peak_allocated_blocks, d.replayed.peak_allocated);
}

// Real traces recorded on real GPUs: those committed with their licences (tests/data/snapshots/NOTICE.md) must
// replay with every segment event, every block address and the final state as recorded. A folder that
// MEMGATE_REAL_SNAPSHOTS names adds traces that may not be committed: each one the model follows (not expandable
// segments) must replay exactly too.
TEST(ReplayTest, RealGpuTracesReplayExactly) {
  std::vector<std::filesystem::path> folders{std::filesystem::path(MEMGATE_TEST_SOURCE_DIR) / "tests" / "data" /
                                             "snapshots"};
  if (const char* dir = std::getenv("MEMGATE_REAL_SNAPSHOTS"); dir != nullptr && *dir != '\0') folders.emplace_back(dir);
  for (std::size_t i = 0; i < folders.size(); ++i) {
    const bool committed = i == 0;
    int replayed = 0;
    for (const auto& entry : std::filesystem::directory_iterator(folders[i])) {
      if (entry.path().extension() != ".pickle") continue;
      Snapshot snap;
      try {
        snap = load_snapshot(entry.path().string());
      } catch (const Error& e) {
        ADD_FAILURE() << e.what();
        continue;
      }
      const auto report = replay_snapshot(snap);
      if (committed) {
        EXPECT_FALSE(report.devices.empty()) << entry.path();
      }
      for (const auto& d : report.devices) {
        if (!committed && !d.compared) continue;
        EXPECT_TRUE(d.exact) << entry.path() << " device " << d.device << ": " << divergence_of(d);
        if (!committed) continue;
        EXPECT_EQ(d.replayed.peak_reserved, d.recorded.peak_reserved) << entry.path();
        EXPECT_EQ(d.replayed.segment_allocs, d.recorded.segment_allocs) << entry.path();
        EXPECT_EQ(d.addresses_compared, d.requests) << entry.path();
      }
      ++replayed;
    }
    EXPECT_GE(replayed, committed ? 2 : 1) << folders[i];
  }
}


// ---------------------------------------------------------------------------------------------------------------
// Golden replays: tests/data/snapshots/<name>.replay.json holds what the replay of each committed trace gave when
// the file was written (its JSON report under the recorded settings and six what-ifs, each series and the trace as
// read), so that a faster reader or model must give the same results, event by event. MEMGATE_UPDATE_GOLDEN=1
// rewrites the files from the code as it stands (only for a change of results that is meant, and reviewed).

// FNV-1a over `text`, continuing from `h`.
std::uint64_t fnv(std::string_view text, std::uint64_t h = 14695981039346656037ULL) {
  for (const char c : text) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  return h;
}

json series_json(const std::vector<ReplayPoint>& series) {
  std::uint64_t h = fnv("");
  ReplayPoint top;
  for (const auto& p : series) {
    h = fnv(fmt::format("{} {} {};", p.event, p.reserved, p.allocated), h);
    if (p.reserved > top.reserved) top = p;
  }
  return {{"points", series.size()}, {"digest", fmt::format("{:016x}", h)},
          {"peak", {top.event, top.reserved, top.allocated}}};
}

// The trace as read: per device, each action's count and a digest of every event's fields in order.
json trace_json(const Snapshot& snap) {
  json devices = json::array();
  for (const auto& events : snap.device_traces) {
    std::map<std::string, std::int64_t> actions;
    std::uint64_t h = fnv("");
    for (const auto& e : events) {
      ++actions[event_name(snap, e)];
      h = fnv(fmt::format("{} {} {} {} {} {};", event_name(snap, e), e.addr, e.size, e.stream, e.device_free,
                          event_where(snap, e)), h);
    }
    devices.push_back({{"events", events.size()}, {"actions", actions}, {"digest", fmt::format("{:016x}", h)}});
  }
  std::uint64_t h = fnv("");
  for (const auto& s : snap.segments) {
    h = fnv(fmt::format("{} {} {} {} {} {} {};", s.device, s.address, s.size, s.stream, s.small, s.expandable,
                        s.private_pool), h);
    for (const auto& b : s.blocks) h = fnv(fmt::format("{} {} {} {};", b.address, b.size, b.requested, b.allocated), h);
  }
  return {{"segments", snap.segments.size()}, {"segments_digest", fmt::format("{:016x}", h)},
          {"has_settings", snap.has_settings}, {"settings", snap.settings.to_string()},
          {"settings_text", snap.settings_text}, {"device_traces", devices}};
}

// What-ifs that take the model through its other paths: a capacity below the recorded peak (out-of-memory retries),
// oversize blocks, rounding to power-of-two divisions, expandable segments, garbage collection.
std::vector<WhatIfSpec> golden_what_ifs(const Snapshot& snap) {
  std::int64_t peak = 0;
  for (const auto& d : replay_snapshot(snap).devices) peak = std::max(peak, d.recorded.peak_reserved);
  const std::int64_t capacity = std::max<std::int64_t>(peak * 3 / 4 / kMiB, 1) * kMiB;
  const auto settings = [&](const char* conf) { return AllocatorSettings::parse(conf, "golden", snap.settings); };
  return {{"3/4 of the peak", std::nullopt, capacity},
          {"max_split_size_mb:32", settings("max_split_size_mb:32"), std::nullopt},
          {"max_split_size_mb:32 on 3/4 of the peak", settings("max_split_size_mb:32"), capacity},
          {"roundup_power2_divisions:4", settings("roundup_power2_divisions:4"), std::nullopt},
          {"expandable_segments:True", settings("expandable_segments:True"), std::nullopt},
          {"garbage_collection_threshold:0.5 on 3/4 of the peak", settings("garbage_collection_threshold:0.5"),
           capacity}};
}

json golden_of(const std::filesystem::path& file) {
  const auto snap = load_snapshot(file.string());
  const auto report = replay_snapshot(snap, golden_what_ifs(snap));
  auto j = replay_to_json(report);
  j["file"] = file.filename().string();
  for (std::size_t i = 0; i < report.devices.size(); ++i) {
    const auto& d = report.devices[i];
    auto& out = j["devices"][i];
    out["recorded_series"] = series_json(d.recorded_series);
    out["replayed_series"] = series_json(d.replayed_series);
    for (std::size_t w = 0; w < d.what_if.size(); ++w) out["what_if"][w]["series"] = series_json(d.what_if[w].series);
  }
  j["trace"] = trace_json(snap);
  return j;
}

TEST(ReplayTest, CommittedTracesReplayAsTheirGoldenFilesSay) {
  const auto folder = std::filesystem::path(MEMGATE_TEST_SOURCE_DIR) / "tests" / "data" / "snapshots";
  const char* update = std::getenv("MEMGATE_UPDATE_GOLDEN");
  int compared = 0;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    if (entry.path().extension() != ".pickle") continue;
    const auto golden_file = folder / (entry.path().stem().string() + ".replay.json");
    const auto got = golden_of(entry.path());
    if (update != nullptr && std::string(update) == "1") {
      testing::write_file(golden_file.string(), got.dump(1) + "\n");
      continue;
    }
    ASSERT_TRUE(std::filesystem::exists(golden_file))
        << golden_file << " is missing: MEMGATE_UPDATE_GOLDEN=1 writes it from the code as it stands";
    const auto want = json::parse(testing::read_file(golden_file.string()));
    EXPECT_EQ(got, want) << entry.path() << ": the replay parts from its golden file; the difference (JSON patch):\n"
                         << json::diff(want, got).dump(1);
    ++compared;
  }
  if (update == nullptr) {
    EXPECT_GE(compared, 3);
  }
}


// ---------------------------------------------------------------------------------------------------------------
// The streamed reader (load_snapshot, read_snapshot_pickle) against read_snapshot of the whole JSON tree: the same
// Snapshot, field by field and event by event, and the same error for each kind of bad file.

// The error `read` throws, or "no error".
std::string error_of(const std::function<void()>& read) {
  try {
    read();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

void expect_same_snapshot(const Snapshot& streamed, const Snapshot& tree, const std::string& what) {
  EXPECT_EQ(streamed.origin, tree.origin) << what;
  EXPECT_EQ(streamed.has_settings, tree.has_settings) << what;
  EXPECT_EQ(streamed.settings, tree.settings) << what;
  EXPECT_EQ(streamed.settings_text, tree.settings_text) << what;
  ASSERT_EQ(streamed.segments.size(), tree.segments.size()) << what;
  for (std::size_t i = 0; i < tree.segments.size(); ++i) {
    const auto& a = streamed.segments[i];
    const auto& b = tree.segments[i];
    EXPECT_EQ(std::tie(a.device, a.address, a.size, a.stream, a.small, a.expandable, a.private_pool),
              std::tie(b.device, b.address, b.size, b.stream, b.small, b.expandable, b.private_pool))
        << what << " segments[" << i << "]";
    ASSERT_EQ(a.blocks.size(), b.blocks.size()) << what << " segments[" << i << "]";
    for (std::size_t j = 0; j < b.blocks.size(); ++j) {
      EXPECT_EQ(std::tie(a.blocks[j].address, a.blocks[j].size, a.blocks[j].requested, a.blocks[j].allocated),
                std::tie(b.blocks[j].address, b.blocks[j].size, b.blocks[j].requested, b.blocks[j].allocated))
          << what << " segments[" << i << "].blocks[" << j << "]";
    }
  }
  ASSERT_EQ(streamed.device_traces.size(), tree.device_traces.size()) << what;
  for (std::size_t d = 0; d < tree.device_traces.size(); ++d) {
    const auto& x = streamed.device_traces[d];
    const auto& y = tree.device_traces[d];
    ASSERT_EQ(x.size(), y.size()) << what << " device_traces[" << d << "]";
    for (std::size_t i = 0; i < y.size(); ++i) {
      EXPECT_EQ(std::tie(x[i].action, x[i].addr, x[i].size, x[i].stream, x[i].device_free),
                std::tie(y[i].action, y[i].addr, y[i].size, y[i].stream, y[i].device_free))
          << what << " device_traces[" << d << "][" << i << "]";
      EXPECT_EQ(streamed.name(x[i]), tree.name(y[i])) << what << " device_traces[" << d << "][" << i << "]";
      EXPECT_EQ(streamed.where(x[i]), tree.where(y[i])) << what << " device_traces[" << d << "][" << i << "]";
      if (::testing::Test::HasFailure()) return;  // the first event that differs is enough
    }
  }
}

TEST(ReplayTest, CommittedTracesStreamAsTheirJsonTreeReads) {
  const auto folder = std::filesystem::path(MEMGATE_TEST_SOURCE_DIR) / "tests" / "data" / "snapshots";
  int read = 0;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    if (entry.path().extension() != ".pickle") continue;
    const auto path = entry.path().string();
    expect_same_snapshot(load_snapshot(path), read_snapshot(load_plain_pickle(path), path), path);
    const auto data = testing::read_file(path);
    expect_same_snapshot(read_snapshot_pickle(data, path), read_snapshot(read_plain_pickle(data, path), path), path);
    ++read;
  }
  EXPECT_GE(read, 3);
}

// Bad snapshots, each with one fault, and odd ones PyTorch does not write but read_snapshot takes (an entry listed
// twice, tuples for lists, integer keys, an entry filled after its list took it): the streamed reader gives
// read_snapshot's Snapshot or its error, word for word.
TEST(ReplayTest, StreamedReaderGivesTheTreeReadersResultsAndErrors) {
  testing::TempDir dir;
  const auto script = dir / "make.py";
  testing::write_file(script, R"(import copy, pickle, sys, os
out = sys.argv[1]
frames = [{'filename': '/home/u/train.py', 'line': 7, 'name': 'step'},
          {'filename': '/usr/lib/python3/site-packages/torch/nn/modules/linear.py', 'line': 3, 'name': 'forward'}]
def good():
    trace = [{'action': 'segment_alloc', 'addr': 2**40, 'size': 20 << 20, 'stream': 0, 'time_us': 1, 'frames': frames},
             {'action': 'alloc', 'addr': 2**40, 'size': 5 << 20, 'stream': 0, 'time_us': 2, 'frames': frames},
             {'action': 'free_requested', 'addr': 2**40, 'size': 5 << 20, 'stream': 0, 'frames': frames},
             {'action': 'free_completed', 'addr': 2**40, 'size': 5 << 20, 'stream': 0, 'frames': frames},
             {'action': 'alloc', 'addr': 2**40, 'size': 5 << 20, 'stream': 0, 'frames': []},
             {'action': 'oom', 'device_free': 1 << 20, 'size': 2**62, 'stream': 0},
             {'action': 'snapshot', 'frames': frames}, {'action': 'user_defined', 'name': 'step 1'},
             {'action': 'segment_compact', 'addr': 7}]
    blocks = [{'address': 2**40, 'size': 5 << 20, 'requested_size': 5 << 20, 'state': 'active_allocated', 'frames': frames},
              {'address': 2**40 + (5 << 20), 'size': 15 << 20, 'requested_size': 0, 'state': 'inactive', 'frames': []}]
    return {'segments': [{'device': 0, 'address': 2**40, 'total_size': 20 << 20, 'stream': 0, 'segment_type': 'large',
                          'segment_pool_id': (0, 0), 'is_expandable': False, 'frames': frames, 'blocks': blocks}],
            'device_traces': [trace, []],
            'allocator_settings': {'PYTORCH_CUDA_ALLOC_CONF': 'max_split_size_mb:64', 'max_split_size': 64 << 20,
                                   'garbage_collection_threshold': 0.0, 'expandable_segments': False,
                                   'roundup_power2_divisions': {'1': 0, '2': 4}}}
cases = {}
def case(name, change):
    s = good()
    change(s)
    cases[name] = s
case('good', lambda s: None)
case('negative_size', lambda s: s['device_traces'][0][1].update(size=-5))
case('string_addr', lambda s: s['device_traces'][0][2].update(addr='0x10'))
case('float_size', lambda s: s['device_traces'][0][1].update(size=5.0))
case('bool_stream', lambda s: s['device_traces'][0][1].update(stream=True))
case('big_stream', lambda s: s['device_traces'][0][1].update(stream=2**64 - 1))
case('no_action', lambda s: s['device_traces'][0][3].pop('action'))
case('int_action', lambda s: s['device_traces'][0][3].update(action=3))
case('no_addr', lambda s: s['device_traces'][0][0].pop('addr'))
case('oom_no_free', lambda s: s['device_traces'][0][5].pop('device_free'))
case('oom_negative', lambda s: s['device_traces'][0][5].update(size=-1))
case('past_address_space', lambda s: s['device_traces'][0][1].update(addr=2**64 - 100))
case('exabytes', lambda s: [e.update(size=2**60) for e in s['device_traces'][0][:5]])
case('entry_not_dict', lambda s: s['device_traces'][0].insert(2, [1, 2]))
case('trace_not_list', lambda s: s['device_traces'].__setitem__(1, 'x'))
case('no_segments', lambda s: s.pop('segments'))
case('segments_dict', lambda s: s.__setitem__('segments', {}))
case('no_traces', lambda s: s.pop('device_traces'))
case('bad_state', lambda s: s['segments'][0]['blocks'][0].update(state='gone'))
case('block_past_segment', lambda s: s['segments'][0]['blocks'][1].update(size=16 << 20))
case('bad_settings', lambda s: s['allocator_settings'].update(garbage_collection_threshold=1.5))
case('bad_divisions', lambda s: s['allocator_settings']['roundup_power2_divisions'].update({'4': 3}))
case('tuples', lambda s: s['device_traces'].__setitem__(0, tuple(s['device_traces'][0])))
case('int_keys', lambda s: s['device_traces'][0][1].update({5: 'x'}))
case('frames_tuple', lambda s: s['device_traces'][0][1].update(frames=tuple(frames)))
case('frames_odd', lambda s: s['device_traces'][0][1].update(frames=[1, None, {'line': 3}]))
case('not_utf8_action', lambda s: s['device_traces'][0][8].update(action='caf\udce9'))
def twice(s):
    s['device_traces'][0].append(s['device_traces'][0][1])
case('entry_twice', twice)
def shared_frames(s):
    s['device_traces'][0][4]['frames'] = s['device_traces'][0][2]['frames'] = [frames[1], frames[0]]
case('shared_frames', shared_frames)
def entry_as_segment(s):
    s['segments'].append(s['device_traces'][0][1])
case('entry_as_segment', entry_as_segment)
for name, s in cases.items():
    open(os.path.join(out, name + '.pickle'), 'wb').write(pickle.dumps(s, protocol=4))
open(os.path.join(out, 'root_list.pickle'), 'wb').write(pickle.dumps([1, 2, 3], protocol=4))
open(os.path.join(out, 'protocol2.pickle'), 'wb').write(pickle.dumps(good(), protocol=2))
data = pickle.dumps(good(), protocol=4)
open(os.path.join(out, 'truncated.pickle'), 'wb').write(data[:len(data) // 2])
open(os.path.join(out, 'global.pickle'), 'wb').write(pickle.dumps({'segments': [], 'device_traces': [[os.getcwd]]}))
)");
  std::string log;
  ASSERT_EQ(testing::run(std::string(MEMGATE_TEST_PYTHON) + " " + script + " " + dir.path().string(), &log), 0) << log;
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    if (entry.path().extension() != ".pickle") continue;
    const auto path = entry.path().string();
    const auto name = entry.path().stem().string();
    Snapshot streamed, tree;
    const auto streamed_error = error_of([&] { streamed = load_snapshot(path); });
    const auto tree_error = error_of([&] { tree = read_snapshot(load_plain_pickle(path), path); });
    EXPECT_EQ(streamed_error, tree_error) << name;
    if (name == "good" || name == "tuples" || name == "protocol2") {
      EXPECT_EQ(tree_error, "no error") << name;
    }
    if (name == "negative_size") {
      EXPECT_THAT(tree_error, HasSubstr("device_traces[0][1].size: expected a size"));
    }
    if (tree_error == "no error") expect_same_snapshot(streamed, tree, name);
    ++files;
  }
  EXPECT_EQ(files, 34);
}

}  // namespace
}  // namespace memgate
