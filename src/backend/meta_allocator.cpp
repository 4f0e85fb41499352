// The counting Meta allocator: a small heap record per block (its size and id) as the DataPtr's context.
#include "memgate/backend/meta_allocator.h"

#include "memgate/allocator/caching_allocator_model.h"

#include "byte_counter.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>

namespace memgate {
namespace {

struct Block {
  std::size_t size;
  std::uint64_t id;
};

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

void meta_delete(void* context) {
  auto* block = static_cast<Block*>(context);
  if (block == nullptr) return;
  g_meta_bytes.release(static_cast<std::int64_t>(block->size));
  {
    const std::lock_guard lock(g_model_mutex);
    if (g_model) g_model->free(block->id);
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
  const auto granularity = static_cast<std::size_t>(g_granularity.load(std::memory_order_relaxed));
  const std::size_t nbytes =
      granularity > 0 && requested > 0 ? (requested + granularity - 1) / granularity * granularity : requested;
  g_meta_bytes.confirm(g_meta_bytes.reserve(static_cast<std::int64_t>(nbytes), "Meta"));
  auto* block = new Block{nbytes, g_next_id.fetch_add(1, std::memory_order_relaxed)};
  {
    const std::lock_guard lock(g_model_mutex);
    if (g_model) g_model->malloc(block->id, static_cast<std::int64_t>(requested), t_stream);
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

void CountingMetaAllocator::count_external(std::int64_t bytes) { g_meta_bytes.add_external(bytes); }

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
