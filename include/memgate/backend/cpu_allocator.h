// A counting CPU allocator: LibTorch's CPU tensors go through it, so memgate can read current and peak bytes.
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>
#include <cstdint>
#include <functional>

namespace memgate {

/// Counts the bytes that LibTorch's CPU tensors hold. Installed once per process with `c10::SetCPUAllocator`;
/// every CPU allocation from then on is counted at its requested size (the size a tensor's storage asks for).
///
///   auto& counter = memgate::CountingCpuAllocator::install();
///   counter.reset_peak();
///   auto t = torch::ones({256});   // counter.current_bytes() grows by 1024
///
/// The DataPtr's pointer and context are the same pointer and `raw_deleter` frees it, as LibTorch's
/// `raw_allocate` requires. Counters are atomic: tensors may be freed on any thread.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  /// Installs the allocator as LibTorch's CPU allocator (once; later calls return the same instance).
  static CountingCpuAllocator& install();
  /// The installed instance, or nullptr before `install()`.
  [[nodiscard]] static CountingCpuAllocator* instance();

  c10::DataPtr allocate(size_t nbytes) override;
  [[nodiscard]] c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  /// Bytes held now by tensors allocated through this allocator.
  [[nodiscard]] std::int64_t current_bytes() const;
  /// Highest `current_bytes()` since the last `reset_peak()`.
  [[nodiscard]] std::int64_t peak_bytes() const;
  /// Sets the peak to the current bytes.
  void reset_peak();
  /// Number of allocations since install.
  [[nodiscard]] std::int64_t allocation_count() const;
  /// Makes allocations that would take `current_bytes()` above `bytes` throw `c10::OutOfMemoryError`, as a GPU
  /// of that size would; 0 removes the limit. Lets the CPU exercise out-of-memory handling.
  void set_limit(std::int64_t bytes);
  [[nodiscard]] std::int64_t limit() const;

  /// Sees every allocation and free while it is set (memory snapshots record with it). Called with the allocator's
  /// lock held, on the thread that allocates or frees: it must not allocate LibTorch tensors.
  class Observer {
   public:
    virtual ~Observer() = default;
    virtual void on_alloc(const void* data, std::size_t bytes) = 0;
    virtual void on_free(const void* data, std::size_t bytes) = 0;
  };
  /// Sets the observer (nullptr: none). One at a time.
  void set_observer(Observer* observer);
  /// A second observer, beside the first: the per-module attribution of a probe (backend/module_attribution.h),
  /// which runs while a snapshot records. One at a time.
  void set_attribution_observer(Observer* observer);
  /// Calls `visit(data, bytes)` for every live allocation, newest first, with the allocator's lock held.
  void for_each_live(const std::function<void(const void* data, std::size_t bytes)>& visit) const;

 private:
  CountingCpuAllocator() = default;
};

}  // namespace memgate
