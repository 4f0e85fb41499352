// An allocator's history as PyTorch's memory_viz reads it (https://pytorch.org/memory_viz): on CUDA the caching
// allocator's own record (torch::cuda::_record_memory_history / _memory_snapshot_pickled), on the CPU the counting
// allocator's allocations and frees written in the same pickle format.
#pragma once

#include <c10/core/Device.h>

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace memgate {

struct SnapshotOptions {
  /// CUDA: capture the C++ stack of every allocation. Off by default: symbolizing them makes a dump of a large
  /// model take minutes. The CPU records the LibTorch ops (and the probe's phase) instead, always.
  bool cpp_stacks = false;
  /// The most trace entries kept (the oldest are dropped beyond it).
  std::size_t max_entries = 2'000'000;
};

/// Records a device allocator's history from construction until finish(); recording stops when it goes.
///
///   memgate::AllocationHistory history(device, {});
///   ... run the step ...
///   write_file_atomically("step.pickle", history.finish());
///
/// The pickle is a dict with `segments` (what is allocated at the end, block by block), `device_traces` (one list
/// per device of alloc / free_requested / free_completed / segment_alloc / segment_free entries with addr, size,
/// stream, time_us and frames) and `allocator_settings`: what memory_viz's "Active Memory Timeline", "Active Cached
/// Memory Timeline" and "Allocator State History" read. On the CPU each allocation is its own segment (no cache),
/// and the frames of an entry are the LibTorch ops on the stack when it was made, innermost first, then the
/// probe's phase (set_phase).
class AllocationHistory {
 public:
  AllocationHistory(c10::Device device, const SnapshotOptions& options);
  ~AllocationHistory();
  AllocationHistory(const AllocationHistory&) = delete;
  AllocationHistory& operator=(const AllocationHistory&) = delete;

  /// Names what runs from now on ("measured step: backward"): the outermost frame of what is allocated next (CPU).
  void set_phase(std::string_view phase);
  /// Stops recording and returns the snapshot, pickled. Throws memgate::Error when called twice.
  [[nodiscard]] std::string finish();

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace memgate
