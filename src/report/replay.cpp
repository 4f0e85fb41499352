// memgate replay: a real trace's requests through the caching allocator's model, compared event by event.
#include "memgate/report/replay.h"

#include "memgate/base/error.h"
#include "memgate/base/units.h"
#include "memgate/report/snapshot_pickle.h"
#include "memgate/report/svg_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>
#include <unordered_map>

namespace memgate {
namespace {

using nlohmann::json;

constexpr std::int64_t kSmallSize = CachingAllocatorModel::kSmallSize;
constexpr std::int64_t kSmallBuffer = CachingAllocatorModel::kSmallBuffer;
constexpr std::int64_t kMinBlockSize = CachingAllocatorModel::kMinBlockSize;
constexpr std::size_t kMaxSeriesPoints = 1500;

// ---------------------------------------------------------------------------------------------------------------
// Reading: every value checked, every error naming the file, the key's path and what was expected.

std::string describe(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "None";
    case json::value_t::boolean: return v.get<bool>() ? "True" : "False";
    case json::value_t::number_integer: return fmt::format("the integer {}", v.get<std::int64_t>());
    case json::value_t::number_unsigned: return fmt::format("the integer {}", v.get<std::uint64_t>());
    case json::value_t::number_float: return fmt::format("the float {}", v.get<double>());
    case json::value_t::string: {
      auto s = v.get<std::string>();
      if (s.size() > 40) s = s.substr(0, 40) + "...";
      return fmt::format("the string '{}'", s);
    }
    case json::value_t::array: return fmt::format("a list of {}", v.size());
    case json::value_t::object: return "a dict";
    case json::value_t::binary: return "bytes";
    default: return "a value of another kind";
  }
}

class Reader {
 public:
  explicit Reader(const std::string& origin) : origin_(origin) {}

  [[noreturn]] void fail(const std::string& path, std::string_view expected, const json& got) const {
    throw Error(fmt::format("{}: {}: expected {}, got {}", origin_, path, expected, describe(got)));
  }
  [[noreturn]] void fail(const std::string& path, std::string_view message) const {
    throw Error(fmt::format("{}: {}: {}", origin_, path, message));
  }
  const json& key(const json& obj, const std::string& path, const char* name) const {
    const auto it = obj.find(name);
    if (it == obj.end()) fail(path, fmt::format("the key '{}' is missing", name));
    return *it;
  }
  const json* optional_key(const json& obj, const char* name) const {
    const auto it = obj.find(name);
    return it == obj.end() ? nullptr : &*it;
  }
  const json& object(const json& v, const std::string& path) const {
    if (!v.is_object()) fail(path, "a dict", v);
    return v;
  }
  const json& list(const json& v, const std::string& path) const {
    if (!v.is_array()) fail(path, "a list", v);
    return v;
  }
  std::int64_t size(const json& v, const std::string& path) const {
    if (v.is_number_integer() && !v.is_number_unsigned() && v.get<std::int64_t>() >= 0) return v.get<std::int64_t>();
    if (v.is_number_unsigned() && v.get<std::uint64_t>() <= static_cast<std::uint64_t>(INT64_MAX)) {
      return static_cast<std::int64_t>(v.get<std::uint64_t>());
    }
    fail(path, "a size in bytes (an integer from 0)", v);
  }
  std::int64_t integer(const json& v, const std::string& path) const {
    if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<std::int64_t>();
    if (v.is_number_unsigned() && v.get<std::uint64_t>() <= static_cast<std::uint64_t>(INT64_MAX)) {
      return static_cast<std::int64_t>(v.get<std::uint64_t>());
    }
    fail(path, "an integer", v);
  }
  // Addresses and streams: unsigned 64-bit, as C pointers (PyTorch writes them as Python ints).
  std::uint64_t word(const json& v, const std::string& path) const {
    if (v.is_number_unsigned()) return v.get<std::uint64_t>();
    if (v.is_number_integer()) return static_cast<std::uint64_t>(v.get<std::int64_t>());
    fail(path, "an address (an integer)", v);
  }
  std::string string(const json& v, const std::string& path) const {
    if (!v.is_string()) fail(path, "a string", v);
    return v.get<std::string>();
  }
  bool boolean(const json& v, const std::string& path) const {
    if (!v.is_boolean()) fail(path, "True or False", v);
    return v.get<bool>();
  }

