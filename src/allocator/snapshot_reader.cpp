// memory_viz snapshots read strictly into what the replay needs: each device's trace, its segments and blocks at the
// end, the allocator settings; every error names the file, the key's path and what was expected.
#include "memgate/allocator/replay.h"

#include "snapshot_json.h"

#include "memgate/allocator/snapshot_pickle.h"
#include "memgate/base/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <map>

namespace memgate {

std::string_view action_name(TraceEvent::Action action) {
  using A = TraceEvent::Action;
  switch (action) {
    case A::alloc: return "alloc";
    case A::free_requested: return "free_requested";
    case A::free_completed: return "free_completed";
    case A::segment_alloc: return "segment_alloc";
    case A::segment_free: return "segment_free";
    case A::segment_map: return "segment_map";
    case A::segment_unmap: return "segment_unmap";
    case A::oom: return "oom";
    case A::snapshot: return "snapshot";
    case A::user_defined: return "user_defined";
    case A::other: break;
  }
  return "other";
}

namespace detail {

using nlohmann::json;

std::string describe(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "None";
    case json::value_t::boolean: return v.get<bool>() ? "True" : "False";
    case json::value_t::number_integer: return fmt::format("the integer {}", v.get<std::int64_t>());
    case json::value_t::number_unsigned: return fmt::format("the integer {}", v.get<std::uint64_t>());
    case json::value_t::number_float: return fmt::format("the float {}", v.get<double>());
    case json::value_t::string: {
      auto s = v.get<std::string>();
      if (s.size() > 40) {
        std::size_t n = 40;
        while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xc0) == 0x80) --n;  // not inside a UTF-8 character
        s = s.substr(0, n) + "...";
      }
      return fmt::format("the string '{}'", s);
    }
    case json::value_t::array: return fmt::format("a list of {}", v.size());
    case json::value_t::object: return "a dict";
    case json::value_t::binary: return "bytes";
    default: return "a value of another kind";
  }
}

TraceEvent::Action action_of(std::string_view name) {
  using A = TraceEvent::Action;
  // c10/cuda/CUDACachingAllocator.h's TraceEntry::Action, as torch/csrc/cuda/memory_snapshot.cpp names them.
  static const std::map<std::string_view, A> kActions = {
      {"alloc", A::alloc},           {"free_requested", A::free_requested}, {"free_completed", A::free_completed},
      {"segment_alloc", A::segment_alloc}, {"segment_free", A::segment_free}, {"segment_map", A::segment_map},
      {"segment_unmap", A::segment_unmap}, {"oom", A::oom}, {"snapshot", A::snapshot},
      {"user_defined", A::user_defined}};
  const auto it = kActions.find(name);
  return it == kActions.end() ? A::other : it->second;
}

std::string text_at(const json& obj, const char* key) {
  const auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get_ref<const std::string&>() : std::string();
}

int frame_rank(std::string_view file) {
  const bool python = file.ends_with(".py");
  const bool library = file.find("/torch/") != std::string::npos || file.find("site-packages") != std::string::npos ||
                       file.find("dist-packages") != std::string::npos;
  return python && !library ? 3 : python ? 2 : 1;
}

// The first frame of the program rather than of torch or C++: "file:line function".
std::string where_of(const json& frames) {
  if (!frames.is_array()) return {};
  const json* chosen = nullptr;
  int rank = 0;  // 3: the program's Python, 2: any Python, 1: any frame
  for (const auto& f : frames) {
    if (!f.is_object()) continue;
    const int r = frame_rank(text_at(f, "filename"));
    if (r > rank) {
      rank = r;
      chosen = &f;
      if (r == 3) break;
    }
  }
  if (chosen == nullptr) return {};
  const auto line_it = chosen->find("line");
  const auto line = line_it != chosen->end() && line_it->is_number_integer() ? line_it->get<std::int64_t>() : 0;
  return where_text(text_at(*chosen, "filename"), line, text_at(*chosen, "name"));
}

