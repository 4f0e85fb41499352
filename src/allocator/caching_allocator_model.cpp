// The CUDA caching allocator's block and segment policy, replayed on sizes, streams and settings.
#include "memgate/allocator/caching_allocator_model.h"

#include "memgate/base/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>

namespace memgate {
namespace {

constexpr std::int64_t kLargeBuffer = 20 << 20;     // large pool segments for requests below kMinLargeAlloc
constexpr std::int64_t kMinLargeAlloc = 10 << 20;
constexpr std::int64_t kRoundLarge = 2 << 20;
constexpr std::int64_t kLargePage = 20 << 20;       // an expandable large segment's mapping granularity
constexpr std::int64_t kMiB = 1 << 20;

// CUDAAllocatorConfig::roundup_power2_divisions(size): the interval of `size`, from 1 MiB (0) to 32 GiB (15).
std::size_t power2_interval(std::int64_t size) {
  const int log_size = 63 - std::countl_zero(static_cast<std::uint64_t>(size));
  return static_cast<std::size_t>(std::clamp(log_size - 20, 0, 15));
}

// roundup_power2_next_division: `size` up to the next of `divisions` equal steps between its powers of two.
std::int64_t roundup_power2_next_division(std::int64_t size, std::int64_t divisions) {
  const auto u = static_cast<std::uint64_t>(size);
  if (std::has_single_bit(u)) return size;
  const std::uint64_t floor = std::bit_floor(u);
  const std::uint64_t step = floor >> (63 - std::countl_zero(static_cast<std::uint64_t>(divisions)));
  if (step == 0) return static_cast<std::int64_t>(floor << 1);
  const std::uint64_t rounded = u & ~(step - 1);
  return static_cast<std::int64_t>(rounded == u ? u : rounded + step);
}

std::string trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return std::string(s);
}

// Splits on commas outside brackets.
std::vector<std::string> split_top(std::string_view s) {
  std::vector<std::string> parts;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || (s[i] == ',' && depth == 0)) {
      parts.push_back(trim(s.substr(start, i - start)));
      start = i + 1;
    } else if (s[i] == '[') {
      ++depth;
    } else if (s[i] == ']') {
      --depth;
    }
  }
  return parts;
}

bool parse_int(std::string_view s, std::int64_t& out) {
  const auto* end = s.data() + s.size();
  const auto [ptr, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc{} && ptr == end;
}

}  // namespace

