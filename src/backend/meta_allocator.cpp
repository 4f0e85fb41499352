// The counting Meta allocator: a small heap record per block (its size and id) as the DataPtr's context.
#include "memgate/backend/meta_allocator.h"

#include "memgate/allocator/caching_allocator_model.h"

#include "byte_counter.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace memgate {
namespace {

struct Block {
  std::size_t size;
  std::uint64_t id;
  /// The record of the build that left this block alive (from its stop_recording on), and whether it is parked:
  /// counted as freed while the tensor lives on.
  std::shared_ptr<CountingMetaAllocator::BuildRecord> record;
  bool parked = false;
};

}  // namespace

class CountingMetaAllocator::BuildRecord {
 public:
  enum Kind : std::uint8_t { kAlloc, kFree, kExternal };
  struct Event {
    Kind kind;
    std::uint64_t id;     ///< the block (kAlloc, kFree)
    std::int64_t bytes;   ///< requested (kAlloc), counted beside (kExternal)
    std::uint64_t stream;
  };
  std::vector<Event> events;
  std::unordered_map<std::uint64_t, Block*> alive;  ///< the blocks the build left, by id
  std::int64_t external = 0;                        ///< count_external's bytes the build left
  bool broken = false;                              ///< one of `alive` was freed while not parked
  bool parked = false;
};

namespace {

thread_local std::uint64_t t_stream = 0;
thread_local bool t_uncounted = false;

detail::ByteCounter g_meta_bytes;
std::atomic<std::uint64_t> g_next_id{1};
std::atomic<std::int64_t> g_granularity{0};
std::mutex g_observer_mutex;
CountingMetaAllocator::Observer* g_meta_observer = nullptr;
CountingMetaAllocator* g_meta_instance = nullptr;
// The caching allocator's model, when an estimate for CUDA asks for it; under its own lock.
std::mutex g_model_mutex;
std::unique_ptr<CachingAllocatorModel> g_model;
// The build being recorded (start_recording to stop_recording), under g_model_mutex.
std::shared_ptr<CountingMetaAllocator::BuildRecord> g_recording;

std::size_t rounded(std::size_t requested) {
  const auto granularity = static_cast<std::size_t>(g_granularity.load(std::memory_order_relaxed));
  return granularity > 0 && requested > 0 ? (requested + granularity - 1) / granularity * granularity : requested;
}

// A block of a record goes: the record's state is gone unless it was parked (the module freed with its cache, a
// parked block is deleted here). Under g_model_mutex.
void forget_block(Block* block) {
  auto& record = *block->record;
  if (!block->parked) record.broken = true;
  record.alive.erase(block->id);
  if (block->parked) delete block;
}

void meta_delete(void* context) {
  auto* block = static_cast<Block*>(context);
  if (block == nullptr) return;
  if (block->record && block->parked) {
    const std::lock_guard lock(g_model_mutex);
    forget_block(block);  // counted as freed when it was parked
    return;
  }
  g_meta_bytes.release(static_cast<std::int64_t>(block->size));
  {
    const std::lock_guard lock(g_model_mutex);
    if (g_model) g_model->free(block->id);
    if (block->record) forget_block(block);
    if (g_recording) {
      if (const auto it = g_recording->alive.find(block->id); it != g_recording->alive.end()) {
        g_recording->alive.erase(it);
        g_recording->events.push_back({CountingMetaAllocator::BuildRecord::kFree, block->id, 0, 0});
      }
    }
  }
  {
    const std::lock_guard lock(g_observer_mutex);
    if (g_meta_observer != nullptr) g_meta_observer->on_free(block->id, block->size);
  }
  delete block;
}

}  // namespace

CountingMetaAllocator& CountingMetaAllocator::install() {
  static std::once_flag once;
  static CountingMetaAllocator* allocator = nullptr;
  std::call_once(once, [] {
    allocator = new CountingMetaAllocator();  // lives as long as the process, as tensors may
    c10::SetAllocator(c10::DeviceType::Meta, allocator, /*priority=*/100);
    g_meta_instance = allocator;
  });
  return *allocator;
}

CountingMetaAllocator* CountingMetaAllocator::instance() { return g_meta_instance; }

c10::DataPtr CountingMetaAllocator::allocate(size_t requested) {
  // No block: meta_delete frees nothing either.
  if (t_uncounted) return {nullptr, nullptr, &meta_delete, c10::Device(c10::DeviceType::Meta)};
  const std::size_t nbytes = rounded(requested);
  g_meta_bytes.confirm(g_meta_bytes.reserve(static_cast<std::int64_t>(nbytes), "Meta"));
  auto* block = new Block{nbytes, g_next_id.fetch_add(1, std::memory_order_relaxed)};
  {
    const std::lock_guard lock(g_model_mutex);
    if (g_model) g_model->malloc(block->id, static_cast<std::int64_t>(requested), t_stream);
    if (g_recording) {
      g_recording->events.push_back({BuildRecord::kAlloc, block->id, static_cast<std::int64_t>(requested), t_stream});
      g_recording->alive.emplace(block->id, block);
    }
  }
  {
    const std::lock_guard lock(g_observer_mutex);
    if (g_meta_observer != nullptr) g_meta_observer->on_alloc(block->id, nbytes, t_stream);
  }
  return {nullptr, block, &meta_delete, c10::Device(c10::DeviceType::Meta)};
}