 private:
  const std::string& origin_;
};

TraceEvent::Action action_of(std::string_view name) {
  using A = TraceEvent::Action;
  static const std::map<std::string_view, A> kActions = {
      {"alloc", A::alloc},           {"free_requested", A::free_requested}, {"free_completed", A::free_completed},
      {"segment_alloc", A::segment_alloc}, {"segment_free", A::segment_free}, {"segment_map", A::segment_map},
      {"segment_unmap", A::segment_unmap}, {"oom", A::oom}};
  const auto it = kActions.find(name);
  return it == kActions.end() ? A::other : it->second;
}

std::string text_at(const json& obj, const char* key) {
  const auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get_ref<const std::string&>() : std::string();
}

// The first frame of the program rather than of torch or C++: "file:line function".
std::string where_of(const json& frames) {
  if (!frames.is_array()) return {};
  const json* chosen = nullptr;
  int rank = 0;  // 3: the program's Python, 2: any Python, 1: any frame
  for (const auto& f : frames) {
    if (!f.is_object()) continue;
    const auto file = text_at(f, "filename");
    const bool python = file.ends_with(".py");
    const bool library = file.find("/torch/") != std::string::npos || file.find("site-packages") != std::string::npos ||
                         file.find("dist-packages") != std::string::npos;
    const int r = python && !library ? 3 : python ? 2 : 1;
    if (r > rank) {
      rank = r;
      chosen = &f;
      if (r == 3) break;
    }
  }
  if (chosen == nullptr) return {};
  const auto file = text_at(*chosen, "filename");
  const auto line_it = chosen->find("line");
  const auto line = line_it != chosen->end() && line_it->is_number_integer() ? line_it->get<std::int64_t>() : 0;
  const auto name = text_at(*chosen, "name");
  const auto slash = file.find_last_of("/\\");
  return fmt::format("{}:{} {}", slash == std::string::npos ? file : file.substr(slash + 1), line, name);
}

// allocator_settings as PyTorch writes them (2.1+): the recorded PYTORCH_CUDA_ALLOC_CONF, then each setting.
AllocatorSettings read_settings(const Reader& r, const json& s, const std::string& origin, std::string& conf_text) {
  const std::string path = "allocator_settings";
  r.object(s, path);
  AllocatorSettings settings;
  if (const auto* conf = r.optional_key(s, "PYTORCH_CUDA_ALLOC_CONF")) {
    conf_text = r.string(*conf, path + ".PYTORCH_CUDA_ALLOC_CONF");
  }
  if (const auto* v = r.optional_key(s, "expandable_segments")) {
    settings.expandable_segments = r.boolean(*v, path + ".expandable_segments");
  }
  if (const auto* v = r.optional_key(s, "max_split_size")) {
    const auto n = r.integer(*v, path + ".max_split_size");
    if (n > 0) settings.max_split_size = n;
  }
  if (const auto* v = r.optional_key(s, "garbage_collection_threshold")) {
    if (!v->is_number()) r.fail(path + ".garbage_collection_threshold", "a number", *v);
    settings.garbage_collection_threshold = v->get<double>();
  }
  if (const auto* v = r.optional_key(s, "roundup_power2_divisions")) {
    const auto p = path + ".roundup_power2_divisions";
    r.object(*v, p);
    // Keyed by the interval's start in MiB: "1", "2", ... "32768".
    for (std::size_t i = 0; i < 16; ++i) {
      const auto k = std::to_string(std::int64_t{1} << i);
      if (const auto* d = r.optional_key(*v, k.c_str())) settings.roundup_power2_divisions[i] = r.size(*d, p + "." + k);
    }
  }
  // What the settings say wins over the text, which an old PyTorch may not have applied; both read strictly.
  if (!conf_text.empty()) {
    try {
      const auto from_text = AllocatorSettings::parse(conf_text, origin + ": allocator_settings.PYTORCH_CUDA_ALLOC_CONF");
      if (!r.optional_key(s, "max_non_split_rounding_size")) settings.max_non_split_rounding = from_text.max_non_split_rounding;
    } catch (const Error&) {
      // A setting memgate does not know is named by the replay, not fatal: the recorded values above still hold.
    }
  }
  if (const auto* v = r.optional_key(s, "max_non_split_rounding_size")) {
    const auto n = r.integer(*v, path + ".max_non_split_rounding_size");
    if (n > 0) settings.max_non_split_rounding = n;
  }
  return settings;
}

}  // namespace

