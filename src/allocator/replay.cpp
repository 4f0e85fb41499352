// memgate replay: a real trace's requests through the caching allocator's model, compared event by event.
#include "memgate/allocator/replay.h"

#include "memgate/allocator/snapshot_pickle.h"
#include "memgate/base/error.h"
#include "memgate/base/units.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>
#include <unordered_map>

namespace memgate {
namespace {

constexpr std::int64_t kSmallSize = CachingAllocatorModel::kSmallSize;
constexpr std::int64_t kSmallBuffer = CachingAllocatorModel::kSmallBuffer;
constexpr std::int64_t kMinBlockSize = CachingAllocatorModel::kMinBlockSize;
constexpr std::size_t kMaxSeriesPoints = 1500;

}  // namespace

bool ReplayReport::exact() const {
  return !devices.empty() && std::all_of(devices.begin(), devices.end(), [](const DeviceReplay& d) { return d.exact; });
}

namespace {

// ---------------------------------------------------------------------------------------------------------------
// The state when the trace began: the final segments and blocks with the trace undone.

struct InitialState {
  struct Segment {
    std::uint64_t address = 0;
    std::int64_t size = 0;
    std::uint64_t stream = 0;
    bool small = false;
    std::vector<CachingAllocatorModel::SeedBlock> blocks;
    std::vector<std::uint64_t> block_addresses;  // of the allocated seed blocks, as their ids' addresses
  };
  std::vector<Segment> segments;
  std::vector<std::string> problems;  // where the trace and the final state disagree
};

struct LiveBlock {
  std::int64_t size = 0;  // 0: unknown (allocated before the trace, freed in it)
  std::int64_t requested = 0;
  std::int64_t freed_at = -1;  // the event that frees it, for a block of unknown size
};

InitialState reconstruct(const std::vector<RecordedSegment>& final_segments, const std::vector<TraceEvent>& events,
                         int device) {
  InitialState state;
  struct Seg {
    std::int64_t size;
    std::uint64_t stream;
    bool small;
  };
  std::map<std::uint64_t, Seg> segs;
  std::unordered_map<std::uint64_t, LiveBlock> live;  // by address; sorted once the trace is undone
  // Expandable segments grow and shrink by pages (segment_map, segment_unmap): where the trace maps all they hold,
  // it began with none of them; a trace that began with some mapped is not rebuilt (named).
  std::int64_t net_mapped = 0, expandable_final = 0;
  for (const auto& e : events) {
    if (e.action == TraceEvent::Action::segment_map) net_mapped += e.size;
    if (e.action == TraceEvent::Action::segment_unmap) net_mapped -= e.size;
  }
  for (const auto& s : final_segments) {
    if (s.device == device && !s.private_pool && s.expandable) expandable_final += s.size;
  }
  const bool expandable_cold = net_mapped >= expandable_final;
  if (!expandable_cold) {
    state.problems.push_back(fmt::format("the expandable segments hold {} at the end, the trace maps {} of it: the "
                                         "pages mapped before it began are not rebuilt", expandable_final, net_mapped));
  }
  for (const auto& s : final_segments) {
    if (s.device != device || s.private_pool) continue;
    if (s.expandable) {
      for (const auto& b : s.blocks) {
        if (b.allocated) live[b.address] = {b.size, b.requested, -1};
      }
      continue;  // mapped in the trace
    }
    segs[s.address] = {s.size, s.stream, s.small};
    for (const auto& b : s.blocks) {
      if (b.allocated) live[b.address] = {b.size, b.requested, -1};
    }
  }
  using A = TraceEvent::Action;
  for (auto it = events.rbegin(); it != events.rend(); ++it) {
    const auto& e = *it;
    const auto index = static_cast<std::int64_t>(events.rend() - it) - 1;
    switch (e.action) {
      case A::segment_alloc:
        if (segs.erase(e.addr) == 0) {
          state.problems.push_back(fmt::format("event {}: segment_alloc of {:#x}, which the final state lacks and no "
                                               "later segment_free explains", index, e.addr));
        }
        break;
      case A::segment_free: segs[e.addr] = {e.size, e.stream, e.size == kSmallBuffer}; break;
      case A::alloc:
        if (live.erase(e.addr) == 0) {
          state.problems.push_back(fmt::format("event {}: alloc of {:#x}, which is neither live at the end nor freed "
                                               "later", index, e.addr));
        }
        break;
      case A::free_completed: live[e.addr] = {0, e.size, index}; break;
      default: break;
    }
  }
  std::vector<std::pair<std::uint64_t, LiveBlock>> live_sorted(live.begin(), live.end());
  live.clear();
  std::sort(live_sorted.begin(), live_sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  // Where the trace allocates, and when: a block of unknown size ends where the trace allocates next to it.
  std::vector<std::pair<std::uint64_t, std::int64_t>> allocs;
  for (std::size_t i = 0; i < events.size(); ++i) {
    if (events[i].action == A::alloc) allocs.emplace_back(events[i].addr, static_cast<std::int64_t>(i));
  }
  std::sort(allocs.begin(), allocs.end());
  for (const auto& [address, seg] : segs) {
    InitialState::Segment s{.address = address, .size = seg.size, .stream = seg.stream, .small = seg.small,
                            .blocks = {}, .block_addresses = {}};
    const auto end = address + static_cast<std::uint64_t>(seg.size);
    std::uint64_t at = address;
    const auto first = std::lower_bound(live_sorted.begin(), live_sorted.end(), address,
                                        [](const auto& b, std::uint64_t a) { return b.first < a; });
    for (auto it = first; it != live_sorted.end() && it->first < end; ++it) {
      const auto [block_address, block] = *it;
      if (block_address > at) s.blocks.push_back({static_cast<std::int64_t>(block_address - at), std::nullopt, 0});
      const auto next = std::next(it);
      const auto boundary = next != live_sorted.end() && next->first < end ? next->first : end;
      const auto room = static_cast<std::int64_t>(boundary - block_address);
      auto size = block.size;
      if (size == 0) {
        // Allocated before the trace began and freed in it: its request rounded, plus a rest too small to have
        // been split off (the allocator never leaves one), else the rest is free.
        const AllocatorSettings defaults;
        size = CachingAllocatorModel::round_size(std::max<std::int64_t>(block.requested, 1), defaults);
        const auto rest = room - size;
        if (rest > 0 && (seg.small ? rest < kMinBlockSize : rest <= kSmallSize)) size = room;
        // In the large pool every block, free or allocated, is more than 1 MiB: an allocation the trace makes
        // within 1 MiB after the rounded end, while this block lives, starts exactly where this block ends (a rest
        // it kept, not split off).
        if (!seg.small && size < room) {
          const auto rounded_end = block_address + static_cast<std::uint64_t>(size);
          for (auto a = std::upper_bound(allocs.begin(), allocs.end(), std::pair{rounded_end, INT64_MAX});
               a != allocs.end() && a->first <= rounded_end + static_cast<std::uint64_t>(kSmallSize) &&
               a->first < boundary;
               ++a) {
            if (a->second < block.freed_at) {
              size = static_cast<std::int64_t>(a->first - block_address);
              break;
            }
          }
        }
      }
      size = std::min(size, room);
      s.blocks.push_back({size, block_address, block.requested});
      s.block_addresses.push_back(block_address);
      at = block_address + static_cast<std::uint64_t>(size);
    }
    if (at < end) s.blocks.push_back({static_cast<std::int64_t>(end - at), std::nullopt, 0});
    state.segments.push_back(std::move(s));
  }
  return state;
}

// ---------------------------------------------------------------------------------------------------------------
// The replay of one device.

std::string event_line(const Snapshot& snap, const std::vector<TraceEvent>& events, std::size_t i) {
  const auto& e = events[i];
  if (e.action == TraceEvent::Action::oom) {
    return fmt::format("#{} oom size={} ({}) stream={:#x} device_free={}", i, e.size, format_bytes(e.size), e.stream,
                       e.device_free);
  }
  if (e.action == TraceEvent::Action::other || e.action == TraceEvent::Action::snapshot ||
      e.action == TraceEvent::Action::user_defined) {
    return fmt::format("#{} {}", i, snap.name(e));
  }
  const auto where = snap.where(e);
  return fmt::format("#{} {} addr={:#x} size={} ({}) stream={:#x}{}{}", i, snap.name(e), e.addr, e.size,
                     format_bytes(e.size), e.stream, where.empty() ? "" : " at ", where);
}

std::vector<std::string> context_of(const Snapshot& snap, const std::vector<TraceEvent>& events, std::int64_t at) {
  std::vector<std::string> lines;
  const auto n = static_cast<std::int64_t>(events.size());
  for (auto i = std::max<std::int64_t>(0, at - 4); i < std::min(n, at + 3); ++i) {
    lines.push_back((i == at ? "> " : "  ") + event_line(snap, events, static_cast<std::size_t>(i)));
  }
  return lines;
}

std::string seg_text(const SegmentEvent& e) {
  return fmt::format("{} {:#x} size={} ({})", segment_event_name(e.kind), e.address, e.size, format_bytes(e.size));
}

std::string seg_list(const std::vector<SegmentEvent>& list) {
  if (list.empty()) return "no segment event";
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < list.size() && i < 6; ++i) parts.push_back(seg_text(list[i]));
  if (list.size() > 6) parts.push_back(fmt::format("and {} more", list.size() - 6));
  return fmt::format("{}", fmt::join(parts, ", "));
}

// Keeps at most kMaxSeriesPoints of a series of `count` points, the highest reserved of each stretch (the first
// among equals), so that peaks survive; as the points come, so that a trace of millions of events keeps 1,500.
class Thinned {
 public:
  explicit Thinned(std::size_t count)
      : count_(count), per_(static_cast<double>(count) / static_cast<double>(kMaxSeriesPoints)) {
    if (count_ > kMaxSeriesPoints) {
      out_.reserve(kMaxSeriesPoints);
      next_bucket();
    }
  }
  void add(const ReplayPoint& p) {
    if (count_ <= kMaxSeriesPoints) {
      out_.push_back(p);
      return;
    }
    while (seen_ >= hi_ && bucket_ < kMaxSeriesPoints) next_bucket();
    if (seen_ >= lo_ && seen_ < hi_ && (!has_best_ || p.reserved > best_.reserved)) {
      best_ = p;
      has_best_ = true;
    }
    ++seen_;
  }
  [[nodiscard]] std::vector<ReplayPoint> take() {
    if (count_ > kMaxSeriesPoints && has_best_) out_.push_back(best_);
    has_best_ = false;
    return std::move(out_);
  }