std::int64_t CountingMetaAllocator::current_bytes() const { return g_meta_bytes.current(); }
std::int64_t CountingMetaAllocator::peak_bytes() const { return g_meta_bytes.peak(); }
void CountingMetaAllocator::reset_peak() {
  g_meta_bytes.reset_peak();
  const std::lock_guard lock(g_model_mutex);
  if (g_model) g_model->reset_peak();
}

void CountingMetaAllocator::model_caching_allocator(bool on) {
  const std::lock_guard lock(g_model_mutex);
  g_model = on ? std::make_unique<CachingAllocatorModel>() : nullptr;
}

void CountingMetaAllocator::model_expandable_segments(bool on) {
  const std::lock_guard lock(g_model_mutex);
  if (g_model) g_model = std::make_unique<CachingAllocatorModel>(on);
}

MemorySnapshot CountingMetaAllocator::counts() const {
  const std::lock_guard lock(g_model_mutex);
  if (!g_model) return {current_bytes(), current_bytes(), peak_bytes(), peak_bytes()};
  return {g_model->allocated(), g_model->reserved(), g_model->peak_allocated(), g_model->peak_reserved()};
}

void CountingMetaAllocator::empty_cache() {
  const std::lock_guard lock(g_model_mutex);
  if (g_model) g_model->empty_cache();
}
std::int64_t CountingMetaAllocator::allocation_count() const { return g_meta_bytes.count(); }
void CountingMetaAllocator::set_limit(std::int64_t bytes) { g_meta_bytes.set_limit(bytes); }
std::int64_t CountingMetaAllocator::limit() const { return g_meta_bytes.limit(); }

void CountingMetaAllocator::count_external(std::int64_t bytes) {
  g_meta_bytes.add_external(bytes);
  const std::lock_guard lock(g_model_mutex);
  if (g_recording) {
    g_recording->events.push_back({BuildRecord::kExternal, 0, bytes, 0});
    g_recording->external += bytes;
  }
}

std::shared_ptr<CountingMetaAllocator::BuildRecord> CountingMetaAllocator::start_recording() {
  const std::lock_guard lock(g_model_mutex);
  g_recording = std::make_shared<BuildRecord>();
  return g_recording;
}

void CountingMetaAllocator::stop_recording() {
  const std::lock_guard lock(g_model_mutex);
  if (!g_recording) return;
  for (auto& [id, block] : g_recording->alive) block->record = g_recording;
  g_recording.reset();
}

bool CountingMetaAllocator::park(BuildRecord& record) {
  std::vector<std::pair<std::uint64_t, std::size_t>> parked;
  {
    const std::lock_guard lock(g_model_mutex);
    if (record.broken || record.parked || record.external != 0 || g_recording) return false;
    for (auto& [id, block] : record.alive) {
      g_meta_bytes.release(static_cast<std::int64_t>(block->size));
      if (g_model) g_model->free(id);
      block->parked = true;
      parked.emplace_back(id, block->size);
    }
    record.parked = true;
  }
  const std::lock_guard lock(g_observer_mutex);
  if (g_meta_observer != nullptr) {
    for (const auto& [id, size] : parked) g_meta_observer->on_free(id, size);
  }
  return true;
}

void CountingMetaAllocator::replay(BuildRecord& record) {
  TORCH_CHECK(record.parked, "memgate: a build record is replayed only while its blocks are parked");
  std::unordered_map<std::uint64_t, std::size_t> sizes;
  for (const auto& e : record.events) {
    if (e.kind == BuildRecord::kExternal) {
      g_meta_bytes.add_external(e.bytes);
      continue;
    }
    std::size_t nbytes = 0;
    if (e.kind == BuildRecord::kAlloc) {
      nbytes = rounded(static_cast<std::size_t>(e.bytes));
      g_meta_bytes.confirm(g_meta_bytes.reserve(static_cast<std::int64_t>(nbytes), "Meta"));
      sizes[e.id] = nbytes;
      const std::lock_guard lock(g_model_mutex);
      if (g_model) g_model->malloc(e.id, e.bytes, e.stream);
      if (const auto it = record.alive.find(e.id); it != record.alive.end()) {
        it->second->size = nbytes;
        it->second->parked = false;
      }
    } else {
      nbytes = sizes.at(e.id);
      g_meta_bytes.release(static_cast<std::int64_t>(nbytes));
      const std::lock_guard lock(g_model_mutex);
      if (g_model) g_model->free(e.id);
    }
    const std::lock_guard lock(g_observer_mutex);
    if (g_meta_observer != nullptr) {
      if (e.kind == BuildRecord::kAlloc) g_meta_observer->on_alloc(e.id, nbytes, e.stream);
      else g_meta_observer->on_free(e.id, nbytes);
    }
  }
  record.parked = false;
}

void CountingMetaAllocator::set_granularity(std::int64_t bytes) { g_granularity.store(bytes); }

CountingMetaAllocator::StreamScope::StreamScope(std::uint64_t stream) : previous_(t_stream) { t_stream = stream; }
CountingMetaAllocator::StreamScope::~StreamScope() { t_stream = previous_; }

CountingMetaAllocator::UncountedScope::UncountedScope() : previous_(t_uncounted) { t_uncounted = true; }
CountingMetaAllocator::UncountedScope::~UncountedScope() { t_uncounted = previous_; }

void CountingMetaAllocator::set_observer(Observer* observer) {
  const std::lock_guard lock(g_observer_mutex);
  g_meta_observer = observer;
}

}  // namespace memgate
