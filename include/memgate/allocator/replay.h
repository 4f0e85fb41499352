// Real GPU traces replayed without a GPU: a memory snapshot (torch.cuda.memory._dump_snapshot, or memgate's own
// --snapshot) read strictly, the allocator's state when its trace began reconstructed, and every request replayed
// through memgate's caching-allocator model, compared event by event with what the real allocator did; then the
// same requests under other settings and capacities (what-if).
#pragma once

#include "memgate/allocator/caching_allocator_model.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace memgate {

/// The most bytes a size in a snapshot may say (1 EiB): more than any GPU holds, and sums of such sizes stay
/// within 64 bits. A larger one, or a device index from 2^16, is not a value PyTorch writes.
inline constexpr std::int64_t kMaxSnapshotBytes = std::int64_t{1} << 60;
inline constexpr std::int64_t kMaxSnapshotDevices = std::int64_t{1} << 16;

/// One entry of a device's trace, as the snapshot records it: 40 bytes, so that a trace of millions of events
/// takes less memory than its pickle. Its texts (an unknown action's name, where a request was made) are kept once
/// per snapshot: Snapshot::name() and Snapshot::where() read them.
struct TraceEvent {
  /// PyTorch's TraceEntry::Action; `snapshot` (a snapshot was taken) and `user_defined` (an annotation, e.g.
  /// record_function) change no memory; `other` is an action this memgate does not know.
  enum class Action : std::uint8_t {
    alloc, free_requested, free_completed, segment_alloc, segment_free, segment_map, segment_unmap, oom, snapshot,
    user_defined, other
  };
  std::uint64_t addr = 0;
  /// The request (alloc, free_*), the segment (segment_*), each up to kMaxSnapshotBytes; the failed request (oom),
  /// which may ask for more than any GPU holds.
  std::int64_t size = 0;
  std::uint64_t stream = 0;
  std::int64_t device_free = 0;  ///< oom: what CUDA said was free
  /// An index into Snapshot::texts (0: none): the action as written for an action the replay does not know
  /// (other); for alloc, the first frame outside torch ("file:line function"), when recorded.
  std::uint32_t text = 0;
  Action action = Action::other;
};

/// The name PyTorch writes for a known action ("alloc", "segment_free", ...); "other" for Action::other.
[[nodiscard]] std::string_view action_name(TraceEvent::Action action);

/// A block of a segment in the snapshot's final state.
struct RecordedBlock {
  std::uint64_t address = 0;
  std::int64_t size = 0;
  std::int64_t requested = 0;
  bool allocated = false;  ///< active_allocated or active_pending_free
};

/// A segment in the snapshot's final state.
struct RecordedSegment {
  int device = 0;
  std::uint64_t address = 0;
  std::int64_t size = 0;
  std::uint64_t stream = 0;
  bool small = false;
  bool expandable = false;
  bool private_pool = false;  ///< a CUDA graph's pool (segment_pool_id other than (0, 0))
  std::vector<RecordedBlock> blocks;
};

struct Snapshot {
  std::string origin;
  bool has_settings = false;  ///< older snapshots do not record the allocator's settings: LibTorch's defaults then
  AllocatorSettings settings;
  std::string settings_text;  ///< PYTORCH_CUDA_ALLOC_CONF as recorded
  std::vector<RecordedSegment> segments;
  std::vector<std::vector<TraceEvent>> device_traces;  ///< per device index
  /// The texts events name (TraceEvent::text), each once; texts[0] is "".
  std::vector<std::string> texts{std::string()};

  /// An event's action as written.
  [[nodiscard]] std::string_view name(const TraceEvent& e) const {
    return e.action == TraceEvent::Action::other ? std::string_view(texts[e.text]) : action_name(e.action);
  }
  /// Where an alloc's request was made ("file:line function"); "" when not recorded, or for another action.
  [[nodiscard]] std::string_view where(const TraceEvent& e) const {
    return e.action == TraceEvent::Action::alloc ? std::string_view(texts[e.text]) : std::string_view();
  }
};

/// A snapshot from the plain data of its pickle (read_plain_pickle). Strict: a value of the wrong type, a missing
/// key the replay needs, or a value PyTorch cannot write (a negative size or address, a size past
/// kMaxSnapshotBytes, a device index past kMaxSnapshotDevices, a block past its segment or the address space, an
/// allocated block smaller than its request, a garbage_collection_threshold outside [0, 1)) throws memgate::Error
/// naming `origin`, the key's path (`device_traces[0][12].size`) and what was expected. Keys it does not use are
/// ignored, as newer PyTorch adds them.
[[nodiscard]] Snapshot read_snapshot(const nlohmann::json& data, const std::string& origin);
/// The same Snapshot read_snapshot(read_plain_pickle(data, origin), origin) gives, with the same errors, read in one
/// pass over the pickle without building its whole tree: each trace entry becomes a TraceEvent as soon as its list
/// holds it, texts are kept once, and frames only as far as `where` needs them. Memory stays below the pickle's
/// size for real snapshots, and nothing the file holds is expanded: memo references cost what they cost in the file,
/// so a snapshot of any size PyTorch writes is read (read_plain_pickle refuses more than PickleLimits::max_values).
/// Only a file PyTorch does not write (a trace entry changed after its list took it, or used again as something
/// other than a trace entry) is read through read_plain_pickle instead.
[[nodiscard]] Snapshot read_snapshot_pickle(std::string_view data, const std::string& origin);
/// read_snapshot_pickle of a file, mapped rather than read where the system can (the pages the reader has passed
/// are given back as it goes).
[[nodiscard]] Snapshot load_snapshot(const std::string& path);