 private:
  // Closes the stretch [lo_, hi_) and opens the next that is not empty.
  void next_bucket() {
    if (has_best_) out_.push_back(best_);
    has_best_ = false;
    for (; bucket_ < kMaxSeriesPoints; ++bucket_) {
      lo_ = static_cast<std::size_t>(static_cast<double>(bucket_) * per_);
      hi_ = std::min(count_, static_cast<std::size_t>(static_cast<double>(bucket_ + 1) * per_));
      if (lo_ < hi_) {
        ++bucket_;
        return;
      }
    }
    lo_ = hi_ = count_;
  }

  std::size_t count_;
  double per_;
  std::size_t bucket_ = 0, lo_ = 0, hi_ = 0, seen_ = 0;
  bool has_best_ = false;
  ReplayPoint best_;
  std::vector<ReplayPoint> out_;
};

// The points a replay of `events` notes: one before the first event, one per request, free and out-of-memory event,
// and `final` more.
std::size_t series_points(const std::vector<TraceEvent>& events, std::size_t final) {
  using A = TraceEvent::Action;
  return 1 + final + static_cast<std::size_t>(std::count_if(events.begin(), events.end(), [](const TraceEvent& e) {
           return e.action == A::alloc || e.action == A::free_completed || e.action == A::oom;
         }));
}

// Which request made each segment (by the segment's address), for the fragmentation report.
struct SegmentOrigin {
  std::int64_t event = -1;
  std::int64_t size = 0;
  std::string where;
};

Fragmentation fragmentation_of(const CachingAllocatorModel& model, std::int64_t event,
                               const std::unordered_map<std::uint64_t, SegmentOrigin>& origins) {
  Fragmentation f;
  f.event = event;
  f.reserved = model.reserved();
  f.allocated = model.allocated();
  f.largest_free_block = model.largest_free_block();
  for (const auto& s : model.segment_views()) {
    std::int64_t allocated = 0;
    for (const auto& b : s.blocks) allocated += b.allocated ? b.size : 0;
    if (2 * allocated >= s.size) continue;
    Fragmentation::Segment seg{.address = s.address, .size = s.size, .allocated = allocated, .made_by_event = -1,
                               .made_by_size = 0, .where = {}};
    if (const auto it = origins.find(s.address); it != origins.end()) {
      seg.made_by_event = it->second.event;
      seg.made_by_size = it->second.size;
      seg.where = it->second.where;
    }
    f.emptiest.push_back(std::move(seg));
  }
  std::sort(f.emptiest.begin(), f.emptiest.end(), [](const auto& a, const auto& b) {
    return a.size - a.allocated != b.size - b.allocated ? a.size - a.allocated > b.size - b.allocated
                                                        : a.address < b.address;
  });
  if (f.emptiest.size() > 10) f.emptiest.resize(10);
  return f;
}

// A model started from the state the trace began in; its blocks named by the recorded address they stand for.
struct Replica {
  CachingAllocatorModel model;
  std::unordered_map<std::uint64_t, std::uint64_t> id_of;  // recorded address -> the model's id
  std::uint64_t next_id = 1;

