// A model of the CUDA caching allocator's policy (c10/cuda/CUDACachingAllocator.cpp in LibTorch 2.11), to predict
// what it reserves for a sequence of allocations and frees without a GPU: estimates replay their Meta trace here,
// and `memgate replay` the requests of real GPU traces.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace memgate {

/// The allocator's settings, as PYTORCH_CUDA_ALLOC_CONF sets them (and as a snapshot's `allocator_settings` holds
/// them). The defaults are LibTorch's.
struct AllocatorSettings {
  static constexpr std::int64_t kNoLimit = INT64_MAX;
  bool expandable_segments = false;
  /// Blocks of this size or more are never split, and serve only requests within max_non_split_rounding of them.
  std::int64_t max_split_size = kNoLimit;
  std::int64_t max_non_split_rounding = 20 << 20;
  /// Requests round up to one of this many divisions of their power-of-two interval, per interval from 1 MiB
  /// (index 0: below 2 MiB) to 32 GiB and up (index 15); 0 or 1 rounds to 512 bytes.
  std::array<std::int64_t, 16> roundup_power2_divisions{};
  /// With a capacity (a memory fraction): cached blocks are freed, oldest first, before a new segment would take
  /// reserved memory past this fraction of it. 0 is off.
  double garbage_collection_threshold = 0.0;

  /// Parses PYTORCH_CUDA_ALLOC_CONF's syntax: `key:value` pairs separated by commas, e.g.
  /// "expandable_segments:True,max_split_size_mb:128,roundup_power2_divisions:[256:1,>:4],
  /// garbage_collection_threshold:0.6". Starts from `base`; throws memgate::Error naming `origin`, the key and what
  /// was expected.
  [[nodiscard]] static AllocatorSettings parse(std::string_view conf, const std::string& origin,
                                               AllocatorSettings base);
  [[nodiscard]] static AllocatorSettings parse(std::string_view conf, const std::string& origin) {
    return parse(conf, origin, AllocatorSettings{});
  }
  /// The settings in PYTORCH_CUDA_ALLOC_CONF's syntax; only what differs from the defaults ("" for the defaults).
  [[nodiscard]] std::string to_string() const;
  bool operator==(const AllocatorSettings&) const = default;
};

/// A change of reserved memory, as a snapshot's trace records it.
struct SegmentEvent {
  enum class Kind { alloc, free, map, unmap };
  Kind kind = Kind::alloc;
  std::uint64_t address = 0;
  std::int64_t size = 0;
  std::uint64_t stream = 0;
  bool operator==(const SegmentEvent&) const = default;
};
[[nodiscard]] std::string_view segment_event_name(SegmentEvent::Kind kind);  ///< "segment_alloc", ...

/// The policy, as LibTorch 2.11 runs it:
/// - sizes round up to 512 bytes (or to a power-of-two division with roundup_power2_divisions); requests up to
///   1 MiB come from the small pool, larger ones from the large pool; each pool keeps its free blocks per stream;
/// - a request no free block of its stream holds gets a new segment: 2 MiB for a small request, 20 MiB for one below
///   10 MiB, else the size rounded up to 2 MiB;
/// - the best fit (the smallest free block of the stream that holds it, the lowest address among equals) is used,
///   and split when the rest is at least 512 bytes (small pool) or more than 1 MiB (large pool, below
///   max_split_size); a block of max_split_size or more serves only requests of max_split_size or more within
///   max_non_split_rounding of it;
/// - a freed block merges with free neighbours of its segment; empty_cache() gives back segments wholly free, the
///   large pool's first, each pool in its order (stream, size, address);
/// - with a capacity, a segment that does not fit fails as cudaMalloc does; the allocator then frees cached blocks
///   (one oversize block of max_split_size or more, else every wholly free segment) and retries before it reports
///   out of memory, and garbage_collection_threshold frees the oldest cached blocks first.
///
/// With expandable segments (expandable_segments:True), each pool has one segment per stream that grows at its end,
/// mapped in pages (2 MiB small, 20 MiB large): a request no free block holds maps the pages it lacks after the segment's
/// free tail; any block splits when at least 512 bytes remain; empty_cache() unmaps the whole pages of the free
/// tail (the model keeps free pages inside the segment mapped, where CUDA unmaps them too).
///
///   memgate::CachingAllocatorModel model;
///   model.malloc(1, 100);    // reserved(): 2 MiB (a small segment), allocated(): 512
///   model.free(1);
///   model.empty_cache();     // reserved(): 0
class CachingAllocatorModel {
 public:
  explicit CachingAllocatorModel(AllocatorSettings settings = {});
  explicit CachingAllocatorModel(bool expandable_segments);
  ~CachingAllocatorModel();
  CachingAllocatorModel(const CachingAllocatorModel&) = delete;
  CachingAllocatorModel& operator=(const CachingAllocatorModel&) = delete;

  /// The bytes cudaMalloc can give in all (reserved included), as on a GPU of that size or under a memory fraction;
  /// none: unlimited.
  void set_capacity(std::optional<std::int64_t> bytes) { capacity_ = bytes; }
  /// Where a new segment goes: `source(size, stream)` returns its address, or nothing for the model's own (an
  /// address range no real GPU uses). A replay gives each segment the address the real one got.
  void set_address_source(std::function<std::optional<std::uint64_t>(std::int64_t, std::uint64_t)> source) {
    address_source_ = std::move(source);
  }
  /// Whether a segment of `size` at `address` would overlap one the model holds (an address source checks it).
  [[nodiscard]] bool overlaps_segment(std::uint64_t address, std::int64_t size) const;
  /// Keeps the segment events from now on (segment_events()).
  void record_segment_events(bool on) { record_events_ = on; }
  [[nodiscard]] const std::vector<SegmentEvent>& segment_events() const { return events_; }
  void clear_segment_events() { events_.clear(); }

