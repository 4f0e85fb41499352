// Activation offload as torch.autograd.graph.save_on_cpu does it, for a process whose autograd engine is LibTorch's
// own: an engine that hands out save_on_cpu's pack and unpack while a Scope is open, and the host bytes counted.
#include "memgate/measure/activation_offload.h"

#include "memgate/base/error.h"
#include "memgate/estimate/estimate_context.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/llvmMathExtras.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <fmt/format.h>

#include <atomic>
#include <mutex>
#include <typeinfo>
#include <utility>

namespace memgate {

// The storages of the host copies come from this allocator, each counted from its allocation to its free: the CPU's
// (the counting one where a probe installed it), CUDA's caching host allocator (pinned), or, in an estimate, the Meta
// device's (a CPU target's copy is a CPU allocation: counted there too) or none (a CUDA target's host copy: outside
// the device's count).
enum class HostCopyKind { kCpu, kPinned, kMetaCounted, kMetaHost, kMetaHostPinned };

class HostCopyAllocator final : public c10::Allocator {
 public:
  HostCopyAllocator(ActivationOffloader::State& state, HostCopyKind kind) : state_(state), kind_(kind) {}
  c10::DataPtr allocate(std::size_t n) override;
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  ActivationOffloader::State& state_;
  HostCopyKind kind_;
};

// One host copy's storage: the allocator's own DataPtr, freed (and uncounted) when the storage goes.
struct HostCopy {
  c10::DataPtr data;
  std::shared_ptr<ActivationOffloader::State> state;
  std::int64_t bytes;
};

void free_host_copy(void* ctx);

namespace {

// The bytes a host copy of `n` bytes holds: CUDA's caching host allocator hands out a pinned block rounded up to a
// power of two (CachingHostAllocatorImpl::allocate); pageable memory is the request itself.
std::int64_t host_copy_bytes(std::size_t n, bool pinned) {
  return static_cast<std::int64_t>(pinned && n > 0 ? c10::llvm::PowerOf2Ceil(n) : n);
}

// An empty tensor for _to_copy's result (memory_format=preserve) from `allocator`: `t`'s strides where it is
// non-overlapping and dense, else its suggested memory format.
at::Tensor empty_to_copy(const at::Tensor& t, c10::Allocator* allocator, c10::DispatchKeySet keys) {
  return t.is_non_overlapping_and_dense()
             ? at::detail::empty_strided_generic(t.sizes(), t.strides(), allocator, keys, t.scalar_type())
             : at::detail::empty_generic(t.sizes(), allocator, keys, t.scalar_type(), t.suggest_memory_format());
}

}  // namespace

struct ActivationOffloader::State : std::enable_shared_from_this<State> {
  State(ActivationOffload m, std::string s)
      : mode(m), source(std::move(s)), pageable(*this, HostCopyKind::kCpu), pinned(*this, HostCopyKind::kPinned),
        meta_counted(*this, HostCopyKind::kMetaCounted), meta_host(*this, HostCopyKind::kMetaHost),
        meta_host_pinned(*this, HostCopyKind::kMetaHostPinned) {}

  void add(std::int64_t n) {
    const auto now = live.fetch_add(n) + n;
    auto high = peak.load();
    while (now > high && !peak.compare_exchange_weak(high, now)) {
    }
  }

  // save_on_cpu's pack_to_cpu, in torch 2.11 (torch/autograd/graph.py).
  at::Tensor pack(const at::Tensor& t) {
    if (t.layout() != at::kStrided) {
      throw Error(fmt::format("{}: training.activation_offload: a {} tensor saved for backward; expected strided "
                              "tensors only (memgate does not offload sparse ones)", source,
                              c10::str(t.layout())));
    }
    if (t.is_meta()) return pack_estimated(t);
    const c10::DispatchKeySet cpu(c10::DispatchKey::CPU);
    if (mode == ActivationOffload::kCpu) {
      // `tensor.cpu()`: the tensor itself on the CPU; else _to_copy's result (memory_format=preserve): its strides
      // where it is non-overlapping and dense, else its suggested memory format.
      if (t.device().is_cpu()) return t;
      at::Tensor out = empty_to_copy(t, &pageable, cpu);
      out.copy_(t);
      return out;
    }
    // torch.empty(size, dtype, layout, pin_memory=torch.cuda.is_available() and not sparse), then copy_.
    at::Tensor out = at::detail::empty_generic(t.sizes(), at::hasCUDA() ? &pinned : &pageable, cpu, t.scalar_type(),
                                               std::nullopt);
    out.copy_(t);
    return out;
  }