  Replica(const AllocatorSettings& settings, const InitialState& initial) : model(settings) {
    model.record_segment_events(true);
    for (const auto& s : initial.segments) {
      auto blocks = s.blocks;
      for (auto& b : blocks) {
        if (!b.id) continue;
        const auto address = *b.id;  // reconstruct() names allocated blocks by their address
        const auto id = next_id++;
        id_of[address] = id;
        b.id = id;
      }
      model.add_segment(s.address, s.stream, s.small, blocks);
    }
    model.reset_peak();
  }
};

// What a replay keeps as it goes: the peak of the live requests, the state at the peak of reserved bytes, the
// request that made each segment, and the plot.
class Timeline {
 public:
  /// `points`: how many note() will be called, plus one (the state before the first event).
  Timeline(const CachingAllocatorModel& model, std::size_t points)
      : peak_active_(model.requested()), peak_blocks_(model.allocated()), peak_reserved_(model.reserved()),
        fragmentation_(fragmentation_of(model, -1, origins_)), series_(points) {
    series_.add({-1, model.reserved(), model.requested()});
  }

  /// The segments among `events` were made by the request of `size` at event `at`.
  void made(const std::vector<SegmentEvent>& events, std::int64_t at, std::int64_t size, std::string_view where) {
    for (const auto& s : events) {
      if (s.kind == SegmentEvent::Kind::alloc || s.kind == SegmentEvent::Kind::map) {
        origins_[s.address] = {at, size, std::string(where)};
      }
    }
  }
  /// The model's state after event `at`.
  void note(const CachingAllocatorModel& model, std::int64_t at) {
    peak_active_ = std::max(peak_active_, model.requested());
    peak_blocks_ = std::max(peak_blocks_, model.allocated());
    if (model.reserved() > peak_reserved_) {
      peak_reserved_ = model.reserved();
      fragmentation_ = fragmentation_of(model, at, origins_);
    }
    series_.add({at, model.reserved(), model.requested()});
  }
  [[nodiscard]] std::int64_t peak_active() const { return peak_active_; }
  [[nodiscard]] std::int64_t peak_blocks() const { return peak_blocks_; }
  [[nodiscard]] const Fragmentation& fragmentation() const { return fragmentation_; }
  [[nodiscard]] std::vector<ReplayPoint> series() { return series_.take(); }

