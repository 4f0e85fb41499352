// Reads a device's allocator: current and peak bytes, allocated and reserved. One interface, CPU and CUDA.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>

namespace memgate {

/// What a device's allocator holds, in bytes.
struct MemorySnapshot {
  std::int64_t allocated = 0;       ///< bytes in live tensors
  std::int64_t reserved = 0;        ///< bytes the allocator holds from the device (>= allocated on CUDA)
  std::int64_t peak_allocated = 0;  ///< highest `allocated` since the last reset
  std::int64_t peak_reserved = 0;   ///< highest `reserved` since the last reset
};

/// The allocator of one device, as the measurement protocol reads it.
class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  /// Waits for the device's queued work, so that the numbers read next are final.
  virtual void synchronize() = 0;
  [[nodiscard]] virtual MemorySnapshot snapshot() = 0;
  /// Sets the peaks to the current values.
  virtual void reset_peak() = 0;
  /// Gives cached, unused blocks back to the device (CUDA); nothing to do on the CPU.
  virtual void empty_cache() = 0;
  /// Caps the allocator at `fraction` of the device's memory (CUDA's per-process memory fraction); 0 lifts the
  /// cap where the device allows it.
  virtual void set_memory_fraction(double fraction) = 0;
  /// Applies allocator settings such as `expandable_segments:True` (CUDA; ignored on the CPU).
  virtual void apply_allocator_settings(const std::string& settings) = 0;
  [[nodiscard]] virtual c10::Device device() const = 0;
};

/// The backend for `device`: the counting CPU allocator (installed on first use) or CUDA's caching allocator.
[[nodiscard]] std::unique_ptr<MemoryBackend> make_memory_backend(c10::Device device);

}  // namespace memgate
