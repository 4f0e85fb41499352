// Activation offload (`training.activation_offload`): what a training forward saves for backward is packed into
// host memory and brought back in backward, as PyTorch's torch.autograd.graph.save_on_cpu does around the forward,
// and the host bytes it holds are counted (the component `host_activations`).
#pragma once

#include "memgate/measure/training.h"
#include "memgate/models/python.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace c10 {
struct Allocator;
}

namespace memgate {

/// One training step's offload: its mode and the bytes its host copies hold.
///
/// LibTorch asks the default autograd engine for the hooks of every tensor saved for backward
/// (SavedVariable::get_default_hooks, where at::SavedTensorDefaultHooks::is_enabled()). In a process without Python
/// that engine is LibTorch's own, which has none; the first ActivationOffloader makes the default engine one whose
/// hooks are save_on_cpu's while a Scope is open on the calling thread, and none otherwise (LibTorch's behaviour).
/// Where Python's engine is the default (a Python fixture's process), the forward runs inside PyTorch's own
/// save_on_cpu instead (`python`'s PythonRuntime::save_on_cpu), each packed copy counted; without it, construction
/// throws memgate::Error.
///
/// What a hook packs, as save_on_cpu(pin_memory) does in torch 2.11:
/// - kCpu: `tensor.cpu()`: the tensor itself on the CPU (no copy, no host bytes); from another device a copy with
///   its strides where it is dense (as `_to_copy` makes it), through the CPU allocator.
/// - kCpuPinned: `torch.empty(size, dtype, layout, pin_memory=cuda available)` and `copy_`: a contiguous copy, in
///   pinned memory from CUDA's caching host allocator (a block rounded up to a power of two, as it rounds) where CUDA
///   is available, else through the CPU allocator.
/// - On the Meta device (an estimate), as the estimate's target would: for the CPU as there (a copy counted on the
///   Meta device); for CUDA, a host copy outside the device's count.
/// Unpacking is `packed.to(device, non_blocking=pin_memory)`: on the CPU the copy itself, on a GPU a copy there.
/// The host bytes are what the copies' storages hold, counted from their allocation to their free: on the CPU device
/// they are CPU allocations and so in the probe's other components too; on a GPU they are outside the device's.
class ActivationOffloader {
 public:
  /// The mode, the host bytes and the allocators of the copies (activation_offload.cpp).
  struct State;
  /// `source` names the fixture in errors; `python`, where given, is the process's Python runtime.
  ActivationOffloader(ActivationOffload mode, std::string source, const PythonRuntime* python = nullptr);
  ~ActivationOffloader();
  ActivationOffloader(const ActivationOffloader&) = delete;
  ActivationOffloader& operator=(const ActivationOffloader&) = delete;

  /// While alive, on this thread, every tensor autograd saves is packed into host memory.
  class Scope {
   public:
    explicit Scope(const ActivationOffloader& offloader);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    State* previous_;
    std::function<void()> exit_python_;  ///< leaves Python's save_on_cpu, where it was entered
  };

  /// The peak of the host bytes from now on starts at what they hold now.
  void reset_peak();
  /// The most host bytes the copies held at once since reset_peak.
  [[nodiscard]] std::int64_t peak_bytes() const;
  /// What they hold now.
  [[nodiscard]] std::int64_t live_bytes() const;
  [[nodiscard]] ActivationOffload mode() const;

 private:
  std::shared_ptr<State> state_;
};

/// Host memory in an estimate for CUDA that is not activation offload's: FSDP2's CPUOffloadPolicy keeps the sharded
/// parameters, their gradients and the optimizer's state on the host. Meta tensors whose storage comes from
/// allocator() or pageable() are outside the device's count and counted here, from allocation to free, with the
/// same allocators and rounding as activation offload's host copies in an estimate for CUDA (pinned: a block rounded
/// up to a power of two, as CUDA's caching host allocator rounds it; pageable: the request).
///
///   EstimatedHostMemory host(/*pinned=*/true);
///   auto shard = at::detail::empty_generic({1000}, host.allocator(), meta_keys, at::kFloat, std::nullopt);  // 4096
class EstimatedHostMemory {
 public:
  explicit EstimatedHostMemory(bool pinned);
  ~EstimatedHostMemory();
  EstimatedHostMemory(const EstimatedHostMemory&) = delete;
  EstimatedHostMemory& operator=(const EstimatedHostMemory&) = delete;

  /// Pinned where constructed so, else pageable.
  [[nodiscard]] c10::Allocator* allocator() const;
  /// Pageable host memory, whatever the construction said (torch.optim's state of host parameters, a copy made
  /// with non_blocking=False).
  [[nodiscard]] c10::Allocator* pageable() const;
  [[nodiscard]] bool pinned() const { return pinned_; }

  /// While alive, the Meta tensors this process allocates (an estimate's ranks run one at a time, on one thread)
  /// are pageable host memory of `host`: what torch.optim allocates stepping host parameters. Scopes nest.
  class Scope {
   public:
    explicit Scope(const EstimatedHostMemory& host);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    c10::Allocator* previous_;
  };

  /// The peak from now on starts at what is held now.
  void reset_peak();
  [[nodiscard]] std::int64_t peak_bytes() const;
  [[nodiscard]] std::int64_t live_bytes() const;

 private:
  std::shared_ptr<ActivationOffloader::State> state_;
  bool pinned_;
};

}  // namespace memgate