 private:
  std::unordered_map<std::uint64_t, SegmentOrigin> origins_;  // declared first: the constructor reads it
  std::int64_t peak_active_;
  std::int64_t peak_blocks_;
  std::int64_t peak_reserved_;
  Fragmentation fragmentation_;
  Thinned series_;
};

class DeviceReplayer {
 public:
  DeviceReplayer(const Snapshot& snap, int device)
      : snap_(snap), device_(device), events_(snap.device_traces[static_cast<std::size_t>(device)]),
        initial_(reconstruct(snap.segments, events_, device)) {}

  DeviceReplay run(const std::vector<WhatIfSpec>& what_ifs) {
    DeviceReplay out;
    out.device = device_;
    out.events = static_cast<std::int64_t>(events_.size());
    out.settings = snap_.settings;
    out.initial_segments = static_cast<std::int64_t>(initial_.segments.size());
    for (const auto& s : initial_.segments) {
      out.initial_reserved += s.size;
      for (const auto& b : s.blocks) {
        if (b.id) out.initial_allocated += b.size;
      }
    }
    name_what_is_not_followed(out);
    record(out);
    compare(out);
    out.exact = comparable_ && !out.first_divergence && out.recorded.peak_reserved == out.replayed.peak_reserved &&
                out.recorded.segment_allocs == out.replayed.segment_allocs &&
                out.recorded.segment_frees == out.replayed.segment_frees;
    out.compared = comparable_;
    for (const auto& spec : what_ifs) out.what_if.push_back(what_if(spec));
    return out;
  }