  /// A block of a segment that exists before the model runs: allocated under `id` when it has one, else free.
  struct SeedBlock {
    std::int64_t size = 0;
    std::optional<std::uint64_t> id;
    std::int64_t requested = 0;  ///< what was asked for it (allocated blocks)
  };
  /// Adds a segment as it stands (its blocks in address order, summing to its size); not a segment event.
  void add_segment(std::uint64_t address, std::uint64_t stream, bool small, const std::vector<SeedBlock>& blocks);

  /// Allocates `bytes` on `stream` for the block named `id` (unique while it lives); returns its address, or
  /// nothing when the request does not fit the capacity even after freeing the cache (out of memory: the model is
  /// as the real allocator leaves it then).
  std::optional<std::uint64_t> malloc(std::uint64_t id, std::int64_t bytes, std::uint64_t stream = 0);
  /// What malloc would do first: whether a cached block of `stream` holds `bytes`, without taking it.
  [[nodiscard]] bool has_free_block(std::int64_t bytes, std::uint64_t stream = 0) const;
  /// Frees the block `id`; an id it never allocated is ignored (allocated before the model started).
  void free(std::uint64_t id);
  /// Gives back every segment with no allocated block.
  void empty_cache();

  [[nodiscard]] std::int64_t allocated() const { return allocated_; }
  [[nodiscard]] std::int64_t requested() const { return requested_; }  ///< what the live blocks were asked for
  [[nodiscard]] std::int64_t reserved() const { return reserved_; }
  [[nodiscard]] std::int64_t peak_allocated() const { return peak_allocated_; }
  [[nodiscard]] std::int64_t peak_reserved() const { return peak_reserved_; }
  /// Sets the peaks to the current values.
  void reset_peak();
  [[nodiscard]] std::size_t segments() const;
  /// The largest free block, over every pool and stream.
  [[nodiscard]] std::int64_t largest_free_block() const;
  /// Out-of-memory reports (malloc returned nothing) and the retries that freed the cache to go on.
  [[nodiscard]] std::int64_t ooms() const { return ooms_; }
  [[nodiscard]] std::int64_t alloc_retries() const { return retries_; }
  /// Segment events since the model started (segment_alloc or segment_map; segment_free or segment_unmap).
  [[nodiscard]] std::int64_t segment_allocs() const { return segment_allocs_; }
  [[nodiscard]] std::int64_t segment_frees() const { return segment_frees_; }

  /// One segment as it stands: its address, size, stream and pool, and its blocks (address, size, allocated).
  struct SegmentView {
    std::uint64_t address = 0;
    std::int64_t size = 0;
    std::uint64_t stream = 0;
    bool small = false;
    struct BlockView {
      std::uint64_t address = 0;
      std::int64_t size = 0;
      bool allocated = false;
      std::uint64_t id = 0;
    };
    std::vector<BlockView> blocks;
  };
  /// Every segment, by address.
  [[nodiscard]] std::vector<SegmentView> segment_views() const;

  /// The allocator's sizes: every block a multiple of kMinBlockSize; requests up to kSmallSize from the small pool,
  /// whose segments are kSmallBuffer.
  static constexpr std::int64_t kMinBlockSize = 512;
  static constexpr std::int64_t kSmallSize = 1 << 20;
  static constexpr std::int64_t kSmallBuffer = 2 << 20;
  /// The allocation size rules: the rounded request, and the segment a new request of that size gets.
  [[nodiscard]] static std::int64_t round_size(std::int64_t bytes, const AllocatorSettings& settings = {});
  [[nodiscard]] static std::int64_t segment_size(std::int64_t rounded);

  struct Block;

 private:
  struct Pool;
  Pool& pool(bool small) { return small ? *small_ : *large_; }
  Block* get_free_block(bool small, std::int64_t size, std::uint64_t stream);
  [[nodiscard]] const Block* find_free(bool small, std::int64_t size, std::uint64_t stream) const;
  Block* alloc_segment(bool small, std::int64_t size, std::int64_t segment, std::uint64_t stream);
  Block* grow(bool small, std::int64_t size, std::uint64_t stream);
  bool release_available_cached_blocks(bool small, std::int64_t size, std::uint64_t stream);
  void release_cached_blocks();
  void release_block(Block* block);
  void garbage_collect();
  void insert_free(Block* block);
  void erase_free(Block* block);
  void emit(SegmentEvent::Kind kind, std::uint64_t address, std::int64_t size, std::uint64_t stream);
  Block* new_block();
  void note_reserved();

  AllocatorSettings settings_;
  std::optional<std::int64_t> capacity_;
  std::function<std::optional<std::uint64_t>(std::int64_t, std::uint64_t)> address_source_;
  bool record_events_ = false;
  std::vector<SegmentEvent> events_;
  std::unique_ptr<Pool> small_;
  std::unique_ptr<Pool> large_;
  std::unordered_map<std::uint64_t, Block*> live_;
  std::map<std::uint64_t, std::int64_t> segment_ranges_;  // address -> size, of the segments the model holds
  std::vector<std::unique_ptr<Block>> storage_;
  std::uint64_t next_address_ = std::uint64_t{1} << 56;  // far above any real GPU address
  std::int64_t allocated_ = 0, requested_ = 0, reserved_ = 0, peak_allocated_ = 0, peak_reserved_ = 0;
  std::int64_t ooms_ = 0, retries_ = 0, segment_allocs_ = 0, segment_frees_ = 0;
};

}  // namespace memgate