AllocatorSettings AllocatorSettings::parse(std::string_view conf, const std::string& origin, AllocatorSettings base) {
  AllocatorSettings s = base;
  if (trim(conf).empty()) return s;
  for (const auto& pair : split_top(conf)) {
    const auto colon = pair.find(':');
    if (colon == std::string::npos) {
      throw Error(fmt::format("{}: allocator setting '{}': expected key:value", origin, pair));
    }
    const auto key = trim(std::string_view(pair).substr(0, colon));
    const auto value = trim(std::string_view(pair).substr(colon + 1));
    const auto bad = [&](std::string_view expected) {
      return Error(fmt::format("{}: allocator setting '{}': '{}' is not {}", origin, key, value, expected));
    };
    std::int64_t n = 0;
    if (key == "expandable_segments") {
      if (value != "True" && value != "False" && value != "true" && value != "false") throw bad("True or False");
      s.expandable_segments = value == "True" || value == "true";
    } else if (key == "max_split_size_mb") {
      if (!parse_int(value, n) || n <= 1 || n > (INT64_MAX >> 20)) throw bad("a whole number of MiB above 1");
      s.max_split_size = n * kMiB;
    } else if (key == "max_non_split_rounding_mb") {
      if (!parse_int(value, n) || n < 1 || n > (INT64_MAX >> 20)) throw bad("a whole number of MiB from 1");
      s.max_non_split_rounding = n * kMiB;
    } else if (key == "garbage_collection_threshold") {
      double t = 0;
      const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), t);
      if (ec != std::errc{} || ptr != value.data() + value.size() || !(t > 0.0 && t < 1.0)) {
        throw bad("a fraction between 0 and 1 (exclusive)");
      }
      s.garbage_collection_threshold = t;
    } else if (key == "roundup_power2_divisions") {
      const auto check_divisions = [&](std::int64_t d) {
        if (d != 0 && (d < 1 || !std::has_single_bit(static_cast<std::uint64_t>(d)))) throw bad("a power of two");
      };
      if (value.starts_with('[')) {
        if (!value.ends_with(']')) throw bad("a list [size_mb:divisions,...,>:divisions]");
        std::int64_t last_index = 0;
        bool first = true;
        for (const auto& item : split_top(std::string_view(value).substr(1, value.size() - 2))) {
          const auto c = item.find(':');
          std::int64_t d = 0;
          if (c == std::string::npos || !parse_int(trim(std::string_view(item).substr(c + 1)), d)) {
            throw bad("a list [size_mb:divisions,...,>:divisions]");
          }
          check_divisions(d);
          const auto size_text = trim(std::string_view(item).substr(0, c));
          if (size_text == ">") {
            for (auto i = static_cast<std::size_t>(last_index) + (first ? 0 : 1); i < 16; ++i) {
              s.roundup_power2_divisions[i] = d;
            }
            continue;
          }
          std::int64_t mb = 0;
          if (!parse_int(size_text, mb) || mb < 1 || !std::has_single_bit(static_cast<std::uint64_t>(mb))) {
            throw bad("a list whose sizes are powers of two in MiB");
          }
          const auto index = static_cast<std::int64_t>(power2_interval(mb * kMiB));
          for (auto i = first ? 0 : last_index + 1; i <= index; ++i) {
            s.roundup_power2_divisions[static_cast<std::size_t>(i)] = d;
          }
          last_index = index;
          first = false;
        }
      } else {
        if (!parse_int(value, n)) throw bad("a power of two, or a list [size_mb:divisions,...]");
        check_divisions(n);
        s.roundup_power2_divisions.fill(n);
      }
    } else if (key == "backend" || key == "pinned_use_cuda_host_register" || key == "pinned_num_register_threads" ||
               key == "release_lock_on_cudamalloc" || key == "pinned_use_background_threads" ||
               key == "graph_capture_record_stream_reuse" || key == "per_process_memory_fraction") {
      // Settings that do not change which blocks and segments the device allocator uses.
    } else {
      throw Error(fmt::format(
          "{}: unknown allocator setting '{}': expected expandable_segments, max_split_size_mb, "
          "max_non_split_rounding_mb, roundup_power2_divisions or garbage_collection_threshold",
          origin, key));
    }
  }
  return s;
}

std::string AllocatorSettings::to_string() const {
  const AllocatorSettings defaults;
  std::vector<std::string> parts;
  if (expandable_segments) parts.emplace_back("expandable_segments:True");
  if (max_split_size != defaults.max_split_size) parts.push_back(fmt::format("max_split_size_mb:{}", max_split_size / kMiB));
  if (max_non_split_rounding != defaults.max_non_split_rounding) {
    parts.push_back(fmt::format("max_non_split_rounding_mb:{}", max_non_split_rounding / kMiB));
  }
  if (roundup_power2_divisions != defaults.roundup_power2_divisions) {
    const bool uniform = std::all_of(roundup_power2_divisions.begin(), roundup_power2_divisions.end(),
                                     [&](std::int64_t d) { return d == roundup_power2_divisions[0]; });
    if (uniform) {
      parts.push_back(fmt::format("roundup_power2_divisions:{}", roundup_power2_divisions[0]));
    } else {
      std::vector<std::string> items;
      for (std::size_t i = 0; i < 15; ++i) items.push_back(fmt::format("{}:{}", std::int64_t{1} << i, roundup_power2_divisions[i]));
      items.push_back(fmt::format(">:{}", roundup_power2_divisions[15]));
      parts.push_back(fmt::format("roundup_power2_divisions:[{}]", fmt::join(items, ",")));
    }
  }
  if (garbage_collection_threshold > 0) {
    parts.push_back(fmt::format("garbage_collection_threshold:{}", garbage_collection_threshold));
  }
  return fmt::format("{}", fmt::join(parts, ","));
}

