// The counters a counting allocator keeps (bytes in use, their peak, allocations, a limit), shared by the CPU's and
// the Meta device's: atomic, as tensors may be freed on any thread.
#pragma once

#include <c10/util/Exception.h>

#include <atomic>
#include <cstdint>

namespace memgate::detail {

class ByteCounter {
 public:
  /// Counts `bytes` more in use and returns the bytes in use with them; throws c10::OutOfMemoryError naming
  /// `allocator` (and counts nothing) when that passes the limit, as a device of that size would.
  std::int64_t reserve(std::int64_t bytes, const char* allocator) {
    const std::int64_t limit = limit_.load(std::memory_order_relaxed);
    const std::int64_t now = current_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    if (limit > 0 && now > limit) {
      current_.fetch_sub(bytes, std::memory_order_relaxed);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "memgate: ", allocator, " allocator limit reached: tried to allocate ",
                       bytes, " bytes with ", now - bytes, " of ", limit, " bytes in use");
    }
    return now;
  }
  /// A reserved allocation took place: the peak follows the bytes in use `now`, and it is counted.
  void confirm(std::int64_t now) {
    raise_peak(now);
    count_.fetch_add(1, std::memory_order_relaxed);
  }
  /// Bytes no longer in use (a free, or a reservation whose allocation failed).
  void release(std::int64_t bytes) { current_.fetch_sub(bytes, std::memory_order_relaxed); }
  /// Bytes in use changed outside an allocation of this allocator (negative: fewer); the peak follows.
  void add_external(std::int64_t bytes) { raise_peak(current_.fetch_add(bytes, std::memory_order_relaxed) + bytes); }

  [[nodiscard]] std::int64_t current() const { return current_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::int64_t peak() const { return peak_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::int64_t count() const { return count_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::int64_t limit() const { return limit_.load(); }
  void reset_peak() { peak_.store(current_.load(std::memory_order_relaxed)); }
  void set_limit(std::int64_t bytes) { limit_.store(bytes); }

 private:
  void raise_peak(std::int64_t now) {
    std::int64_t peak = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  }

  std::atomic<std::int64_t> current_{0};
  std::atomic<std::int64_t> peak_{0};
  std::atomic<std::int64_t> count_{0};
  std::atomic<std::int64_t> limit_{0};
};

}  // namespace memgate::detail