  [[nodiscard]] bool comparable() const { return comparable_; }

 private:
  void name_what_is_not_followed(DeviceReplay& out) {
    std::map<std::string, std::int64_t> unknown;
    for (const auto& e : events_) {
      if (e.action == TraceEvent::Action::other) ++unknown[std::string(snap_.name(e))];
    }
    for (const auto& [name, count] : unknown) {
      out.not_followed.push_back(fmt::format("{} '{}' event(s): an action the model does not know", count, name));
    }
    const auto graph = std::count_if(snap_.segments.begin(), snap_.segments.end(), [&](const RecordedSegment& s) {
      return s.device == device_ && s.private_pool;
    });
    if (graph > 0) {
      out.not_followed.push_back(fmt::format("{} segment(s) of CUDA graph pools: replayed as absent", graph));
    }
    if (snap_.settings.expandable_segments) {
      comparable_ = false;
      out.not_followed.push_back(
          "expandable segments: the model maps pages at the end of each stream's segment, where PyTorch first fills "
          "gaps it unmapped; this trace is replayed (its totals beside the recording's) but not compared event by "
          "event");
    }
    if (snap_.settings_text.starts_with("memgate:")) {
      comparable_ = false;
      out.not_followed.push_back(fmt::format(
          "recorded by memgate's {}, not the CUDA caching allocator: the replay shows what the CUDA allocator would "
          "reserve for these requests, nothing to compare", snap_.settings_text.substr(8)));
    }
    for (const auto& p : initial_.problems) out.not_followed.push_back("the trace and the final state disagree: " + p);
    if (!initial_.problems.empty()) comparable_ = false;
  }

  // What the real allocator did: reserved bytes after each event, peaks, segment events.
  void record(DeviceReplay& out) {
    using A = TraceEvent::Action;
    std::int64_t reserved = out.initial_reserved;
    std::int64_t active = 0;  // the live requests' bytes
    std::unordered_map<std::uint64_t, std::int64_t> live_requested;  // by recorded address
    for (const auto& s : initial_.segments) {
      for (const auto& b : s.blocks) {
        if (!b.id) continue;
        live_requested[*b.id] = b.requested;
        active += b.requested;
      }
    }
    out.recorded.peak_reserved = reserved;
    out.recorded.peak_allocated = active;
    Thinned series(events_.size() + 1);
    series.add({-1, reserved, active});
    for (std::size_t i = 0; i < events_.size(); ++i) {
      const auto& e = events_[i];
      switch (e.action) {
        case A::segment_alloc:
        case A::segment_map:
          reserved += e.size;
          ++out.recorded.segment_allocs;
          break;
        case A::segment_free:
        case A::segment_unmap:
          reserved -= e.size;
          ++out.recorded.segment_frees;
          break;
        case A::alloc:
          active += e.size;
          live_requested[e.addr] = e.size;
          ++out.requests;
          break;
        case A::free_completed:
          if (const auto it = live_requested.find(e.addr); it != live_requested.end()) {
            active -= it->second;
            live_requested.erase(it);
          }
          break;
        default: break;
      }
      out.recorded.peak_reserved = std::max(out.recorded.peak_reserved, reserved);
      out.recorded.peak_allocated = std::max(out.recorded.peak_allocated, active);
      series.add({static_cast<std::int64_t>(i), reserved, active});
    }
    out.recorded_series = series.take();
  }

