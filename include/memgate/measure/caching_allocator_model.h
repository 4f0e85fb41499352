// A model of the CUDA caching allocator's policy (c10/cuda/CUDACachingAllocator.cpp, default settings), to predict
// what it reserves for a sequence of allocations and frees without a GPU: estimates replay their Meta trace here.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <vector>

namespace memgate {

/// The policy, as LibTorch 2.11 runs it by default (no expandable segments, no max_split_size, one stream):
/// - sizes round up to 512 bytes; requests up to 1 MiB come from the small pool, larger ones from the large pool;
/// - a request no free block can hold gets a new segment: 2 MiB for a small request, 20 MiB for one below 10 MiB,
///   else the size rounded up to 2 MiB;
/// - the best fit (the smallest free block that holds it) is used, and split when the rest is at least 512 bytes
///   (small pool) or more than 1 MiB (large pool);
/// - a freed block merges with free neighbours of its segment; empty_cache() gives back segments wholly free.
///
/// With expandable segments (expandable_segments:True), each pool has one segment that grows at its end, mapped in
/// pages (2 MiB small, 20 MiB large): a request no free block holds maps the pages it lacks after the segment's
/// free tail; any block splits when at least 512 bytes remain; empty_cache() unmaps the whole pages of the free
/// tail (the model keeps free pages inside the segment mapped, where CUDA unmaps them too).
///
///   memgate::CachingAllocatorModel model;
///   model.malloc(1, 100);    // reserved(): 2 MiB (a small segment), allocated(): 512
///   model.free(1);
///   model.empty_cache();     // reserved(): 0
class CachingAllocatorModel {
 public:
  explicit CachingAllocatorModel(bool expandable_segments = false);
  ~CachingAllocatorModel();
  CachingAllocatorModel(const CachingAllocatorModel&) = delete;
  CachingAllocatorModel& operator=(const CachingAllocatorModel&) = delete;

  /// Allocates `bytes` for the block named `id` (unique while it lives).
  void malloc(std::uint64_t id, std::int64_t bytes);
  /// Frees the block `id`; an id it never allocated is ignored (allocated before the model started).
  void free(std::uint64_t id);
  /// Gives back every segment with no allocated block.
  void empty_cache();

  [[nodiscard]] std::int64_t allocated() const { return allocated_; }
  [[nodiscard]] std::int64_t reserved() const { return reserved_; }
  [[nodiscard]] std::int64_t peak_allocated() const { return peak_allocated_; }
  [[nodiscard]] std::int64_t peak_reserved() const { return peak_reserved_; }
  /// Sets the peaks to the current values.
  void reset_peak();
  [[nodiscard]] std::size_t segments() const;

  /// The allocation size rules, for tests: the rounded request, and the segment a new request of that size gets.
  [[nodiscard]] static std::int64_t round_size(std::int64_t bytes);
  [[nodiscard]] static std::int64_t segment_size(std::int64_t rounded);

  struct Block;

 private:
  Block* find_free(bool small, std::int64_t size);
  Block* grow(bool small, std::int64_t size);
  void insert_free(Block* block);
  void erase_free(Block* block);

  struct Pool;
  std::unique_ptr<Pool> small_;
  std::unique_ptr<Pool> large_;
  std::map<std::uint64_t, Block*> live_;
  std::vector<std::unique_ptr<Block>> storage_;
  std::int64_t next_address_ = 0;
  bool expandable_ = false;
  std::int64_t allocated_ = 0, reserved_ = 0, peak_allocated_ = 0, peak_reserved_ = 0;
};

}  // namespace memgate
