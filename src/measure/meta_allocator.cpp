// The counting Meta allocator: a small heap record per block (its size and id) as the DataPtr's context.
#include "memgate/measure/meta_allocator.h"

#include "memgate/measure/caching_allocator_model.h"

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

std::atomic<std::int64_t> g_current{0};
std::atomic<std::int64_t> g_peak{0};
std::atomic<std::int64_t> g_count{0};
std::atomic<std::int64_t> g_limit{0};
std::atomic<std::uint64_t> g_next_id{1};
std::atomic<std::int64_t> g_granularity{0};
std::mutex g_observer_mutex;
CountingMetaAllocator::Observer* g_observer = nullptr;
CountingMetaAllocator* g_instance = nullptr;
// The caching allocator's model, when an estimate for CUDA asks for it; under its own lock.
std::mutex g_model_mutex;
std::unique_ptr<CachingAllocatorModel> g_model;

void raise_peak(std::int64_t now) {
  std::int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void meta_delete(void* context) {
  auto* block = static_cast<Block*>(context);
  if (block == nullptr) return;
  g_current.fetch_sub(static_cast<std::int64_t>(block->size), std::memory_order_relaxed);
  {
    const std::lock_guard lock(g_model_mutex);
    if (g_model) g_model->free(block->id);
  }
  {
    const std::lock_guard lock(g_observer_mutex);
    if (g_observer != nullptr) g_observer->on_free(block->id, block->size);
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
    g_instance = allocator;
  });
  return *allocator;
}

CountingMetaAllocator* CountingMetaAllocator::instance() { return g_instance; }

c10::DataPtr CountingMetaAllocator::allocate(size_t requested) {
  const std::int64_t granularity = g_granularity.load(std::memory_order_relaxed);
  const auto nbytes = granularity > 0 && requested > 0
                          ? (requested + static_cast<std::size_t>(granularity) - 1) / static_cast<std::size_t>(granularity) *
                                static_cast<std::size_t>(granularity)
                          : requested;
  const auto size = static_cast<std::int64_t>(nbytes);
  const std::int64_t limit = g_limit.load(std::memory_order_relaxed);
  const std::int64_t now = g_current.fetch_add(size, std::memory_order_relaxed) + size;
  if (limit > 0 && now > limit) {
    g_current.fetch_sub(size, std::memory_order_relaxed);
    TORCH_CHECK_WITH(OutOfMemoryError, false, "memgate: Meta allocator limit reached: tried to allocate ", nbytes,
                     " bytes with ", now - size, " of ", limit, " bytes in use");
  }
  raise_peak(now);
  g_count.fetch_add(1, std::memory_order_relaxed);
  auto* block = new Block{nbytes, g_next_id.fetch_add(1, std::memory_order_relaxed)};
  {
    const std::lock_guard lock(g_model_mutex);
    if (g_model) g_model->malloc(block->id, static_cast<std::int64_t>(requested));
  }
  {
    const std::lock_guard lock(g_observer_mutex);
    if (g_observer != nullptr) g_observer->on_alloc(block->id, nbytes);
  }
  return {nullptr, block, &meta_delete, c10::Device(c10::DeviceType::Meta)};
}

std::int64_t CountingMetaAllocator::current_bytes() const { return g_current.load(std::memory_order_relaxed); }
std::int64_t CountingMetaAllocator::peak_bytes() const { return g_peak.load(std::memory_order_relaxed); }
void CountingMetaAllocator::reset_peak() {
  g_peak.store(g_current.load(std::memory_order_relaxed));
  const std::lock_guard lock(g_model_mutex);
  if (g_model) g_model->reset_peak();
}

void CountingMetaAllocator::model_caching_allocator(bool on) {
  const std::lock_guard lock(g_model_mutex);
  g_model = on ? std::make_unique<CachingAllocatorModel>() : nullptr;
}

std::int64_t CountingMetaAllocator::reserved_bytes() const {
  const std::lock_guard lock(g_model_mutex);
  return g_model ? g_model->reserved() : current_bytes();
}

std::int64_t CountingMetaAllocator::peak_reserved_bytes() const {
  const std::lock_guard lock(g_model_mutex);
  return g_model ? g_model->peak_reserved() : peak_bytes();
}

void CountingMetaAllocator::empty_cache() {
  const std::lock_guard lock(g_model_mutex);
  if (g_model) g_model->empty_cache();
}
std::int64_t CountingMetaAllocator::allocation_count() const { return g_count.load(std::memory_order_relaxed); }
void CountingMetaAllocator::set_limit(std::int64_t bytes) { g_limit.store(bytes); }
std::int64_t CountingMetaAllocator::limit() const { return g_limit.load(); }

void CountingMetaAllocator::count_external(std::int64_t bytes) {
  raise_peak(g_current.fetch_add(bytes, std::memory_order_relaxed) + bytes);
}

void CountingMetaAllocator::set_granularity(std::int64_t bytes) { g_granularity.store(bytes); }

void CountingMetaAllocator::set_observer(Observer* observer) {
  const std::lock_guard lock(g_observer_mutex);
  g_observer = observer;
}

}  // namespace memgate