  // The recorded settings, compared: segment events in order (size, address), each request's address, reserved
  // bytes after every request, and the final state.
  void compare(DeviceReplay& out) {
    using A = TraceEvent::Action;
    Replica replica(snap_.settings, initial_);
    auto& model = replica.model;
    auto& id_of = replica.id_of;
    Timeline timeline(model, series_points(events_, 1));

    std::vector<std::size_t> pending;  // recorded segment events since the last request
    std::deque<std::size_t> unused_allocs;
    std::int64_t recorded_reserved = out.initial_reserved;

    const auto diverge = [&](std::int64_t at, std::string expected, std::string replayed) {
      if (out.first_divergence || !comparable_) return;
      out.first_divergence = Divergence{at, at < static_cast<std::int64_t>(events_.size())
                                                ? std::string(snap_.name(events_[static_cast<std::size_t>(at)]))
                                                : "final state",
                                        std::move(expected), std::move(replayed), context_of(snap_, events_, at)};
    };
    // The address a new segment gets: the real one, from the recorded segment_alloc of that size not yet matched.
    model.set_address_source([&](std::int64_t size, std::uint64_t stream) -> std::optional<std::uint64_t> {
      for (auto it = unused_allocs.begin(); it != unused_allocs.end(); ++it) {
        const auto& e = events_[*it];
        if (e.size == size && e.stream == stream) {
          const auto address = e.addr;
          unused_allocs.erase(it);
          return address;
        }
      }
      return std::nullopt;
    });
    const auto compare_events = [&](std::int64_t at, const std::vector<SegmentEvent>& replayed,
                                     const std::vector<std::size_t>& recorded) {
      std::vector<SegmentEvent> expected;
      for (const auto i : recorded) {
        const auto& e = events_[i];
        const auto kind = e.action == A::segment_alloc ? SegmentEvent::Kind::alloc
                          : e.action == A::segment_free ? SegmentEvent::Kind::free
                          : e.action == A::segment_map  ? SegmentEvent::Kind::map
                                                        : SegmentEvent::Kind::unmap;
        expected.push_back({kind, e.addr, e.size, e.stream});
      }
      if (expected != replayed) diverge(at, seg_list(expected), seg_list(replayed));
    };
    // Segment frees the requests do not explain: empty_cache(), or the release before an out-of-memory retry. The
    // model's own empty_cache() must free exactly those segments, in the same order.
    const auto external_release = [&](std::int64_t at) {
      std::size_t k = 0;
      while (k < pending.size() && events_[pending[k]].action == A::segment_free) ++k;
      if (k == 0) return;
      model.clear_segment_events();
      model.empty_cache();
      ++out.external_releases;
      const std::vector<std::size_t> released(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(k));
      compare_events(at, model.segment_events(), released);
      pending.erase(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(k));
      model.clear_segment_events();
    };

    for (std::size_t i = 0; i < events_.size(); ++i) {
      const auto& e = events_[i];
      const auto at = static_cast<std::int64_t>(i);
      switch (e.action) {
        case A::segment_alloc:
        case A::segment_map:
          pending.push_back(i);
          unused_allocs.push_back(i);
          recorded_reserved += e.size;
          continue;
        case A::segment_free:
        case A::segment_unmap:
          pending.push_back(i);
          recorded_reserved -= e.size;
          continue;
        case A::alloc: {
          external_release(at);
          model.clear_segment_events();
          const auto id = replica.next_id++;
          if (id_of.contains(e.addr)) {
            diverge(at, fmt::format("an alloc at {:#x}", e.addr), "that address is still allocated in the replay");
          }
          id_of[e.addr] = id;
          const auto address = model.malloc(id, e.size, e.stream);
          timeline.made(model.segment_events(), at, e.size, snap_.where(e));
          compare_events(at, model.segment_events(), pending);
          pending.clear();
          unused_allocs.clear();
          if (address && *address != e.addr) {
            diverge(at, fmt::format("the block at {:#x}", e.addr), fmt::format("the block at {:#x}", *address));
          } else if (address) {
            ++out.addresses_compared;
          }
          break;
        }
        case A::free_completed: {
          external_release(at);
          model.clear_segment_events();
          if (const auto it = id_of.find(e.addr); it != id_of.end()) {
            model.free(it->second);
            id_of.erase(it);
          } else {
            diverge(at, fmt::format("a free of the block at {:#x}", e.addr), "no block allocated there");
          }
          compare_events(at, model.segment_events(), pending);
          pending.clear();
          unused_allocs.clear();
          break;
        }
        case A::oom: {
          // The real allocator found no cached block, freed the cache (the segment frees just before) and failed.
          external_release(at);
          compare_events(at, {}, pending);
          pending.clear();
          unused_allocs.clear();
          // A request past any GPU's memory (a size a program got wrong) fits no cached block either.
          if (e.size <= kMaxSnapshotBytes && model.has_free_block(e.size, e.stream)) {
            diverge(at, fmt::format("no cached block of {} on stream {:#x}", format_bytes(e.size), e.stream),
                    "a cached block that holds it");
          }
          break;
        }
        default: continue;
      }
      if (model.reserved() != recorded_reserved) {
        diverge(at, fmt::format("reserved {} ({})", recorded_reserved, format_bytes(recorded_reserved)),
                fmt::format("reserved {} ({})", model.reserved(), format_bytes(model.reserved())));
      }
      timeline.note(model, at);
    }
    const auto end = static_cast<std::int64_t>(events_.size());
    external_release(end);
    if (!pending.empty()) compare_events(end, {}, pending);
    timeline.note(model, end - 1);
    compare_final_state(model, out, diverge);

    out.replayed.peak_reserved = model.peak_reserved();
    out.replayed.segment_allocs = model.segment_allocs();
    out.replayed.segment_frees = model.segment_frees();
    out.replayed.peak_allocated = timeline.peak_active();
    out.replayed.peak_allocated_blocks = timeline.peak_blocks();
    out.replayed_series = timeline.series();
    out.fragmentation = timeline.fragmentation();
  }