Snapshot read_snapshot(const json& data, const std::string& origin) {
  const Reader r(origin);
  Snapshot snap;
  snap.origin = origin;
  if (!data.is_object()) {
    throw Error(fmt::format("{}: expected a memory snapshot (a dict with 'segments' and 'device_traces', as "
                            "torch.cuda.memory._dump_snapshot writes), got {}{}", origin, describe(data),
                            data.is_array() ? " (torch.cuda.memory_snapshot()'s list of segments has no trace)" : ""));
  }
  const auto& segments = r.list(r.key(data, "snapshot", "segments"), "segments");
  const auto* traces = r.optional_key(data, "device_traces");
  if (traces == nullptr) {
    throw Error(fmt::format("{}: the snapshot has no 'device_traces': record the trace with "
                            "torch.cuda.memory._record_memory_history() before _dump_snapshot", origin));
  }
  if (const auto* settings = r.optional_key(data, "allocator_settings")) {
    snap.has_settings = true;
    snap.settings = read_settings(r, *settings, origin, snap.settings_text);
    if (settings->is_object() && settings->contains("memgate_allocator")) snap.settings_text = "memgate:" +
        r.string((*settings)["memgate_allocator"], "allocator_settings.memgate_allocator");
  }
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const auto path = fmt::format("segments[{}]", i);
    const auto& s = r.object(segments[i], path);
    RecordedSegment seg;
    seg.device = static_cast<int>(r.integer(r.key(s, path, "device"), path + ".device"));
    seg.address = r.word(r.key(s, path, "address"), path + ".address");
    seg.size = r.size(r.key(s, path, "total_size"), path + ".total_size");
    if (const auto* v = r.optional_key(s, "stream")) seg.stream = r.word(*v, path + ".stream");
    if (const auto* v = r.optional_key(s, "segment_type")) {
      const auto type = r.string(*v, path + ".segment_type");
      if (type != "small" && type != "large") r.fail(path + ".segment_type", "'small' or 'large'", *v);
      seg.small = type == "small";
    } else {
      seg.small = seg.size == kSmallBuffer;
    }
    if (const auto* v = r.optional_key(s, "is_expandable")) seg.expandable = r.boolean(*v, path + ".is_expandable");
    if (const auto* v = r.optional_key(s, "segment_pool_id")) {
      if (v->is_array() && v->size() == 2 && ((*v)[0] != 0 || (*v)[1] != 0)) seg.private_pool = true;
    }
    const auto& blocks = r.list(r.key(s, path, "blocks"), path + ".blocks");
    std::uint64_t at = seg.address;
    std::int64_t total = 0;
    for (std::size_t j = 0; j < blocks.size(); ++j) {
      const auto bpath = fmt::format("{}.blocks[{}]", path, j);
      const auto& b = r.object(blocks[j], bpath);
      RecordedBlock block;
      block.size = r.size(r.key(b, bpath, "size"), bpath + ".size");
      block.address = at;
      if (const auto* v = r.optional_key(b, "address")) block.address = r.word(*v, bpath + ".address");
      if (block.address != at) {
        r.fail(bpath + ".address", fmt::format("{:#x}, the end of the block before it", at), b["address"]);
      }
      if (const auto* v = r.optional_key(b, "requested_size")) block.requested = r.size(*v, bpath + ".requested_size");
      const auto state = r.string(r.key(b, bpath, "state"), bpath + ".state");
      if (state != "active_allocated" && state != "active_pending_free" && state != "inactive") {
        r.fail(bpath + ".state", "'active_allocated', 'active_pending_free' or 'inactive'", b["state"]);
      }
      block.allocated = state != "inactive";
      at += static_cast<std::uint64_t>(block.size);
      total += block.size;
      seg.blocks.push_back(block);
    }
    if (total != seg.size && !seg.expandable) {
      r.fail(path + ".blocks", fmt::format("blocks that sum to total_size {}, not {}", seg.size, total));
    }
    snap.segments.push_back(std::move(seg));
  }
  r.list(*traces, "device_traces");
  for (std::size_t d = 0; d < traces->size(); ++d) {
    const auto dpath = fmt::format("device_traces[{}]", d);
    const auto& trace = r.list((*traces)[d], dpath);
    std::vector<TraceEvent> events;
    events.reserve(trace.size());
    for (std::size_t i = 0; i < trace.size(); ++i) {
      const auto path = fmt::format("{}[{}]", dpath, i);
      const auto& e = r.object(trace[i], path);
      TraceEvent ev;
      ev.name = r.string(r.key(e, path, "action"), path + ".action");
      ev.action = action_of(ev.name);
      if (ev.action == TraceEvent::Action::other) {
        events.push_back(std::move(ev));
        continue;
      }
      if (ev.action == TraceEvent::Action::oom) {
        ev.device_free = r.size(r.key(e, path, "device_free"), path + ".device_free");
      } else {
        ev.addr = r.word(r.key(e, path, "addr"), path + ".addr");
      }
      ev.size = r.size(r.key(e, path, "size"), path + ".size");
      if (const auto* v = r.optional_key(e, "stream")) ev.stream = r.word(*v, path + ".stream");
      if (ev.action == TraceEvent::Action::alloc) {
        if (const auto* f = r.optional_key(e, "frames")) ev.where = where_of(*f);
      }
      events.push_back(std::move(ev));
    }
    snap.device_traces.push_back(std::move(events));
  }
  return snap;
}

