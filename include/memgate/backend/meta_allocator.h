// A counting allocator for the Meta device: tensors there have shapes and dtypes but no storage, so a training step
// run on Meta computes nothing, and this allocator counts what each of its tensors asks for.
#pragma once

#include "memgate/backend/memory_backend.h"

#include <c10/core/Allocator.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace memgate {

/// Counts the bytes Meta tensors request and hands out no memory (their data pointer stays null, as with LibTorch's
/// own Meta allocator). Installed once per process with `c10::SetAllocator(c10::DeviceType::Meta, ...)`.
///
///   auto& meta = memgate::CountingMetaAllocator::install();
///   auto t = torch::empty({256}, torch::kMeta);   // meta.current_bytes() grows by 1024, nothing is allocated
class CountingMetaAllocator final : public c10::Allocator {
 public:
  static CountingMetaAllocator& install();
  [[nodiscard]] static CountingMetaAllocator* instance();

  c10::DataPtr allocate(size_t nbytes) override;
  [[nodiscard]] c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void*, const void*, std::size_t) const override {}

  [[nodiscard]] std::int64_t current_bytes() const;
  [[nodiscard]] std::int64_t peak_bytes() const;
  void reset_peak();
  [[nodiscard]] std::int64_t allocation_count() const;
  /// Makes allocations beyond `bytes` in use throw c10::OutOfMemoryError, as a device of that size would (0: none).
  void set_limit(std::int64_t bytes);
  [[nodiscard]] std::int64_t limit() const;
  /// Counts `bytes` (negative: a free) made outside this allocator as if made here: an estimate for the CPU adds
  /// what the step keeps on the CPU beside its Meta tensors (the optimizer's step counters), which the CPU's one
  /// allocator would count with the rest.
  void count_external(std::int64_t bytes);
  /// Counts each request as a device's allocator would: 0 counts requests as they are (the CPU), 512 rounds each
  /// up to the CUDA caching allocator's 512-byte blocks (a zero-byte request takes none).
  void set_granularity(std::int64_t bytes);
  /// Replays every request through a model of the CUDA caching allocator (CachingAllocatorModel, started empty),
  /// so that counts() says what a GPU's allocator would hold; off: reserved is what is allocated.
  void model_caching_allocator(bool on);
  /// With the model on, starts it afresh with expandable segments or without (the allocator settings a probe
  /// applies before it allocates anything).
  void model_expandable_segments(bool on);
  /// What the device's allocator would say, read at once: with the model on, allocated counts the blocks it hands
  /// out, as CUDA's allocated_bytes does (a block that is not split, because what would remain is too small to stand
  /// alone, is counted whole: a 30,720,000-byte request in a 2 MiB-rounded segment counts 31,457,280), and reserved
  /// its segments; off, both are current_bytes() and their peak peak_bytes().
  [[nodiscard]] MemorySnapshot counts() const;
  /// The model's empty_cache (nothing without the model).
  void empty_cache();

  /// The stream the requests of this thread are made on while it lives, as CUDA's caching allocator takes it from
  /// the current stream: a block comes from that stream's free blocks (or a new segment of it) and goes back to
  /// them when it is freed, whichever stream is current then. 0 is the default stream; scopes nest.
  ///
  ///   { CountingMetaAllocator::StreamScope on(1); auto t = torch::empty({256}, torch::kMeta); }  // stream 1's pool
  class StreamScope {
   public:
    explicit StreamScope(std::uint64_t stream);
    ~StreamScope();
    StreamScope(const StreamScope&) = delete;
    StreamScope& operator=(const StreamScope&) = delete;

   private:
    std::uint64_t previous_;
  };

  /// While it lives, this thread's Meta tensors are allocated outside the count (their frees too): memgate._meta
  /// runs torch's Python decompositions that stand in for a device's kernel under it, then allocates their outputs
  /// counted, as the kernel would (its temporaries are the decomposition's, not the kernel's). Scopes nest.
  class UncountedScope {
   public:
    UncountedScope();
    ~UncountedScope();
    UncountedScope(const UncountedScope&) = delete;
    UncountedScope& operator=(const UncountedScope&) = delete;

   private:
    bool previous_;
  };

  /// Sees each allocation and free (a memory_viz snapshot of an estimate records them). `id` names the block from
  /// its allocation to its free; `stream` is the one it was allocated on. Called on the allocating or freeing thread.
  class Observer {
   public:
    virtual ~Observer() = default;
    virtual void on_alloc(std::uint64_t id, std::size_t bytes, std::uint64_t stream) = 0;
    virtual void on_free(std::uint64_t id, std::size_t bytes) = 0;
  };
  void set_observer(Observer* observer);

  /// A build's requests, recorded so that the build can be counted again without running it: a Python fixture's
  /// module, built once, serves every batch size of an estimate process (python_model.cpp). Between its probes the
  /// module is parked: its blocks are counted as freed (allocator and caching allocator's model, the observer too)
  /// while the tensors live on; the next probe's build is the record replayed (each request and free in its order,
  /// through the model of that probe), which counts what building it anew would.
  ///
  ///   auto record = meta.start_recording();  build();  meta.stop_recording();
  ///   ... probe ...
  ///   if (meta.park(*record)) { /* keep the module */ }   ...   meta.replay(*record);  // the next probe's build
  class BuildRecord;
  /// Records every counted request and free (and count_external) from now until stop_recording.
  [[nodiscard]] std::shared_ptr<BuildRecord> start_recording();
  void stop_recording();
  /// Counts the record's blocks as freed and marks them parked. False, and nothing changed, where the build's state
  /// is gone: one of the blocks it left was freed since, or what it left beside its Meta tensors (CPU bytes counted
  /// with count_external) is not zero.
  [[nodiscard]] bool park(BuildRecord& record);
  /// Counts the build again: its requests and frees in order, its parked blocks taken back.
  void replay(BuildRecord& record);

 private:
  CountingMetaAllocator() = default;
};

}  // namespace memgate
