// The CUDA caching allocator's block and segment policy, replayed on sizes alone.
#include "memgate/measure/caching_allocator_model.h"

#include <algorithm>

namespace memgate {
namespace {

constexpr std::int64_t kMinBlockSize = 512;
constexpr std::int64_t kSmallSize = 1 << 20;        // largest "small" request
constexpr std::int64_t kSmallBuffer = 2 << 20;      // small pool segments
constexpr std::int64_t kLargeBuffer = 20 << 20;     // large pool segments for requests below kMinLargeAlloc
constexpr std::int64_t kMinLargeAlloc = 10 << 20;
constexpr std::int64_t kRoundLarge = 2 << 20;
constexpr std::int64_t kLargePage = 20 << 20;       // an expandable large segment's mapping granularity

}  // namespace

struct CachingAllocatorModel::Block {
  std::int64_t address = 0;
  std::int64_t size = 0;
  bool small = false;
  bool allocated = false;
  Block* prev = nullptr;  ///< neighbours within the segment
  Block* next = nullptr;
};

// Free blocks ordered as the allocator's BlockPool: by size, then address (one stream).
struct CachingAllocatorModel::Pool {
  std::set<std::pair<std::int64_t, std::int64_t>> free;  // (size, address)
  std::map<std::int64_t, Block*> by_address;
  // Expandable segments: the segment's last block and the end of what is mapped.
  Block* tail = nullptr;
  std::int64_t base = 0, mapped_end = 0;
};

CachingAllocatorModel::CachingAllocatorModel(bool expandable_segments)
    : small_(std::make_unique<Pool>()), large_(std::make_unique<Pool>()), expandable_(expandable_segments) {
  large_->base = large_->mapped_end = std::int64_t{1} << 50;  // the two segments' address ranges never meet
}
CachingAllocatorModel::~CachingAllocatorModel() = default;

std::int64_t CachingAllocatorModel::round_size(std::int64_t bytes) {
  if (bytes < kMinBlockSize) return kMinBlockSize;
  return (bytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

std::int64_t CachingAllocatorModel::segment_size(std::int64_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

void CachingAllocatorModel::insert_free(Block* b) {
  auto& pool = b->small ? *small_ : *large_;
  pool.free.insert({b->size, b->address});
  pool.by_address[b->address] = b;
}

void CachingAllocatorModel::erase_free(Block* b) {
  auto& pool = b->small ? *small_ : *large_;
  pool.free.erase({b->size, b->address});
  pool.by_address.erase(b->address);
}

CachingAllocatorModel::Block* CachingAllocatorModel::find_free(bool small, std::int64_t size) {
  auto& pool = small ? *small_ : *large_;
  const auto it = pool.free.lower_bound({size, 0});
  if (it == pool.free.end()) return nullptr;
  return pool.by_address.at(it->second);
}

// Expandable: map the pages the free tail lacks, after it, and hand out the tail grown by them.
CachingAllocatorModel::Block* CachingAllocatorModel::grow(bool small, std::int64_t size) {
  auto& pool = small ? *small_ : *large_;
  const auto page = small ? kSmallBuffer : kLargePage;
  Block* tail = pool.tail != nullptr && !pool.tail->allocated ? pool.tail : nullptr;
  const auto lacking = size - (tail != nullptr ? tail->size : 0);
  const auto mapped = (lacking + page - 1) / page * page;
  reserved_ += mapped;
  peak_reserved_ = std::max(peak_reserved_, reserved_);
  if (tail != nullptr) {
    erase_free(tail);
    tail->size += mapped;
  } else {
    storage_.push_back(std::make_unique<Block>());
    tail = storage_.back().get();
    tail->address = pool.mapped_end;
    tail->size = mapped;
    tail->small = small;
    tail->prev = pool.tail;
    if (pool.tail != nullptr) pool.tail->next = tail;
    pool.tail = tail;
  }
  pool.mapped_end += mapped;
  return tail;
}

void CachingAllocatorModel::malloc(std::uint64_t id, std::int64_t bytes) {
  if (bytes <= 0) return;  // a zero-byte tensor takes no block
  const auto size = round_size(bytes);
  const bool small = size <= kSmallSize;
  Block* block = find_free(small, size);
  if (block != nullptr) {
    erase_free(block);
  } else if (expandable_) {
    block = grow(small, size);
  } else {
    const auto segment = segment_size(size);
    storage_.push_back(std::make_unique<Block>());
    block = storage_.back().get();
    block->address = next_address_;
    block->size = segment;
    block->small = small;
    next_address_ += segment;
    reserved_ += segment;
    peak_reserved_ = std::max(peak_reserved_, reserved_);
  }
  const auto remaining = block->size - size;
  if (small || expandable_ ? remaining >= kMinBlockSize : remaining > kSmallSize) {
    storage_.push_back(std::make_unique<Block>());
    Block* rest = storage_.back().get();
    rest->address = block->address + size;
    rest->size = remaining;
    rest->small = small;
    rest->prev = block;
    rest->next = block->next;
    if (block->next != nullptr) block->next->prev = rest;
    block->next = rest;
    auto& pool = small ? *small_ : *large_;
    if (pool.tail == block) pool.tail = rest;
    block->size = size;
    insert_free(rest);
  }
  block->allocated = true;
  live_[id] = block;
  allocated_ += block->size;
  peak_allocated_ = std::max(peak_allocated_, allocated_);
}

void CachingAllocatorModel::free(std::uint64_t id) {
  const auto it = live_.find(id);
  if (it == live_.end()) return;
  Block* block = it->second;
  live_.erase(it);
  allocated_ -= block->size;
  block->allocated = false;
  for (Block* neighbour : {block->prev, block->next}) {
    if (neighbour == nullptr || neighbour->allocated) continue;
    erase_free(neighbour);
    auto& pool = block->small ? *small_ : *large_;
    if (neighbour == block->prev) {
      neighbour->size += block->size;
      neighbour->next = block->next;
      if (block->next != nullptr) block->next->prev = neighbour;
      if (pool.tail == block) pool.tail = neighbour;
      block->size = 0;  // merged away
      block = neighbour;
    } else {
      block->size += neighbour->size;
      block->next = neighbour->next;
      if (neighbour->next != nullptr) neighbour->next->prev = block;
      if (pool.tail == neighbour) pool.tail = block;
      neighbour->size = 0;
    }
  }
  insert_free(block);
}

void CachingAllocatorModel::empty_cache() {
  if (expandable_) {
    for (auto* pool : {small_.get(), large_.get()}) {
      Block* tail = pool->tail;
      if (tail == nullptr || tail->allocated) continue;
      // Unmap the whole pages of the free tail.
      const auto page = pool == small_.get() ? kSmallBuffer : kLargePage;
      const auto keep_end = pool->base + (tail->address - pool->base + page - 1) / page * page;
      const auto released = pool->mapped_end - keep_end;
      if (released <= 0) continue;
      erase_free(tail);
      reserved_ -= released;
      pool->mapped_end = keep_end;
      tail->size -= released;
      if (tail->size > 0) {
        insert_free(tail);
      } else {
        pool->tail = tail->prev;
        if (tail->prev != nullptr) tail->prev->next = nullptr;
      }
    }
    std::erase_if(storage_, [](const std::unique_ptr<Block>& b) { return b->size == 0; });
    return;
  }
  for (auto* pool : {small_.get(), large_.get()}) {
    std::vector<Block*> whole;
    for (const auto& [address, b] : pool->by_address) {
      if (b->prev == nullptr && b->next == nullptr) whole.push_back(b);  // a segment that is one free block
    }
    for (Block* b : whole) {
      erase_free(b);
      reserved_ -= b->size;
      b->size = 0;
    }
  }
  std::erase_if(storage_, [](const std::unique_ptr<Block>& b) { return b->size == 0; });
}

void CachingAllocatorModel::reset_peak() {
  peak_allocated_ = allocated_;
  peak_reserved_ = reserved_;
}

std::size_t CachingAllocatorModel::segments() const {
  std::size_t n = 0;
  for (const auto& b : storage_) {
    if (b->size > 0 && b->prev == nullptr) ++n;
  }
  return n;
}

}  // namespace memgate