Snapshot load_snapshot(const std::string& path) { return read_snapshot(load_plain_pickle(path), path); }

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
  std::map<std::uint64_t, LiveBlock> live;
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
    for (auto it = live.lower_bound(address); it != live.end() && it->first < end; ++it) {
      const auto [block_address, block] = *it;
      if (block_address > at) s.blocks.push_back({static_cast<std::int64_t>(block_address - at), std::nullopt, 0});
      const auto next = std::next(it);
      const auto boundary = next != live.end() && next->first < end ? next->first : end;
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

std::string event_line(const std::vector<TraceEvent>& events, std::size_t i) {
  const auto& e = events[i];
  if (e.action == TraceEvent::Action::oom) {
    return fmt::format("#{} oom size={} ({}) stream={:#x} device_free={}", i, e.size, format_bytes(e.size), e.stream,
                       e.device_free);
  }
  if (e.action == TraceEvent::Action::other) return fmt::format("#{} {}", i, e.name);
  return fmt::format("#{} {} addr={:#x} size={} ({}) stream={:#x}{}", i, e.name, e.addr, e.size, format_bytes(e.size),
                     e.stream, e.where.empty() ? "" : " at " + e.where);
}

std::vector<std::string> context_of(const std::vector<TraceEvent>& events, std::int64_t at) {
  std::vector<std::string> lines;
  const auto n = static_cast<std::int64_t>(events.size());
  for (auto i = std::max<std::int64_t>(0, at - 4); i < std::min(n, at + 3); ++i) {
    lines.push_back((i == at ? "> " : "  ") + event_line(events, static_cast<std::size_t>(i)));
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

// Keeps at most kMaxSeriesPoints points, the highest reserved of each stretch, so that peaks survive.
std::vector<ReplayPoint> thin(const std::vector<ReplayPoint>& points) {
  if (points.size() <= kMaxSeriesPoints) return points;
  std::vector<ReplayPoint> out;
  const double per = static_cast<double>(points.size()) / static_cast<double>(kMaxSeriesPoints);
  for (std::size_t b = 0; b < kMaxSeriesPoints; ++b) {
    const auto lo = static_cast<std::size_t>(static_cast<double>(b) * per);
    const auto hi = std::min(points.size(), static_cast<std::size_t>(static_cast<double>(b + 1) * per));
    if (lo >= hi) continue;
    const auto best = std::max_element(points.begin() + static_cast<std::ptrdiff_t>(lo),
                                       points.begin() + static_cast<std::ptrdiff_t>(hi),
                                       [](const ReplayPoint& a, const ReplayPoint& c) { return a.reserved < c.reserved; });
    out.push_back(*best);
  }
  return out;
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
  explicit Timeline(const CachingAllocatorModel& model)
      : peak_active_(model.requested()), peak_blocks_(model.allocated()), peak_reserved_(model.reserved()),
        fragmentation_(fragmentation_of(model, -1, origins_)), series_{{-1, model.reserved(), model.requested()}} {}

  /// The segments among `events` were made by the request of `size` at event `at`.
  void made(const std::vector<SegmentEvent>& events, std::int64_t at, std::int64_t size, const std::string& where) {
    for (const auto& s : events) {
      if (s.kind == SegmentEvent::Kind::alloc || s.kind == SegmentEvent::Kind::map) {
        origins_[s.address] = {at, size, where};
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
    series_.push_back({at, model.reserved(), model.requested()});
  }
  [[nodiscard]] std::int64_t peak_active() const { return peak_active_; }
  [[nodiscard]] std::int64_t peak_blocks() const { return peak_blocks_; }
  [[nodiscard]] const Fragmentation& fragmentation() const { return fragmentation_; }
  [[nodiscard]] std::vector<ReplayPoint> series() const { return thin(series_); }

 private:
  std::unordered_map<std::uint64_t, SegmentOrigin> origins_;  // declared first: the constructor reads it
  std::int64_t peak_active_;
  std::int64_t peak_blocks_;
  std::int64_t peak_reserved_;
  Fragmentation fragmentation_;
  std::vector<ReplayPoint> series_;
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
      if (e.action == TraceEvent::Action::other) ++unknown[e.name];
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
    std::vector<ReplayPoint> series{{-1, reserved, active}};
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
      series.push_back({static_cast<std::int64_t>(i), reserved, active});
    }
    out.recorded_series = thin(series);
  }

  // The recorded settings, compared: segment events in order (size, address), each request's address, reserved
  // bytes after every request, and the final state.
  void compare(DeviceReplay& out) {
    using A = TraceEvent::Action;
    Replica replica(snap_.settings, initial_);
    auto& model = replica.model;
    auto& id_of = replica.id_of;
    Timeline timeline(model);

    std::vector<std::size_t> pending;  // recorded segment events since the last request
    std::deque<std::size_t> unused_allocs;
    std::int64_t recorded_reserved = out.initial_reserved;

    const auto diverge = [&](std::int64_t at, std::string expected, std::string replayed) {
      if (out.first_divergence || !comparable_) return;
      out.first_divergence = Divergence{at, at < static_cast<std::int64_t>(events_.size())
                                                ? events_[static_cast<std::size_t>(at)].name : "final state",
                                        std::move(expected), std::move(replayed), context_of(events_, at)};
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
          timeline.made(model.segment_events(), at, e.size, e.where);
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
          if (model.has_free_block(e.size, e.stream)) {
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
    Timeline timeline(model);
    bool releasing = false;  // inside a run of recorded segment frees no request explains
    // The segments a request made, and the model's log cleared for the next event.
    const auto made = [&](std::int64_t at, const std::string& where, std::int64_t size) {
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
        made(at, e.where, e.size);
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
        // The request that failed on the real GPU: would it fit here? The program did not go on with it.
        const auto id = replica.next_id++;
        const auto address = model.malloc(id, e.size, e.stream);
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
  report.file = snapshot.origin;
  report.has_settings = snapshot.has_settings;
  report.settings_text = snapshot.settings_text;
  for (std::size_t d = 0; d < snapshot.device_traces.size(); ++d) {
    if (snapshot.device_traces[d].empty()) continue;
    DeviceReplayer replayer(snapshot, static_cast<int>(d));
    report.devices.push_back(replayer.run(what_ifs));
  }
  return report;
}

// ---------------------------------------------------------------------------------------------------------------
// Output.

namespace {

json totals_json(const ReplayTotals& t) {
  json out = {{"peak_reserved", t.peak_reserved}, {"peak_allocated", t.peak_allocated},
              {"segment_allocs", t.segment_allocs}, {"segment_frees", t.segment_frees}};
  if (t.peak_allocated_blocks) out["peak_allocated_blocks"] = *t.peak_allocated_blocks;
  return out;
}

json fragmentation_json(const Fragmentation& f) {
  json segments = json::array();
  for (const auto& s : f.emptiest) {
    segments.push_back({{"address", s.address}, {"size", s.size}, {"allocated", s.allocated},
                        {"made_by_event", s.made_by_event}, {"made_by_request", s.made_by_size},
                        {"where", s.where}});
  }
  return {{"event", f.event}, {"reserved", f.reserved}, {"allocated", f.allocated},
          {"reserved_minus_allocated", f.reserved - f.allocated}, {"largest_free_block", f.largest_free_block},
          {"emptiest_segments", segments}};
}

}  // namespace

json replay_to_json(const ReplayReport& report) {
  json devices = json::array();
  for (const auto& d : report.devices) {
    json what_if = json::array();
    for (const auto& w : d.what_if) {
      json entry = {{"label", w.spec.label}, {"allocator", w.settings.to_string()},
                    {"capacity", w.spec.capacity ? json(*w.spec.capacity) : json(nullptr)},
                    {"fits", w.fits}, {"ooms", w.ooms}, {"alloc_retries", w.retries},
                    {"replayed", totals_json(w.totals)}, {"fragmentation", fragmentation_json(w.fragmentation)}};
      if (w.first_oom_event >= 0) {
        entry["first_oom"] = {{"event", w.first_oom_event}, {"size", w.first_oom_size}};
      } else {
        entry["first_oom"] = nullptr;
      }
      what_if.push_back(std::move(entry));
    }
    json divergence = nullptr;
    if (d.first_divergence) {
      divergence = {{"event", d.first_divergence->event}, {"action", d.first_divergence->action},
                    {"recorded", d.first_divergence->expected}, {"replayed", d.first_divergence->replayed},
                    {"context", d.first_divergence->context}};
    }
    devices.push_back({{"device", d.device}, {"events", d.events}, {"compared", d.compared}, {"exact", d.exact},
                       {"allocator", d.settings.to_string()},
                       {"initial", {{"segments", d.initial_segments}, {"reserved", d.initial_reserved},
                                    {"allocated", d.initial_allocated}}},
                       {"requests", d.requests}, {"external_releases", d.external_releases},
                       {"addresses_compared", d.addresses_compared},
                       {"recorded", totals_json(d.recorded)}, {"replayed", totals_json(d.replayed)},
                       {"first_divergence", divergence}, {"not_followed", d.not_followed},
                       {"fragmentation", fragmentation_json(d.fragmentation)}, {"what_if", what_if}});
  }
  return {{"file", report.file},
          {"allocator_settings_recorded", report.has_settings},
          {"PYTORCH_CUDA_ALLOC_CONF", report.settings_text},
          {"devices", devices}};
}

std::string replay_summary(const ReplayReport& report) {
  std::string out;
  auto o = std::back_inserter(out);
  fmt::format_to(o, "{}\n", report.file);
  if (!report.has_settings) {
    fmt::format_to(o, "  no allocator_settings recorded (a PyTorch before 2.1?): LibTorch's defaults assumed\n");
  }
  if (report.devices.empty()) fmt::format_to(o, "  no device has a trace\n");
  for (const auto& d : report.devices) {
    fmt::format_to(o, "  device {}: {} events, {} requests; {} segment(s) when the trace began ({} reserved)\n",
                   d.device, d.events, d.requests, d.initial_segments, format_bytes(d.initial_reserved));
    fmt::format_to(o, "    {:<10} {:>14} {:>14} {:>10} {:>10}\n", "", "peak reserved", "peak active", "seg allocs",
                   "seg frees");
    for (const auto& [name, t] : {std::pair{"recorded", d.recorded}, std::pair{"replayed", d.replayed}}) {
      fmt::format_to(o, "    {:<10} {:>14} {:>14} {:>10} {:>10}\n", name, format_bytes(t.peak_reserved),
                     format_bytes(t.peak_allocated), t.segment_allocs, t.segment_frees);
    }
    if (d.replayed.peak_allocated_blocks) {
      fmt::format_to(o, "    peak allocated in whole blocks (torch.cuda.max_memory_allocated()): {}{}\n",
                     format_bytes(*d.replayed.peak_allocated_blocks), d.exact ? "" : ", as replayed");
    }
    for (const auto& n : d.not_followed) fmt::format_to(o, "    not followed: {}\n", n);
    if (d.exact) {
      fmt::format_to(o, "    EXACT: every segment event, {} block addresses, reserved after every event and the "
                        "final state as recorded\n", d.addresses_compared);
    } else if (d.first_divergence) {
      const auto& v = *d.first_divergence;
      fmt::format_to(o, "    DIVERGES at event {} ({}):\n      recorded: {}\n      replayed: {}\n", v.event, v.action,
                     v.expected, v.replayed);
      for (const auto& line : v.context) fmt::format_to(o, "      {}\n", line);
    } else {
      fmt::format_to(o, "    not compared\n");
    }
    const auto& f = d.fragmentation;
    fmt::format_to(o, "    at the peak: reserved {}, allocated {}, reserved - allocated {}, largest free block {}\n",
                   format_bytes(f.reserved), format_bytes(f.allocated), format_bytes(f.reserved - f.allocated),
                   format_bytes(f.largest_free_block));
    for (std::size_t i = 0; i < f.emptiest.size() && i < 3; ++i) {
      const auto& s = f.emptiest[i];
      fmt::format_to(o, "      segment {:#x}: {} of {} allocated, made by {}\n", s.address, format_bytes(s.allocated),
                     format_bytes(s.size),
                     s.made_by_event < 0 ? std::string("an allocation before the trace")
                                         : fmt::format("event {} ({}{})", s.made_by_event, format_bytes(s.made_by_size),
                                                       s.where.empty() ? "" : " at " + s.where));
    }
    for (const auto& w : d.what_if) {
      fmt::format_to(o, "    what if {}: peak reserved {} ({}), {} segment allocs", w.spec.label,
                     format_bytes(w.totals.peak_reserved),
                     format_bytes_delta(w.totals.peak_reserved - d.replayed.peak_reserved), w.totals.segment_allocs);
      if (w.spec.capacity) {
        fmt::format_to(o, "; {}", w.fits ? fmt::format("fits in {}", format_bytes(*w.spec.capacity))
                                         : fmt::format("OUT OF MEMORY at event {} (a request of {}), {} request(s) "
                                                       "failed", w.first_oom_event, format_bytes(w.first_oom_size),
                                                       w.ooms));
        if (w.retries > 0) fmt::format_to(o, ", {} cache flush(es) to make room", w.retries);
      }
      fmt::format_to(o, "\n");
    }
  }
  return out;
}

std::string replay_html(const ReplayReport& report) {
  std::string body;
  auto o = std::back_inserter(body);
  static const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};
  for (const auto& d : report.devices) {
    fmt::format_to(o, "<h2>Device {}: {}</h2>\n", d.device,
                   d.exact ? "the replay is exact"
                   : d.first_divergence ? fmt::format("diverges at event {}", d.first_divergence->event)
                                        : std::string("not compared"));
    LineChart chart;
    chart.title = fmt::format("Reserved and active memory over the trace (device {})", d.device);
    chart.x_label = "event";
    chart.linear_x = true;
    chart.width = 900;
    const auto add = [&](const std::string& name, const std::vector<ReplayPoint>& points, std::size_t color,
                         bool dashed, bool reserved) {
      ChartSeries s{.name = name, .color = kColors[color % 6], .points = {}, .dashed = dashed};
      for (const auto& p : points) {
        s.points.push_back({std::max<std::int64_t>(p.event, 0),
                            static_cast<double>(reserved ? p.reserved : p.allocated), ""});
      }
      chart.series.push_back(std::move(s));
    };
    add("reserved, recorded", d.recorded_series, 0, false, true);
    add("active, recorded", d.recorded_series, 2, false, false);
    add("reserved, replayed", d.replayed_series, 1, true, true);
    for (std::size_t i = 0; i < d.what_if.size(); ++i) {
      add("reserved, " + d.what_if[i].spec.label, d.what_if[i].series, 3 + i, true, true);
      if (d.what_if[i].spec.capacity) {
        chart.levels.push_back({fmt::format("capacity of '{}': {}", d.what_if[i].spec.label,
                                            format_bytes(*d.what_if[i].spec.capacity)),
                                static_cast<double>(*d.what_if[i].spec.capacity)});
      }
    }
    body += render_line_chart(chart);
    fmt::format_to(o, "<pre>{}</pre>\n", escape_html(replay_summary(ReplayReport{
                                             report.file, report.has_settings, report.settings_text, {d}})));
  }
  return fmt::format(
      "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>memgate replay: {}</title>"
      "<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1000px}}pre{{background:#f6f6f6;"
      "padding:1em;overflow-x:auto}}.grid{{stroke:#e5e5e5}}.tick{{font-size:11px;fill:#555}}"
      ".axis-label{{font-size:12px}}.level line{{stroke:#888;stroke-dasharray:2 3}}.level text{{font-size:11px}}"
      ".legend-item text{{font-size:12px}}</style></head>\n<body><h1>memgate replay</h1><p>{}</p>\n{}</body></html>\n",
      escape_html(report.file), escape_html(report.file), body);
}

}  // namespace memgate