std::string_view segment_event_name(SegmentEvent::Kind kind) {
  switch (kind) {
    case SegmentEvent::Kind::alloc: return "segment_alloc";
    case SegmentEvent::Kind::free: return "segment_free";
    case SegmentEvent::Kind::map: return "segment_map";
    case SegmentEvent::Kind::unmap: return "segment_unmap";
  }
  return "segment_event";
}

struct CachingAllocatorModel::Block {
  std::uint64_t address = 0;
  std::int64_t size = 0;
  std::uint64_t stream = 0;
  bool small = false;
  bool allocated = false;
  bool expandable = false;  ///< of an expandable segment
  std::uint64_t id = 0;
  std::int64_t requested = 0;
  std::int64_t gc_count_base = 0;
  Block* prev = nullptr;  ///< neighbours within the segment
  Block* next = nullptr;
  [[nodiscard]] bool is_split() const { return prev != nullptr || next != nullptr; }
};

// Free blocks ordered as the allocator's BlockPool: by stream, size, then address.
struct CachingAllocatorModel::Pool {
  std::set<std::tuple<std::uint64_t, std::int64_t, std::uint64_t>> free;  // (stream, size, address)
  std::unordered_map<std::uint64_t, Block*> by_address;
  std::int64_t get_free_blocks_calls = 0;  // for garbage collection: a block's age
  // Expandable segments, one per stream: the segment's last block and the end of what is mapped.
  struct Expandable {
    Block* tail = nullptr;
    std::uint64_t base = 0, mapped_end = 0;
  };
  std::map<std::uint64_t, Expandable> expandable;
  // The stream's expandable segment whose last block is `b`, if any.
  Expandable* tail_of(const Block* b) {
    const auto it = expandable.find(b->stream);
    return it != expandable.end() && it->second.tail == b ? &it->second : nullptr;
  }
};

CachingAllocatorModel::CachingAllocatorModel(AllocatorSettings settings)
    : settings_(settings), small_(std::make_unique<Pool>()), large_(std::make_unique<Pool>()) {}
CachingAllocatorModel::CachingAllocatorModel(bool expandable_segments)
    : CachingAllocatorModel(AllocatorSettings{.expandable_segments = expandable_segments}) {}
CachingAllocatorModel::~CachingAllocatorModel() = default;