  // The same on the Meta device, as the estimate's target runs it: for the CPU, `cpu` keeps the tensor and
  // `cpu_pinned` copies it (no CUDA there) as a CPU allocation; for CUDA, the host copy is outside the device's count.
  at::Tensor pack_estimated(const at::Tensor& t) {
    const c10::DispatchKeySet meta(c10::DispatchKey::Meta);
    const bool for_cuda = estimate_context().target == EstimateTarget::kCuda;
    if (!for_cuda && mode == ActivationOffload::kCpu) return t;
    at::Tensor out;
    if (for_cuda && mode == ActivationOffload::kCpu) {
      out = empty_to_copy(t, &meta_host, meta);
    } else {
      out = at::detail::empty_generic(t.sizes(), for_cuda ? &meta_host_pinned : &meta_counted, meta, t.scalar_type(),
                                      std::nullopt);
    }
    // The CPU's copy_ of a transposed matrix into a contiguous one of at least 60 x 60 elements goes through a block
    // of BLOCK_SZ x BLOCK_SZ (60; 120 for bytes) that it frees before it returns (ATen's copy_same_type_transpose_,
    // where copy_transpose_valid): the same block, allocated and freed, on the Meta device.
    if (!for_cuda && t.dim() == 2 && t.numel() != 0 && t.stride(0) == 1 && t.stride(1) == t.size(0) &&
        out.numel() >= 60 * 60 && t.is_neg() == out.is_neg() && t.is_conj() == out.is_conj()) {
      const std::int64_t block = t.scalar_type() == at::kByte ? 120 : 60;
      (void)at::empty({block, block}, t.options());
    }
    out.copy_(t);
    return out;
  }

  // unpack_from_cpu on the Meta device: for the CPU the copy itself; for CUDA a copy on the device (`.to(cuda)`:
  // _to_copy's, with the host copy's strides where it is dense).
  static at::Tensor unpack_estimated(const at::Tensor& packed) {
    if (estimate_context().target != EstimateTarget::kCuda) return packed;
    auto out = packed.is_non_overlapping_and_dense()
                   ? at::empty_strided(packed.sizes(), packed.strides(), packed.options())
                   : at::empty(packed.sizes(), packed.options().memory_format(packed.suggest_memory_format()));
    out.copy_(packed);
    return out;
  }

  // A copy Python's save_on_cpu packed: its storage's DataPtr wrapped, so that its bytes are counted until its free
  // (none where it packed the tensor itself: tensor.cpu() of a CPU tensor).
  void count_packed(const at::Tensor& saved, const at::Tensor& packed) {
    if (!packed.defined() || !packed.has_storage() || packed.storage().is_alias_of(saved.storage())) return;
    auto* storage = packed.storage().unsafeGetStorageImpl();
    const auto n = storage->nbytes();
    const auto bytes = host_copy_bytes(n, mode == ActivationOffload::kCpuPinned && at::hasCUDA());
    void* ptr = storage->mutable_data_ptr().get();
    const auto device = storage->data_ptr().device();
    auto* copy = new HostCopy{c10::DataPtr(), shared_from_this(), bytes};
    copy->data = storage->set_data_ptr(c10::DataPtr(ptr, copy, &free_host_copy, device));
    add(bytes);
  }

  ActivationOffload mode;
  std::string source;
  const PythonRuntime* python = nullptr;  // where Python's engine owns the hooks: its save_on_cpu
  std::atomic<std::int64_t> live{0};
  std::atomic<std::int64_t> peak{0};
  HostCopyAllocator pageable;
  HostCopyAllocator pinned;
  HostCopyAllocator meta_counted;
  HostCopyAllocator meta_host;
  HostCopyAllocator meta_host_pinned;
};

void free_host_copy(void* ctx) {
  auto* copy = static_cast<HostCopy*>(ctx);
  copy->state->live.fetch_sub(copy->bytes);
  delete copy;
}

namespace {

thread_local ActivationOffloader::State* t_active = nullptr;

// save_on_cpu's pair of hooks for one saved tensor: the packed copy and the device to bring it back to.
class OffloadHooks final : public torch::autograd::SavedVariableHooks {
 public:
  explicit OffloadHooks(std::shared_ptr<ActivationOffloader::State> state) : state_(std::move(state)) {}
  void call_pack_hook(const at::Tensor& tensor) override {
    device_ = tensor.device();
    packed_ = state_->pack(tensor);
  }
  // unpack_from_cpu: `tensor.to(device, non_blocking=pin_memory)`.
  at::Tensor call_unpack_hook() override {
    if (packed_.is_meta()) return ActivationOffloader::State::unpack_estimated(packed_);
    return packed_.to(at::TensorOptions().device(device_), state_->mode == ActivationOffload::kCpuPinned);
  }