struct ReplayTotals {
  std::int64_t peak_reserved = 0;
  std::int64_t peak_allocated = 0;  ///< the live requests' bytes (memory_viz's "active" memory)
  /// The peak of the allocated blocks' bytes, as CUDA's allocated_bytes (torch.cuda.max_memory_allocated()) counts
  /// them: whole blocks, a block the allocator did not split counted with its unsplit rest. A trace records requests,
  /// not blocks, so only a replay has it (set on the replayed side; when the replay is exact, it is the recording's).
  std::optional<std::int64_t> peak_allocated_blocks;
  std::int64_t segment_allocs = 0;  ///< segment_alloc, or segment_map with expandable segments
  std::int64_t segment_frees = 0;   ///< segment_free, or segment_unmap
};

/// Where a replay first parts from the recording.
struct Divergence {
  std::int64_t event = 0;  ///< index in the device's trace; the trace's length for its final state
  std::string action;
  std::string expected;    ///< what the real allocator did
  std::string replayed;    ///< what the model did
  std::vector<std::string> context;  ///< the events around it, one line each
};

/// Memory at the peak of reserved bytes, and the segments that stayed mostly empty there.
struct Fragmentation {
  std::int64_t event = -1;  ///< after which event the peak was reached (-1: before the first)
  std::int64_t reserved = 0;
  std::int64_t allocated = 0;  ///< bytes of allocated blocks
  std::int64_t largest_free_block = 0;
  struct Segment {
    std::uint64_t address = 0;
    std::int64_t size = 0;
    std::int64_t allocated = 0;
    std::int64_t made_by_event = -1;  ///< the request that made it (-1: it existed when the trace began)
    std::int64_t made_by_size = 0;
    std::string where;
  };
  std::vector<Segment> emptiest;  ///< segments less than half allocated, the most free bytes first (at most 10)
};

/// A point of the plot: reserved and allocated bytes after an event.
struct ReplayPoint {
  std::int64_t event = 0;
  std::int64_t reserved = 0;
  std::int64_t allocated = 0;
};

/// The same requests under other settings or a capacity.
struct WhatIfSpec {
  std::string label;
  std::optional<AllocatorSettings> settings;  ///< none: the recorded settings
  std::optional<std::int64_t> capacity;       ///< bytes the allocator may reserve; none: unlimited
};

struct WhatIfResult {
  WhatIfSpec spec;
  AllocatorSettings settings;
  ReplayTotals totals;
  bool fits = true;            ///< no request ran out of memory
  std::int64_t ooms = 0;       ///< requests that did not fit (the replay goes on without them)
  std::int64_t first_oom_event = -1;
  std::int64_t first_oom_size = 0;
  std::int64_t retries = 0;    ///< times the cache was freed to make room, as the allocator does before failing
  Fragmentation fragmentation;
  std::vector<ReplayPoint> series;
};

struct DeviceReplay {
  int device = 0;
  std::int64_t events = 0;
  bool compared = true;  ///< false where the model cannot follow the recording (not_followed says why)
  bool exact = false;
  AllocatorSettings settings;
  std::int64_t initial_reserved = 0;
  std::int64_t initial_allocated = 0;
  std::int64_t initial_segments = 0;
  std::int64_t requests = 0;        ///< alloc events
  std::int64_t external_releases = 0;  ///< segment frees the program asked for (empty_cache) or out-of-memory retries
  std::int64_t addresses_compared = 0;
  ReplayTotals recorded;
  ReplayTotals replayed;
  std::optional<Divergence> first_divergence;
  std::vector<std::string> not_followed;  ///< what the model cannot follow, by name
  Fragmentation fragmentation;
  std::vector<ReplayPoint> recorded_series;
  std::vector<ReplayPoint> replayed_series;
  std::vector<WhatIfResult> what_if;
};

struct ReplayReport {
  std::string file;
  bool has_settings = false;
  std::string settings_text;
  std::vector<DeviceReplay> devices;
  /// Every device compared and exact (a device not compared is not exact).
  [[nodiscard]] bool exact() const;
};

/// Replays every device with a trace: the recorded settings, compared, then each what-if.
[[nodiscard]] ReplayReport replay_snapshot(const Snapshot& snapshot, const std::vector<WhatIfSpec>& what_ifs = {});

}  // namespace memgate