  template <typename Diverge>
  void compare_final_state(const CachingAllocatorModel& model, DeviceReplay& out, Diverge&& diverge) {
    if (!comparable_) return;
    const auto at = static_cast<std::int64_t>(events_.size());
    std::vector<const RecordedSegment*> recorded;
    for (const auto& s : snap_.segments) {
      if (s.device == device_ && !s.private_pool) recorded.push_back(&s);
    }
    std::sort(recorded.begin(), recorded.end(), [](const auto* a, const auto* b) { return a->address < b->address; });
    const auto views = model.segment_views();
    if (views.size() != recorded.size()) {
      diverge(at, fmt::format("{} segments at the end", recorded.size()), fmt::format("{} segments", views.size()));
      return;
    }
    for (std::size_t i = 0; i < views.size(); ++i) {
      const auto& r = *recorded[i];
      const auto& v = views[i];
      if (r.address != v.address || r.size != v.size) {
        diverge(at, fmt::format("the segment {:#x} of {} at the end", r.address, format_bytes(r.size)),
                fmt::format("the segment {:#x} of {}", v.address, format_bytes(v.size)));
        return;
      }
      std::vector<std::string> rb, vb;
      for (const auto& b : r.blocks) rb.push_back(fmt::format("{:#x}+{}{}", b.address, b.size, b.allocated ? "*" : ""));
      for (const auto& b : v.blocks) vb.push_back(fmt::format("{:#x}+{}{}", b.address, b.size, b.allocated ? "*" : ""));
      if (rb != vb) {
        diverge(at, fmt::format("the blocks of segment {:#x} at the end: {}", r.address, fmt::join(rb, " ")),
                fmt::format("{}", fmt::join(vb, " ")));
        return;
      }
    }
  }

