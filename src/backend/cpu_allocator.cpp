// The counting CPU allocator: a header in front of each block (its size, and its links in the list of live blocks
// that memory snapshots read), atomic current/peak counters.
#include "memgate/backend/cpu_allocator.h"

#include "byte_counter.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/core/alignment.h>
#include <c10/util/Exception.h>

#include <limits>
#include <new>
#include <mutex>

namespace memgate {
namespace {

// The header keeps the block's size and links it into the list of live blocks; its length keeps the data at
// LibTorch's alignment.
struct Header {
  std::size_t size;
  Header* prev;
  Header* next;
};
constexpr std::size_t kHeader = c10::gAlignment;
static_assert(kHeader >= sizeof(Header));

// The live blocks, newest first, and the observer; both under one lock (taken once per allocation and free).
std::mutex g_live_mutex;
Header* g_live = nullptr;
CountingCpuAllocator::Observer* g_observer = nullptr;
CountingCpuAllocator::Observer* g_attribution = nullptr;

detail::ByteCounter g_bytes;
CountingCpuAllocator* g_instance = nullptr;

void counting_delete(void* data) {
  if (data == nullptr) return;
  auto* base = static_cast<char*>(data) - kHeader;
  auto* header = reinterpret_cast<Header*>(base);
  const auto size = header->size;
  {
    const std::lock_guard lock(g_live_mutex);
    if (header->prev != nullptr) header->prev->next = header->next;
    else g_live = header->next;
    if (header->next != nullptr) header->next->prev = header->prev;
    if (g_observer != nullptr) g_observer->on_free(data, size);
    if (g_attribution != nullptr) g_attribution->on_free(data, size);
  }
  g_bytes.release(static_cast<std::int64_t>(size));
  c10::free_cpu(base);
}

}  // namespace

CountingCpuAllocator& CountingCpuAllocator::install() {
  static std::once_flag once;
  static CountingCpuAllocator* allocator = nullptr;
  std::call_once(once, [] {
    allocator = new CountingCpuAllocator();  // lives as long as the process: tensors may outlive main
    // Priority above the default allocator's so nothing registered later at the default priority replaces it.
    c10::SetCPUAllocator(allocator, /*priority=*/100);
    g_instance = allocator;
  });
  return *allocator;
}

CountingCpuAllocator* CountingCpuAllocator::instance() { return g_instance; }

c10::DataPtr CountingCpuAllocator::allocate(size_t nbytes) {
  const auto size = static_cast<std::int64_t>(nbytes);
  const std::int64_t now = g_bytes.reserve(size, "CPU");
  // A failed allocation is out of memory at this batch size, and is not counted: the next probe starts clean.
  char* base = nullptr;
  try {
    if (nbytes > std::numeric_limits<std::size_t>::max() / 2) throw std::bad_alloc();
    base = static_cast<char*>(c10::alloc_cpu(nbytes + kHeader));
  } catch (const std::exception&) {
    g_bytes.release(size);
    TORCH_CHECK_WITH(OutOfMemoryError, false, "memgate: the CPU could not allocate ", nbytes, " bytes (",
                     now - size, " bytes in use)");
  }
  g_bytes.confirm(now);
  void* data = base + kHeader;
  auto* header = reinterpret_cast<Header*>(base);
  header->size = nbytes;
  {
    const std::lock_guard lock(g_live_mutex);
    header->prev = nullptr;
    header->next = g_live;
    if (g_live != nullptr) g_live->prev = header;
    g_live = header;
    if (g_observer != nullptr) g_observer->on_alloc(data, nbytes);
    if (g_attribution != nullptr) g_attribution->on_alloc(data, nbytes);
  }
  return {data, data, &counting_delete, c10::Device(c10::DeviceType::CPU)};
}

c10::DeleterFnPtr CountingCpuAllocator::raw_deleter() const { return &counting_delete; }

void CountingCpuAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  default_copy_data(dest, src, count);
}

std::int64_t CountingCpuAllocator::current_bytes() const { return g_bytes.current(); }
std::int64_t CountingCpuAllocator::peak_bytes() const { return g_bytes.peak(); }
void CountingCpuAllocator::reset_peak() { g_bytes.reset_peak(); }
std::int64_t CountingCpuAllocator::allocation_count() const { return g_bytes.count(); }
void CountingCpuAllocator::set_limit(std::int64_t bytes) { g_bytes.set_limit(bytes); }
std::int64_t CountingCpuAllocator::limit() const { return g_bytes.limit(); }

void CountingCpuAllocator::set_observer(Observer* observer) {
  const std::lock_guard lock(g_live_mutex);
  g_observer = observer;
}

void CountingCpuAllocator::set_attribution_observer(Observer* observer) {
  const std::lock_guard lock(g_live_mutex);
  g_attribution = observer;
}

void CountingCpuAllocator::for_each_live(const std::function<void(const void*, std::size_t)>& visit) const {
  const std::lock_guard lock(g_live_mutex);
  for (const Header* h = g_live; h != nullptr; h = h->next) visit(reinterpret_cast<const char*>(h) + kHeader, h->size);
}

}  // namespace memgate