 private:
  std::shared_ptr<ActivationOffloader::State> state_;
  c10::Device device_ = c10::kCPU;
  at::Tensor packed_;
};

// LibTorch's engine, with save_on_cpu's hooks for what is saved on a thread inside a Scope (and none elsewhere, as
// LibTorch's own engine has none).
class OffloadEngine final : public torch::autograd::Engine {
 public:
  OffloadEngine() = default;
  ~OffloadEngine() override { stop(); }
  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    if (t_active == nullptr) return nullptr;
    return std::make_unique<OffloadHooks>(t_active->shared_from_this());
  }
};

torch::autograd::Engine& offload_engine() {
  static OffloadEngine engine;
  return engine;
}

void install_offload_engine(const std::string& source) {
  static std::mutex mutex;
  const std::lock_guard lock(mutex);
  auto& current = torch::autograd::Engine::get_default_engine();
  if (&current == &offload_engine()) return;
  if (typeid(current) != typeid(torch::autograd::Engine)) {
    throw Error(fmt::format("{}: training.activation_offload: this process's autograd engine is not LibTorch's own "
                            "(Python's, where torch was imported); expected a memgate process without Python",
                            source));
  }
  torch::autograd::set_default_engine_stub(&offload_engine);
}

}  // namespace

c10::DataPtr HostCopyAllocator::allocate(std::size_t n) {
  c10::DataPtr data;
  switch (kind_) {
    case HostCopyKind::kCpu: data = c10::GetCPUAllocator()->allocate(n); break;
    case HostCopyKind::kPinned: data = at::getHostAllocator(at::kCUDA)->allocate(n); break;
    case HostCopyKind::kMetaCounted: data = c10::GetAllocator(c10::DeviceType::Meta)->allocate(n); break;
    default: data = c10::DataPtr(nullptr, c10::Device(c10::DeviceType::Meta)); break;  // host memory: no device count
  }
  const auto bytes = host_copy_bytes(n, kind_ == HostCopyKind::kPinned || kind_ == HostCopyKind::kMetaHostPinned);
  void* ptr = data.get();
  const auto device = data.device();
  auto* copy = new HostCopy{std::move(data), state_.shared_from_this(), bytes};
  state_.add(bytes);
  return {ptr, copy, &free_host_copy, device};
}

ActivationOffloader::ActivationOffloader(ActivationOffload mode, std::string source, const PythonRuntime* python)
    : state_(std::make_shared<State>(mode, std::move(source))) {
  if (mode == ActivationOffload::kNone) {
    throw Error(state_->source + ": training.activation_offload: none offloads nothing");
  }
  if (python != nullptr && python->save_on_cpu &&
      typeid(torch::autograd::Engine::get_default_engine()) != typeid(torch::autograd::Engine)) {
    state_->python = python;  // Python's engine: PyTorch's own save_on_cpu around the forward
    return;
  }
  install_offload_engine(state_->source);
}

ActivationOffloader::~ActivationOffloader() = default;

ActivationOffloader::Scope::Scope(const ActivationOffloader& offloader) : previous_(t_active) {
  auto state = offloader.state_;
  if (state->python != nullptr) {
    exit_python_ = state->python->save_on_cpu(
        state->mode == ActivationOffload::kCpuPinned,
        [state](const at::Tensor& saved, const at::Tensor& packed) { state->count_packed(saved, packed); });
    return;
  }
  t_active = state.get();
}

ActivationOffloader::Scope::~Scope() {
  if (exit_python_) {
    exit_python_();
    return;
  }
  t_active = previous_;
}

void ActivationOffloader::reset_peak() { state_->peak.store(state_->live.load()); }
std::int64_t ActivationOffloader::peak_bytes() const { return state_->peak.load(); }
std::int64_t ActivationOffloader::live_bytes() const { return state_->live.load(); }
ActivationOffload ActivationOffloader::mode() const { return state_->mode; }

// The same State as activation offload's (its allocators and count), with no hooks installed: only its Meta host
// allocators are used.
EstimatedHostMemory::EstimatedHostMemory(bool pinned)
    : state_(std::make_shared<ActivationOffloader::State>(
          pinned ? ActivationOffload::kCpuPinned : ActivationOffload::kCpu, std::string())),
      pinned_(pinned) {}

EstimatedHostMemory::~EstimatedHostMemory() = default;

c10::Allocator* EstimatedHostMemory::allocator() const {
  return pinned_ ? &state_->meta_host_pinned : &state_->meta_host;
}
c10::Allocator* EstimatedHostMemory::pageable() const { return &state_->meta_host; }

// The Meta device's allocator swapped for the host's while the scope lives, at the counting Meta allocator's own
// priority (backend/meta_allocator.cpp installs it at 100), and put back after.
EstimatedHostMemory::Scope::Scope(const EstimatedHostMemory& host)
    : previous_(c10::GetAllocator(c10::DeviceType::Meta)) {
  c10::SetAllocator(c10::DeviceType::Meta, host.pageable(), /*priority=*/100);
}
EstimatedHostMemory::Scope::~Scope() { c10::SetAllocator(c10::DeviceType::Meta, previous_, /*priority=*/100); }

void EstimatedHostMemory::reset_peak() { state_->peak.store(state_->live.load()); }
std::int64_t EstimatedHostMemory::peak_bytes() const { return state_->peak.load(); }
std::int64_t EstimatedHostMemory::live_bytes() const { return state_->live.load(); }

}  // namespace memgate