  // The requests alone under `settings` and `capacity`: what a what-if reports.
  WhatIfResult run_requests(const AllocatorSettings& settings, std::optional<std::int64_t> capacity) {
    using A = TraceEvent::Action;
    WhatIfResult r;
    r.settings = settings;
    Replica replica(settings, initial_);
    auto& model = replica.model;
    auto& id_of = replica.id_of;
    model.set_capacity(capacity);
    // New segments get the addresses CUDA gave the recording, segment size by segment size in the order it gave
    // them, where the model holds nothing there: ties between equal free blocks go by address, as they did.
    std::map<std::pair<std::int64_t, std::uint64_t>, std::deque<std::uint64_t>> recorded_addresses;
    for (const auto& e : events_) {
      if (e.action == A::segment_alloc) recorded_addresses[{e.size, e.stream}].push_back(e.addr);
    }
    model.set_address_source([&](std::int64_t size, std::uint64_t stream) -> std::optional<std::uint64_t> {
      auto& queue = recorded_addresses[{size, stream}];
      for (auto it = queue.begin(); it != queue.end(); ++it) {
        if (!model.overlaps_segment(*it, size)) {
          const auto address = *it;
          queue.erase(it);
          return address;
        }
      }
      return std::nullopt;
    });
    Timeline timeline(model, series_points(events_, 0));
    bool releasing = false;  // inside a run of recorded segment frees no request explains
    // The segments a request made, and the model's log cleared for the next event.
    const auto made = [&](std::int64_t at, std::string_view where, std::int64_t size) {
      timeline.made(model.segment_events(), at, size, where);
      model.clear_segment_events();
    };
    for (std::size_t i = 0; i < events_.size(); ++i) {
      const auto& e = events_[i];
      const auto at = static_cast<std::int64_t>(i);
      if (e.action == A::segment_free || e.action == A::segment_unmap) {
        if (!releasing) {
          model.empty_cache();  // the program's empty_cache(), where the recording has one
          model.clear_segment_events();
          releasing = true;
        }
        continue;
      }
      if (e.action != A::segment_alloc && e.action != A::segment_map) releasing = false;
      if (e.action == A::alloc) {
        const auto id = replica.next_id++;
        id_of[e.addr] = id;
        const auto address = model.malloc(id, e.size, e.stream);
        made(at, snap_.where(e), e.size);
        if (!address) {
          ++r.ooms;
          id_of.erase(e.addr);
          if (r.first_oom_event < 0) {
            r.first_oom_event = at;
            r.first_oom_size = e.size;
          }
        }
      } else if (e.action == A::free_completed) {
        if (const auto it = id_of.find(e.addr); it != id_of.end()) {
          model.free(it->second);
          id_of.erase(it);
        }
        model.clear_segment_events();
      } else if (e.action == A::oom) {
        // The request that failed on the real GPU: would it fit here? The program did not go on with it. One past
        // any GPU's memory fits nowhere (and would pass 64 bits in the model's sums).
        const auto id = replica.next_id++;
        const auto address =
            e.size <= kMaxSnapshotBytes ? model.malloc(id, e.size, e.stream) : std::optional<std::uint64_t>();
        made(at, "the request that ran out of memory", e.size);
        if (!address) {
          ++r.ooms;
          if (r.first_oom_event < 0) {
            r.first_oom_event = at;
            r.first_oom_size = e.size;
          }
        } else {
          model.free(id);
        }
      } else {
        continue;
      }
      timeline.note(model, at);
    }
    r.totals.peak_reserved = model.peak_reserved();
    r.totals.peak_allocated = timeline.peak_active();
    r.totals.peak_allocated_blocks = timeline.peak_blocks();
    r.fragmentation = timeline.fragmentation();
    r.totals.segment_allocs = model.segment_allocs();
    r.totals.segment_frees = model.segment_frees();
    r.fits = r.ooms == 0;
    r.retries = model.alloc_retries();
    r.series = timeline.series();
    return r;
  }

  WhatIfResult what_if(const WhatIfSpec& spec) {
    auto r = run_requests(spec.settings.value_or(snap_.settings), spec.capacity);
    r.spec = spec;
    return r;
  }

  const Snapshot& snap_;
  int device_;
  const std::vector<TraceEvent>& events_;
  InitialState initial_;
  bool comparable_ = true;
};

}  // namespace

ReplayReport replay_snapshot(const Snapshot& snapshot, const std::vector<WhatIfSpec>& what_ifs) {
  ReplayReport report;
  report.file = utf8_text(snapshot.origin);  // a file name need not be UTF-8; the JSON report must be
  report.has_settings = snapshot.has_settings;
  report.settings_text = snapshot.settings_text;
  for (std::size_t d = 0; d < snapshot.device_traces.size(); ++d) {
    if (snapshot.device_traces[d].empty()) continue;
    DeviceReplayer replayer(snapshot, static_cast<int>(d));
    report.devices.push_back(replayer.run(what_ifs));
  }
  return report;
}

}  // namespace memgate