std::string where_text(const std::string& file, std::int64_t line, const std::string& name) {
  // The last separator, '/' or Windows' '\', but not the '\' of a byte utf8_text() escaped as \xNN.
  auto slash = file.find_last_of('/');
  const auto hex = [&](std::size_t i) { return i < file.size() && std::isxdigit(static_cast<unsigned char>(file[i])); };
  for (auto b = file.find('\\', slash == std::string::npos ? 0 : slash); b != std::string::npos;
       b = file.find('\\', b + 1)) {
    if (!(b + 1 < file.size() && file[b + 1] == 'x' && hex(b + 2) && hex(b + 3))) slash = b;
  }
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
    // PyTorch takes a threshold above 0 and below 1 (CUDAAllocatorConfig), and writes 0 when none is set.
    const auto p = path + ".garbage_collection_threshold";
    if (!v->is_number()) r.fail(p, "a number", *v);
    const auto t = v->get<double>();
    if (!(t >= 0.0 && t < 1.0)) r.fail(p, "0 (off) or a fraction above 0 and below 1", *v);
    settings.garbage_collection_threshold = t;
  }
  if (const auto* v = r.optional_key(s, "roundup_power2_divisions")) {
    const auto p = path + ".roundup_power2_divisions";
    r.object(*v, p);
    // Keyed by the interval's start in MiB: "1", "2", ... "32768".
    for (std::size_t i = 0; i < 16; ++i) {
      const auto k = std::to_string(std::int64_t{1} << i);
      if (const auto* d = r.optional_key(*v, k.c_str())) {
        const auto n = r.size(*d, p + "." + k);
        if (n != 0 && !std::has_single_bit(static_cast<std::uint64_t>(n))) {
          r.fail(p + "." + k, "0 or a power of two (as PyTorch takes them)", *d);
        }
        settings.roundup_power2_divisions[i] = n;
      }
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

RecordedSegment read_segment(const Reader& r, const json& segment, const std::string& path,
                             std::map<int, std::int64_t>& reserved_by_device) {
  const auto& s = r.object(segment, path);
  RecordedSegment seg;
  seg.device = r.device(r.key(s, path, "device"), path + ".device");
  seg.address = r.address(r.key(s, path, "address"), path + ".address");
  seg.size = r.size(r.key(s, path, "total_size"), path + ".total_size");
  r.fits_address_space(seg.address, seg.size, path + ".total_size");
  auto& reserved = reserved_by_device[seg.device];
  reserved += seg.size;  // each at most 2^60, checked as it goes: no overflow
  if (reserved > kMaxSnapshotBytes) {
    r.fail(path + ".total_size", fmt::format("segments of device {} that sum to at most 2^60 bytes, not {}",
                                             seg.device, reserved));
  }
  if (const auto* v = r.optional_key(s, "stream")) seg.stream = r.word(*v, path + ".stream");
  if (const auto* v = r.optional_key(s, "segment_type")) {
    const auto type = r.string(*v, path + ".segment_type");
    if (type != "small" && type != "large") r.fail(path + ".segment_type", "'small' or 'large'", *v);
    seg.small = type == "small";
  } else {
    seg.small = seg.size == CachingAllocatorModel::kSmallBuffer;
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
    if (const auto* v = r.optional_key(b, "address")) block.address = r.address(*v, bpath + ".address");
    if (block.address != at) {
      r.fail(bpath + ".address", fmt::format("{:#x}, the end of the block before it", at), b["address"]);
    }
    r.fits_address_space(block.address, block.size, bpath + ".size");
    total += block.size;  // each at most 2^60, checked as it goes: no overflow
    if (total > kMaxSnapshotBytes || (!seg.expandable && total > seg.size)) {
      r.fail(bpath + ".size", fmt::format("blocks that end within the segment's total_size {}, not at {} bytes",
                                          seg.size, total));
    }
    if (const auto* v = r.optional_key(b, "requested_size")) block.requested = r.size(*v, bpath + ".requested_size");
    const auto state = r.string(r.key(b, bpath, "state"), bpath + ".state");
    if (state != "active_allocated" && state != "active_pending_free" && state != "inactive") {
      r.fail(bpath + ".state", "'active_allocated', 'active_pending_free' or 'inactive'", b["state"]);
    }
    block.allocated = state != "inactive";
    // A free block keeps the request of its last use, larger or not; a live one was rounded up from its request.
    if (block.allocated && block.requested > block.size) {
      r.fail(bpath + ".requested_size", fmt::format("at most the block's size {}", block.size), b["requested_size"]);
    }
    at += static_cast<std::uint64_t>(block.size);
    seg.blocks.push_back(block);
  }
  if (total != seg.size && !seg.expandable) {
    r.fail(path + ".blocks", fmt::format("blocks that sum to total_size {}, not {}", seg.size, total));
  }
  return seg;
}

TraceEvent read_event(const Reader& r, const json& entry, const std::string& path, std::int64_t& traced,
                      TextTable& texts) {
  const auto& e = r.object(entry, path);
  TraceEvent ev;
  const auto name = r.string(r.key(e, path, "action"), path + ".action");
  ev.action = action_of(name);
  using A = TraceEvent::Action;
  if (ev.action == A::other) ev.text = texts.intern(name);
  if (ev.action == A::other || ev.action == A::snapshot || ev.action == A::user_defined) return ev;
  if (ev.action == A::oom) {
    ev.device_free = r.size(r.key(e, path, "device_free"), path + ".device_free");
    ev.size = r.request(r.key(e, path, "size"), path + ".size");
  } else {
    ev.addr = r.address(r.key(e, path, "addr"), path + ".addr");
    ev.size = r.size(r.key(e, path, "size"), path + ".size");
    r.fits_address_space(ev.addr, ev.size, path + ".size");
  }
  // A failed request past 2^60 is never modelled (it fits nowhere); every other size may make a segment.
  traced += ev.size <= kMaxSnapshotBytes ? ev.size : 0;  // each at most 2^60, checked as it goes: no overflow
  if (traced > (std::int64_t{1} << 62)) {
    r.fail(path + ".size", "sizes that sum to at most 2^62 bytes over the trace (more than any real trace moves)",
           e["size"]);
  }
  if (const auto* v = r.optional_key(e, "stream")) ev.stream = r.word(*v, path + ".stream");
  if (ev.action == TraceEvent::Action::alloc) {
    if (const auto* f = r.optional_key(e, "frames")) ev.text = texts.intern(where_of(*f));
  }
  return ev;
}

}  // namespace detail

Snapshot read_snapshot(const nlohmann::json& data, const std::string& origin) {
  using namespace detail;
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
  detail::TextTable texts(snap.texts);
  std::map<int, std::int64_t> reserved_by_device;  // the final segments' bytes
  for (std::size_t i = 0; i < segments.size(); ++i) {
    snap.segments.push_back(read_segment(r, segments[i], fmt::format("segments[{}]", i), reserved_by_device));
  }
  r.list(*traces, "device_traces");
  if (traces->size() > static_cast<std::size_t>(kMaxSnapshotDevices)) {
    r.fail("device_traces", fmt::format("a list of at most {} devices' traces", kMaxSnapshotDevices), *traces);
  }
  for (std::size_t d = 0; d < traces->size(); ++d) {
    const auto dpath = fmt::format("device_traces[{}]", d);
    const auto& trace = r.list((*traces)[d], dpath);
    std::vector<TraceEvent> events;
    events.reserve(trace.size());
    // The bytes of every alloc, free and segment event: at most 2^62, so that no sum a replay keeps of them
    // (reserved, allocated, the state before the trace) can pass 64 bits.
    std::int64_t traced = 0;
    for (std::size_t i = 0; i < trace.size(); ++i) {
      events.push_back(read_event(r, trace[i], fmt::format("{}[{}]", dpath, i), traced, texts));
    }
    snap.device_traces.push_back(std::move(events));
  }
  return snap;
}


}  // namespace memgate