std::int64_t CachingAllocatorModel::round_size(std::int64_t bytes, const AllocatorSettings& settings) {
  if (bytes < kMinBlockSize) return kMinBlockSize;
  const auto divisions = settings.roundup_power2_divisions[power2_interval(bytes)];
  if (divisions > 1 && bytes > kMinBlockSize * divisions) return roundup_power2_next_division(bytes, divisions);
  return (bytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

std::int64_t CachingAllocatorModel::segment_size(std::int64_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

CachingAllocatorModel::Block* CachingAllocatorModel::new_block() {
  storage_.push_back(std::make_unique<Block>());
  return storage_.back().get();
}

void CachingAllocatorModel::insert_free(Block* b) {
  auto& p = pool(b->small);
  p.free.insert({b->stream, b->size, b->address});
  p.by_address[b->address] = b;
  b->gc_count_base = p.get_free_blocks_calls;
}

void CachingAllocatorModel::erase_free(Block* b) {
  auto& p = pool(b->small);
  p.free.erase({b->stream, b->size, b->address});
  p.by_address.erase(b->address);
}

void CachingAllocatorModel::emit(SegmentEvent::Kind kind, std::uint64_t address, std::int64_t size,
                                 std::uint64_t stream) {
  ++(kind == SegmentEvent::Kind::alloc || kind == SegmentEvent::Kind::map ? segment_allocs_ : segment_frees_);
  if (record_events_) events_.push_back({kind, address, size, stream});
}

void CachingAllocatorModel::note_reserved() { peak_reserved_ = std::max(peak_reserved_, reserved_); }

const CachingAllocatorModel::Block* CachingAllocatorModel::find_free(bool small, std::int64_t size,
                                                                     std::uint64_t stream) const {
  const auto& p = small ? *small_ : *large_;
  const auto it = p.free.lower_bound({stream, size, 0});
  if (it == p.free.end() || std::get<0>(*it) != stream) return nullptr;
  const auto block_size = std::get<1>(*it);
  // An oversize block serves only oversize requests, and only those within max_non_split_rounding of it.
  if (size < settings_.max_split_size && block_size >= settings_.max_split_size) return nullptr;
  if (size >= settings_.max_split_size && block_size >= size + settings_.max_non_split_rounding) return nullptr;
  return p.by_address.at(std::get<2>(*it));
}

bool CachingAllocatorModel::has_free_block(std::int64_t bytes, std::uint64_t stream) const {
  const auto size = round_size(std::max<std::int64_t>(bytes, 1), settings_);
  return find_free(size <= kSmallSize, size, stream) != nullptr;
}

CachingAllocatorModel::Block* CachingAllocatorModel::get_free_block(bool small, std::int64_t size,
                                                                    std::uint64_t stream) {
  if (capacity_ && settings_.garbage_collection_threshold > 0) ++pool(small).get_free_blocks_calls;
  auto* block = const_cast<Block*>(find_free(small, size, stream));
  if (block != nullptr) erase_free(block);
  return block;
}

// cudaMalloc of a whole segment: fails when the capacity would be passed.
CachingAllocatorModel::Block* CachingAllocatorModel::alloc_segment(bool small, std::int64_t size,
                                                                   std::int64_t segment, std::uint64_t stream) {
  if (settings_.expandable_segments) {
    auto& e = pool(small).expandable[stream];
    const auto page = small ? kSmallBuffer : kLargePage;
    const Block* tail = e.tail != nullptr && !e.tail->allocated ? e.tail : nullptr;
    const auto lacking = size - (tail != nullptr ? tail->size : 0);
    const auto mapped = (lacking + page - 1) / page * page;
    if (capacity_ && reserved_ + mapped > *capacity_) return nullptr;
    return grow(small, size, stream);
  }
  if (capacity_ && reserved_ + segment > *capacity_) return nullptr;
  std::optional<std::uint64_t> address;
  if (address_source_) address = address_source_(segment, stream);
  if (address && overlaps_segment(*address, segment)) address.reset();
  Block* block = new_block();
  if (address) {
    block->address = *address;
  } else {
    block->address = next_address_;
    next_address_ += static_cast<std::uint64_t>(segment);
  }
  block->size = segment;
  block->small = small;
  block->stream = stream;
  segment_ranges_[block->address] = segment;
  reserved_ += segment;
  note_reserved();
  emit(SegmentEvent::Kind::alloc, block->address, segment, stream);
  return block;
}

// Expandable: map the pages the stream's free tail lacks, after it, and hand out the tail grown by them.
CachingAllocatorModel::Block* CachingAllocatorModel::grow(bool small, std::int64_t size, std::uint64_t stream) {
  auto& e = pool(small).expandable[stream];
  if (e.base == 0) {  // a new segment: its own address range, as large as a GPU's memory could need
    e.base = e.mapped_end = next_address_;
    next_address_ += std::uint64_t{1} << 44;
  }
  const auto page = small ? kSmallBuffer : kLargePage;
  Block* tail = e.tail != nullptr && !e.tail->allocated ? e.tail : nullptr;
  const auto lacking = size - (tail != nullptr ? tail->size : 0);
  const auto mapped = (lacking + page - 1) / page * page;
  reserved_ += mapped;
  note_reserved();
  emit(SegmentEvent::Kind::map, e.mapped_end, mapped, stream);
  if (tail != nullptr) {
    erase_free(tail);
    tail->size += mapped;
  } else {
    tail = new_block();
    tail->address = e.mapped_end;
    tail->size = mapped;
    tail->small = small;
    tail->stream = stream;
    tail->expandable = true;
    tail->prev = e.tail;
    if (e.tail != nullptr) e.tail->next = tail;
    e.tail = tail;
  }
  e.mapped_end += static_cast<std::uint64_t>(mapped);
  return tail;
}

// A segment that is one free block goes back to CUDA.
void CachingAllocatorModel::release_block(Block* block) {
  erase_free(block);
  reserved_ -= block->size;
  emit(SegmentEvent::Kind::free, block->address, block->size, block->stream);
  segment_ranges_.erase(block->address);
  block->size = 0;  // collected by the caller
}

// release_available_cached_blocks: with max_split_size, free one oversize cached block that holds the request,
// else oversize blocks from the largest down until as much as the request is freed.
bool CachingAllocatorModel::release_available_cached_blocks(bool small, std::int64_t size, std::uint64_t stream) {
  if (settings_.max_split_size == AllocatorSettings::kNoLimit || settings_.expandable_segments) return false;
  auto& p = pool(small);
  const auto key_size = std::max(size, settings_.max_split_size);
  auto it = p.free.lower_bound({stream, key_size, 0});
  if (it == p.free.end() || std::get<0>(*it) != stream) {
    if (it == p.free.begin()) return false;
    std::int64_t released = 0;
    --it;
    std::vector<Block*> to_release;
    while (released < key_size && std::get<1>(*it) >= settings_.max_split_size && std::get<0>(*it) == stream) {
      Block* b = p.by_address.at(std::get<2>(*it));
      const bool first = it == p.free.begin();
      if (!first) --it;
      // release_block of a split block would free part of a segment: LibTorch asserts it never happens, as
      // oversize blocks are never split.
      if (!b->is_split()) {
        released += b->size;
        to_release.push_back(b);
      }
      if (first) break;
    }
    if (released < key_size) return false;
    for (Block* b : to_release) release_block(b);
  } else {
    Block* b = p.by_address.at(std::get<2>(*it));
    if (b->is_split()) return false;
    release_block(b);
  }
  std::erase_if(storage_, [](const std::unique_ptr<Block>& b) { return b->size == 0; });
  return true;
}

// release_cached_blocks: every wholly free segment, the large pool's first.
void CachingAllocatorModel::release_cached_blocks() {
  for (auto* p : {large_.get(), small_.get()}) {
    std::vector<Block*> whole;
    for (const auto& key : p->free) {
      Block* b = p->by_address.at(std::get<2>(key));
      if (!b->is_split() && !b->expandable) whole.push_back(b);  // a segment that is one free block
    }
    for (Block* b : whole) release_block(b);
    // Expandable segments: unmap the whole pages of each free tail.
    for (auto& [stream, e] : p->expandable) {
      Block* tail = e.tail;
      if (tail == nullptr || tail->allocated) continue;
      const auto page = p == small_.get() ? kSmallBuffer : kLargePage;
      const auto offset = static_cast<std::int64_t>(tail->address - e.base);
      const auto keep_end = e.base + static_cast<std::uint64_t>((offset + page - 1) / page * page);
      const auto released = static_cast<std::int64_t>(e.mapped_end - keep_end);
      if (released <= 0) continue;
      erase_free(tail);
      reserved_ -= released;
      emit(SegmentEvent::Kind::unmap, keep_end, released, stream);
      e.mapped_end = keep_end;
      tail->size -= released;
      if (tail->size > 0) {
        insert_free(tail);
      } else {
        e.tail = tail->prev;
        if (tail->prev != nullptr) tail->prev->next = nullptr;
      }
    }
  }
  std::erase_if(storage_, [](const std::unique_ptr<Block>& b) { return b->size == 0; });
}

// garbage_collect_cached_blocks: past the threshold of the capacity, free the large pool's wholly free segments
// whose age (get_free_block calls since they were cached) is at least the average, until enough is freed.
void CachingAllocatorModel::garbage_collect() {
  if (!capacity_ || settings_.expandable_segments) return;
  const auto threshold = static_cast<std::int64_t>(settings_.garbage_collection_threshold *
                                                   static_cast<double>(*capacity_));
  if (reserved_ <= threshold) return;
  const auto target = reserved_ - threshold;
  auto& p = *large_;
  std::int64_t total_age = 0;
  std::int64_t freeable = 0;
  for (const auto& key : p.free) {
    const Block* b = p.by_address.at(std::get<2>(key));
    if (!b->is_split() && !b->expandable) {
      total_age += p.get_free_blocks_calls - b->gc_count_base;
      ++freeable;
    }
  }
  if (freeable == 0) return;
  std::int64_t reclaimed = 0;
  bool freed = true;
  while (reclaimed < target && freed && freeable > 0) {
    const double age_threshold = static_cast<double>(total_age) / static_cast<double>(freeable);
    freed = false;
    std::vector<Block*> old;
    for (const auto& key : p.free) {
      Block* b = p.by_address.at(std::get<2>(key));
      if (!b->is_split() && !b->expandable && static_cast<double>(p.get_free_blocks_calls - b->gc_count_base) >= age_threshold) {
        old.push_back(b);
      }
    }
    for (Block* b : old) {
      freed = true;
      reclaimed += b->size;
      total_age -= p.get_free_blocks_calls - b->gc_count_base;
      --freeable;
      release_block(b);
    }
  }
  std::erase_if(storage_, [](const std::unique_ptr<Block>& b) { return b->size == 0; });
}

std::optional<std::uint64_t> CachingAllocatorModel::malloc(std::uint64_t id, std::int64_t bytes,
                                                            std::uint64_t stream) {
  if (bytes <= 0) return std::uint64_t{0};  // a zero-byte tensor takes no block
  const auto size = round_size(bytes, settings_);
  const bool small = size <= kSmallSize;
  const auto segment = segment_size(size);
  Block* block = get_free_block(small, size, stream);
  if (block == nullptr) {
    if (capacity_ && settings_.garbage_collection_threshold > 0) garbage_collect();
    block = alloc_segment(small, size, segment, stream);
    if (block == nullptr && release_available_cached_blocks(small, size, stream)) {
      block = alloc_segment(small, size, segment, stream);
    }
    if (block == nullptr) {
      ++retries_;
      release_cached_blocks();
      block = alloc_segment(small, size, segment, stream);
    }
    if (block == nullptr) {
      ++ooms_;
      return std::nullopt;
    }
  }
  const auto remaining = block->size - size;
  const bool split = small || settings_.expandable_segments
                         ? remaining >= kMinBlockSize
                         : size < settings_.max_split_size && remaining > kSmallSize;
  if (split) {
    Block* rest = new_block();
    rest->address = block->address + static_cast<std::uint64_t>(size);
    rest->size = remaining;
    rest->small = small;
    rest->stream = block->stream;
    rest->expandable = block->expandable;
    rest->prev = block;
    rest->next = block->next;
    if (block->next != nullptr) block->next->prev = rest;
    block->next = rest;
    if (auto* e = pool(small).tail_of(block)) e->tail = rest;
    block->size = size;
    insert_free(rest);
  }
  block->allocated = true;
  block->id = id;
  block->requested = bytes;
  live_[id] = block;
  allocated_ += block->size;
  requested_ += bytes;
  peak_allocated_ = std::max(peak_allocated_, allocated_);
  return block->address;
}

void CachingAllocatorModel::free(std::uint64_t id) {
  const auto it = live_.find(id);
  if (it == live_.end()) return;
  Block* block = it->second;
  live_.erase(it);
  allocated_ -= block->size;
  requested_ -= block->requested;
  block->allocated = false;
  block->requested = 0;
  auto& p = pool(block->small);
  for (Block* neighbour : {block->prev, block->next}) {
    if (neighbour == nullptr || neighbour->allocated) continue;
    erase_free(neighbour);
    if (neighbour == block->prev) {
      neighbour->size += block->size;
      neighbour->next = block->next;
      if (block->next != nullptr) block->next->prev = neighbour;
      if (auto* e = p.tail_of(block)) e->tail = neighbour;
      block->size = 0;  // merged away
      block = neighbour;
    } else {
      block->size += neighbour->size;
      block->next = neighbour->next;
      if (neighbour->next != nullptr) neighbour->next->prev = block;
      if (auto* e = p.tail_of(neighbour)) e->tail = block;
      neighbour->size = 0;
    }
  }
  insert_free(block);
  if (storage_.size() > 1024 && storage_.size() > 4 * (live_.size() + small_->by_address.size() +
                                                       large_->by_address.size())) {
    std::erase_if(storage_, [](const std::unique_ptr<Block>& b) { return b->size == 0; });
  }
}

void CachingAllocatorModel::empty_cache() { release_cached_blocks(); }

void CachingAllocatorModel::add_segment(std::uint64_t address, std::uint64_t stream, bool small,
                                        const std::vector<SeedBlock>& blocks) {
  Block* prev = nullptr;
  std::uint64_t at = address;
  std::int64_t total = 0;
  for (const auto& seed : blocks) {
    Block* b = new_block();
    b->address = at;
    b->size = seed.size;
    b->stream = stream;
    b->small = small;
    b->prev = prev;
    if (prev != nullptr) prev->next = b;
    if (seed.id) {
      b->allocated = true;
      b->id = *seed.id;
      b->requested = seed.requested;
      live_[*seed.id] = b;
      allocated_ += b->size;
      requested_ += seed.requested;
    }
    prev = b;
    at += static_cast<std::uint64_t>(seed.size);
    total += seed.size;
  }
  // Free blocks go to the pool once their neighbours are known.
  for (Block* b = prev; b != nullptr; b = b->prev) {
    if (!b->allocated) insert_free(b);
  }
  segment_ranges_[address] = total;
  reserved_ += total;
  peak_allocated_ = std::max(peak_allocated_, allocated_);
  note_reserved();
}

bool CachingAllocatorModel::overlaps_segment(std::uint64_t address, std::int64_t size) const {
  const auto end = address + static_cast<std::uint64_t>(size);
  auto it = segment_ranges_.lower_bound(address);
  if (it != segment_ranges_.end() && it->first < end) return true;
  if (it == segment_ranges_.begin()) return false;
  --it;
  return it->first + static_cast<std::uint64_t>(it->second) > address;
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

std::int64_t CachingAllocatorModel::largest_free_block() const {
  std::int64_t largest = 0;
  for (const auto* p : {small_.get(), large_.get()}) {
    for (const auto& key : p->free) largest = std::max(largest, std::get<1>(key));
  }
  return largest;
}

std::vector<CachingAllocatorModel::SegmentView> CachingAllocatorModel::segment_views() const {
  std::vector<SegmentView> views;
  for (const auto& b : storage_) {
    if (b->size == 0 || b->prev != nullptr) continue;
    SegmentView v{.address = b->address, .size = 0, .stream = b->stream, .small = b->small, .blocks = {}};
    for (const Block* x = b.get(); x != nullptr; x = x->next) {
      v.size += x->size;
      v.blocks.push_back({x->address, x->size, x->allocated, x->id});
    }
    views.push_back(std::move(v));
  }
  std::sort(views.begin(), views.end(), [](const auto& a, const auto& b) { return a.address < b.address; });
  return views;
}

}  // namespace memgate
