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
  /// Creates what libraries keep allocated for the rest of the process once a kernel has used them (cuBLAS and
  /// cuBLASLt workspaces, one per handle and stream, that emptyCache does not free), so that a probe's `base`
  /// holds them whatever ran before it in the process. Returns their bytes on this device, measured the first
  /// time they were created in this process (the same value on every call); 0 on the CPU.
  virtual std::int64_t create_library_workspaces() = 0;
  /// Bytes in use on the device that its allocator does not hold: the CUDA context, the module images of the
  /// kernels loaded so far, and libraries' own allocations (cudaMemGetInfo's used bytes less the caching
  /// allocator's reserved bytes; another process on the same GPU counts too). 0 on the CPU.
  [[nodiscard]] virtual std::int64_t outside_allocator_bytes() = 0;
  /// Applies allocator settings such as `expandable_segments:True` (CUDA; ignored on the CPU).
  virtual void apply_allocator_settings(const std::string& settings) = 0;
  [[nodiscard]] virtual c10::Device device() const = 0;
};

/// Caps a backend's allocator at a fraction of its device's memory for as long as it lives, and lifts the cap when
/// it goes, however the scope is left (an exception, a failed assertion).
class MemoryFractionScope {
 public:
  MemoryFractionScope(MemoryBackend& backend, double fraction) : backend_(backend) {
    backend_.set_memory_fraction(fraction);
  }
  ~MemoryFractionScope() { backend_.set_memory_fraction(1.0); }
  MemoryFractionScope(const MemoryFractionScope&) = delete;
  MemoryFractionScope& operator=(const MemoryFractionScope&) = delete;

 private:
  MemoryBackend& backend_;
};

/// The backend for `device`: the counting CPU allocator (installed on first use) or CUDA's caching allocator.
[[nodiscard]] std::unique_ptr<MemoryBackend> make_memory_backend(c10::Device device);

}  // namespace memgate
