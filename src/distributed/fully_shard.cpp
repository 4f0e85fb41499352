// FSDP2's fully_shard in C++: its memory behaviour, read from torch/distributed/fsdp/_fully_shard of torch 2.11
// (_fsdp_param.py, _fsdp_param_group.py, _fsdp_collectives.py, _fsdp_state.py), over the same c10d collectives.
#include "memgate/distributed/fully_shard.h"

#include "memgate/backend/meta_allocator.h"
#include "memgate/base/error.h"
#include "memgate/base/heartbeat.h"
#include "memgate/estimate/estimate_context.h"
#include "memgate/estimate/meta_kernels.h"
#include "memgate/models/autocast.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <optional>
#include <thread>

namespace memgate {

struct FullyShard::Unit {
  enum class State { kIdle, kForward, kPreBackward, kPostBackward };
  struct Param {
    torch::Tensor full;    ///< the model's parameter: its tensor stays, its storage is the unsharded data or none
    torch::Tensor padded;  ///< this rank's shard, padded to ceil(dim0 / N) rows (FSDPParam._sharded_param_data)
    torch::Tensor shard;   ///< the unpadded rows of `padded`, a leaf: what the optimizer steps (sharded_param)
    std::int64_t padded_numel = 0;  ///< elements of `padded`
    /// After forward with a partial reshard: this rank's part of the padded unsharded data among its post-forward
    /// group (FSDPParam._sharded_post_forward_param_data), all-gathered from that group in backward.
    torch::Tensor post_forward;
  };
  const torch::nn::Module* module = nullptr;  ///< a block's module; null for the root
  bool root = false;
  std::vector<Param> params;
  State state = State::kIdle;
  bool unsharded = false;
  torch::Tensor all_gather;  ///< an all-gather issued and not yet copied out (a prefetch)
  std::int64_t all_gather_ranks = 0;  ///< the ranks `all_gather` was gathered from
  std::vector<std::size_t> post_forward_indices;
  /// ShardedState.SHARDED_POST_FORWARD: unsharded from the `post_forward` parts next. A unit resharded from there to
  /// its shards (FSDPParam.to_sharded: a frozen unit's post-backward, which no pre-backward unsharded) keeps those
  /// parts until its next post-forward replaces them, as FSDP2 does (to_unsharded frees them only in that state).
  bool sharded_post_forward = false;
  [[nodiscard]] bool post_forward_sharded() const { return sharded_post_forward; }
};

namespace {

// FSDP2's free_storage / alloc_storage: the parameter's tensor keeps its identity (the module's forward and the
// autograd graph hold it) while its storage is emptied or refilled through the storage's own allocator.
void free_storage(const torch::Tensor& t) {
  auto* storage = t.storage().unsafeGetStorageImpl();
  if (storage->nbytes() == 0) return;
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  storage->set_nbytes(0);
}

void alloc_storage(const torch::Tensor& t, std::size_t bytes) {
  auto* storage = t.storage().unsafeGetStorageImpl();
  if (storage->nbytes() == bytes) return;
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

// Waits for a collective and then for Gloo's worker thread to let go of it: the work holds its tensors (an
// all-gather's buffer) until the worker drops its reference, which is sometimes after wait() has returned. Freed
// only then, a buffer's lifetime would follow the worker's timing (a 2-rank probe's peaks moved by one block's
// all-gather buffer from run to run); waiting for the last reference makes it the program's. Bounded: a backend
// that keeps its works (a registry) is let be after a second.
// `what`: the collective, as the heartbeat says where a rank waits (base/heartbeat.h).
void wait_and_release(c10::intrusive_ptr<c10d::Work> work, const char* what) {
  {
    const ProgressSection section(what);
    work->wait();
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (work.use_count() > 1 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
}

// Work on one of FSDP2's side streams while it lives. On a GPU the stream is current, having waited for the stream
// that was current (so that it reuses no block of its pool that the other stream may still read), which waits for it
// in turn at the end (the unit's buffers are ready where they are used next): its allocations come from its own pool
// of the caching allocator, as FSDP2's do. In an estimate for CUDA, the Meta requests are made on its id instead.
class OnSideStream {
 public:
  OnSideStream(const std::optional<c10::Stream>& gpu, bool estimate, std::uint64_t estimate_id) {
    if (estimate) estimate_.emplace(estimate_id);
    if (!gpu) return;
    previous_ = c10::impl::getDeviceGuardImpl(gpu->device_type())->getStream(gpu->device());
    wait(*gpu, *previous_);
    guard_.emplace(*gpu);
  }
  ~OnSideStream() {
    if (!guard_) return;
    const auto side = guard_->current_stream();
    guard_.reset();
    wait(*previous_, side);
  }
  OnSideStream(const OnSideStream&) = delete;
  OnSideStream& operator=(const OnSideStream&) = delete;

 private:
  static void wait(const c10::Stream& waiter, const c10::Stream& on) {
    c10::Event event(on.device_type());
    event.record(on);
    event.block(waiter);
  }
  std::optional<CountingMetaAllocator::StreamScope> estimate_;
  std::optional<c10::Stream> previous_;
  std::optional<c10::StreamGuard> guard_;
};

// The identity whose backward runs a unit's post-backward once the gradient of the unit's forward input is
// computed, after its parameters' (FSDP2's RegisterPostBackwardFunction).
struct PostBackwardHolder : torch::CustomClassHolder {
  explicit PostBackwardHolder(std::function<void()> f) : fn(std::move(f)) {}
  std::function<void()> fn;
};

struct PostBackwardFunction : torch::autograd::Function<PostBackwardFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                               c10::intrusive_ptr<PostBackwardHolder> holder) {
    ctx->saved_data["fn"] = c10::IValue::make_capsule(std::move(holder));
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    c10::static_intrusive_pointer_cast<PostBackwardHolder>(ctx->saved_data["fn"].toCapsule())->fn();
    return {grads[0], torch::Tensor()};
  }
};

// A tensor of its own over the parameter's storage (no autograd, its own version counter: a copy into it leaves the
// parameter's alone, as FSDP2's _unsafe_preserve_version_counter does).
torch::Tensor over_storage(const torch::Tensor& param, at::IntArrayRef sizes, at::IntArrayRef strides,
                           std::int64_t offset = 0) {
  auto t = torch::empty({0}, param.options().requires_grad(false));
  t.set_(param.storage(), offset, sizes, strides);
  return t;
}

// _cast_fp_tensor: a floating tensor in another dtype is cast; anything else is left as it is.
torch::Tensor cast_fp(const torch::Tensor& x, std::optional<torch::ScalarType> dtype) {
  if (!dtype || !x.defined() || !x.is_floating_point() || x.scalar_type() == *dtype) return x;
  return x.to(*dtype);
}

// The parameter's tensor made a `dtype` one of the same sizes and strides, with an empty storage of the same
// allocator (the unsharded parameter of FSDP2's param_dtype, which the module then holds).
// (Built directly: Tensor::set_ would allocate the storage its sizes need.)
void set_unsharded_dtype(const torch::Tensor& param, torch::ScalarType dtype) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, param.storage().allocator(), /*resizable=*/true);
  auto data = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::computeDispatchKey(dtype, param.layout(), param.device())),
      caffe2::TypeMeta::fromScalarType(dtype));
  data.unsafeGetTensorImpl()->set_sizes_and_strides(param.sizes(), param.strides());
  param.set_data(data);
}

}  // namespace

FullyShard::FullyShard(Model& model, const DistributedSpec& spec, Precision precision, RankGroup group,
                       std::optional<HostAllocators> host)
    : group_(std::move(group)), spec_(spec) {
  if (precision != Precision::kFp32) param_dtype_ = dtype_of(precision);
  if (group_.world_size != spec.world_size) {
    throw Error(fmt::format("fully_shard over {} ranks in a group of {}", spec.world_size, group_.world_size));
  }
  auto& module = model.module();
  const auto named = module.named_parameters(/*recurse=*/true);
  std::vector<bool> taken(named.size(), false);
  if (spec.units == "blocks") {
    const auto modules = module.named_modules();
    const auto blocks = model.unit_prefixes();
    if (blocks.empty()) {
      throw Error("training.distributed.units: blocks, and this model has no blocks whose forward memgate runs one by "
                  "one (TorchScript's runs whole): expected units: root");
    }
    for (const auto& prefix : blocks) {
      auto unit = std::make_unique<Unit>();
      const auto name = prefix.substr(0, prefix.size() - 1);
      const auto* found = modules.find(name);
      if (found == nullptr) throw Error(fmt::format("fully_shard: the model has no block module '{}'", name));
      unit->module = found->get();
      for (std::size_t i = 0; i < named.size(); ++i) {
        if (!taken[i] && named[i].key().starts_with(prefix)) {
          unit->params.emplace_back().full = named[i].value();
          taken[i] = true;
        }
      }
      units_.push_back(std::move(unit));
    }
  }
  auto root = std::make_unique<Unit>();
  root->root = true;
  for (std::size_t i = 0; i < named.size(); ++i) {
    if (!taken[i]) root->params.emplace_back().full = named[i].value();
  }
  units_.push_back(std::move(root));

  // An integer reshard_after_forward between 1 and N: FSDP2's post-forward mesh, groups of consecutive ranks.
  const auto partial = spec.reshard_group(/*root=*/false);
  if (partial > 1 && partial < group_.world_size) {
    post_forward_group_ = consecutive_subgroup(group_, static_cast<int>(partial));
  }

  // Gloo on the CPU, and an estimate for the CPU; NCCL on GPUs.
  const auto device = units_.back()->params.empty() ? c10::Device(c10::DeviceType::CPU)
                                                    : units_.back()->params.front().full.device();
  gloo_ = device.is_cpu() || (device.is_meta() && estimate_context().target == EstimateTarget::kCpu);
  side_streams_ = device.is_meta() && estimate_context().target == EstimateTarget::kCuda;
  // CPUOffloadPolicy: on CPU ranks (and an estimate for the CPU) the shards are the host's already, FSDP2's
  // `.to(cpu)` and `.to(device)` copies return the tensors themselves, and pin_memory() needs CUDA. In an estimate for
  // CUDA the shards, their gradients and the optimizer's state are host memory (host_): see below.
  if (spec.offload_policy != FsdpOffload::kNone) {
    const auto word = name_of(kFsdpOffloadNames, spec.offload_policy);
    if (side_streams_) {
      if (!host || host->shards == nullptr || host->pageable == nullptr) {
        throw Error(fmt::format("training.distributed.offload_policy: {} in an estimate for CUDA: fully_shard was "
                                "given no host memory to keep the shards in", word));
      }
      host_ = host;
    } else if (!gloo_) {
      throw Error(fmt::format("training.distributed.offload_policy: {} is measured on CPU ranks and estimated for the "
                              "CPU and CUDA only, for now (no GPU has run FSDP2's host copies against memgate's): "
                              "expected none, or --device cpu, or memgate estimate", word));
    } else if (spec.offload_policy == FsdpOffload::kCpuPinned) {
      throw Error("training.distributed.offload_policy: cpu_pinned pins host memory, which needs CUDA (PyTorch's "
                  "pin_memory() raises without it): expected cpu or none on CPU ranks");
    }
  }
  if (device.is_cuda()) {
    // FSDPCommContext.lazy_init: high-priority streams of their own.
    all_gather_stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index()).unwrap();
    reduce_scatter_stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index()).unwrap();
  }

  // FSDPParam._init_sharded_param: torch.chunk's rows of dim 0, this rank's copied into zeros of the first chunk's
  // size; then the full parameter is let go (here: its storage freed), unit by unit as fully_shard goes.
  torch::NoGradGuard no_grad;
  const auto world = static_cast<std::int64_t>(group_.world_size);
  const auto rank = static_cast<std::int64_t>(group_.rank);
  for (auto& unit : units_) {
    for (auto& p : unit->params) {
      if (p.full.dim() == 0) throw Error("fully_shard: a 0-dim parameter cannot be sharded on dim 0");
      const auto rows = p.full.size(0);
      const auto chunk = (rows + world - 1) / world;
      const auto length = std::clamp(rows - rank * chunk, std::int64_t{0}, chunk);
      auto sizes = p.full.sizes().vec();
      sizes[0] = chunk;
      if (host_) {
        // _init_sharded_param under CPUOffloadPolicy: the padded shard made on the device, then `.cpu()` (and
        // `.pin_memory()`): what stays is the host copy (each copy's predecessor freed at once, before any step).
        p.padded = at::detail::empty_generic(sizes, host_->shards, c10::DispatchKeySet(c10::DispatchKey::Meta),
                                             p.full.scalar_type(), std::nullopt);
        p.padded.zero_();
      } else {
        p.padded = torch::zeros(sizes, p.full.options());
      }
      if (length > 0) p.padded.narrow(0, 0, length).copy_(p.full.narrow(0, rank * chunk, length));
      p.shard = p.padded.narrow(0, 0, length).detach().requires_grad_(p.full.requires_grad());
      p.padded_numel = p.padded.numel();
    }
    for (auto& p : unit->params) {
      free_storage(p.full);
      // FSDPParam.init_dtype_attrs: a param_dtype equal to the parameter's is none.
      if (param_dtype_ && p.full.is_floating_point() && p.full.scalar_type() != *param_dtype_) {
        set_unsharded_dtype(p.full, *param_dtype_);
      }
    }
  }
}

FullyShard::~FullyShard() = default;

Batch FullyShard::cast_forward_inputs(const Batch& batch) const {
  Batch out{.inputs = {}, .target = batch.target};
  for (const auto& x : batch.inputs) out.inputs.push_back(cast_fp(x, param_dtype_));
  return out;
}

std::vector<torch::Tensor> FullyShard::trainable_shards() const {
  std::vector<torch::Tensor> out;
  for (const auto& unit : units_) {
    for (const auto& p : unit->params) {
      if (p.shard.requires_grad()) out.push_back(p.shard);
    }
  }
  return out;
}

// FSDPParamGroup.unshard: the shards copied into this rank's slice of one buffer, all-gathered into the rest; after
// a partial reshard, the post-forward parts from the post-forward group instead.
void FullyShard::unshard(Unit& unit) {
  if (unit.all_gather.defined() || unit.unsharded || unit.params.empty()) return;
  torch::NoGradGuard no_grad;
  const RankGroup& group = unit.post_forward_sharded() ? *post_forward_group_ : group_;
  std::vector<std::int64_t> sizes;
  std::vector<torch::Tensor> inputs;
  for (const auto& p : unit.params) {
    inputs.push_back(unit.post_forward_sharded() ? p.post_forward : p.padded.view(-1));
    sizes.push_back(inputs.back().numel());
  }
  const auto numel = std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0});
  // The all-gather's dtype is the unsharded parameters'. Under mixed precision the inputs are first copied (cast)
  // into one flat buffer of it (_get_param_all_gather_inputs' foreach copy), which lives until the all-gather ran.
  const auto dtype = unit.params.front().full.scalar_type();
  const OnSideStream copy_in_stream(all_gather_stream_, side_streams_, kAllGatherCopyInStream);
  torch::Tensor copy_in;
  if (host_ && !unit.post_forward_sharded()) {
    // FSDPParam.all_gather_inputs of an offloaded shard: `_sharded_param_data.to(device, non_blocking=True)`, one
    // device copy per parameter, then cast on its own (_to_dtype_if_needed), the uncast copy let go once the cast is
    // made; each input lives until the all-gather is issued (foreach_all_gather's all_gather_inputs).
    for (auto& in : inputs) {
      auto on_device = torch::empty_like(in, c10::TensorOptions().device(unit.params.front().full.device()));
      on_device.copy_(in);
      in = cast_fp(on_device, dtype);
    }
  } else if (dtype != unit.params.front().padded.scalar_type() && spec_.offload_policy != FsdpOffload::kNone) {
    // Offloaded shards take FSDPParam.all_gather_inputs instead of the foreach copy: each shard brought to the
    // device (on the CPU: itself) and cast on its own, every cast living until the all-gather ran.
    for (auto& input : inputs) input = cast_fp(input, dtype);
  } else if (dtype != unit.params.front().padded.scalar_type()) {
    copy_in = torch::empty({numel}, unit.params.front().padded.options().dtype(dtype));
    auto splits = copy_in.split_with_sizes(sizes);
    at::_foreach_copy_(splits, inputs);
    inputs = std::move(splits);
  }
  auto output = torch::empty({numel * group.world_size}, unit.params.front().padded.options().dtype(dtype));
  auto input = output.narrow(0, numel * group.rank, numel);
  auto slices = input.split_with_sizes(sizes);
  at::_foreach_copy_(slices, inputs);
  wait_and_release(group.group->_allgather_base(output, input), "in a collective: all-gather");
  unit.all_gather = std::move(output);
  unit.all_gather_ranks = group.world_size;
}

// FSDPParamGroup.wait_for_unshard: each parameter's padded unsharded storage allocated and copied out of the
// buffer. In forward the buffer lives until the next unit's copy-out; otherwise it is freed now.
void FullyShard::wait_for_unshard(Unit& unit, bool forward) {
  if (!unit.all_gather.defined()) return;
  torch::NoGradGuard no_grad;
  if (forward) forward_all_gather_ = torch::Tensor();
  const auto world = static_cast<std::int64_t>(group_.world_size);
  const auto ranks = unit.all_gather_ranks;  // N, or the post-forward group's size
  std::vector<std::int64_t> sizes;
  std::vector<torch::Tensor> outs;
  for (const auto& p : unit.params) {
    const auto numel = p.padded_numel * world;
    alloc_storage(p.full, static_cast<std::size_t>(numel) * p.full.element_size());
    outs.push_back(over_storage(p.full, {ranks, numel / ranks}, {numel / ranks, 1}));
    sizes.push_back(numel / ranks);
  }
  at::split_with_sizes_copy_out(outs, unit.all_gather.view({ranks, -1}), sizes, 1);
  unit.unsharded = true;
  // FSDPParam.to_unsharded: the post-forward parts freed after the copy-out, when it was from them.
  if (unit.sharded_post_forward) {
    for (auto& p : unit.params) p.post_forward = torch::Tensor();
    unit.sharded_post_forward = false;
  }
  if (forward) forward_all_gather_ = unit.all_gather;
  unit.all_gather = torch::Tensor();
}

void FullyShard::reshard(Unit& unit) {
  unit.sharded_post_forward = false;  // FSDPParam.to_sharded: the post-forward parts stay where they are
  if (!unit.unsharded) return;
  for (const auto& p : unit.params) free_storage(p.full);
  unit.unsharded = false;
}

// FSDPParam.to_sharded_post_forward, parameter by parameter: this rank's part (1/k among its post-forward group of
// k) of the padded unsharded data cloned, then the unsharded storage freed.
void FullyShard::reshard_to_post_forward_group(Unit& unit) {
  if (!unit.unsharded) return;
  torch::NoGradGuard no_grad;
  const auto k = static_cast<std::int64_t>(post_forward_group_->world_size);
  const auto world = static_cast<std::int64_t>(group_.world_size);
  for (auto& p : unit.params) {
    const auto numel = p.padded_numel * world;
    p.post_forward = over_storage(p.full, {numel / k}, {1}, numel / k * post_forward_group_->rank).clone();
    free_storage(p.full);
  }
  unit.unsharded = false;
  unit.sharded_post_forward = true;
}

void FullyShard::pre_forward(Unit& unit) {
  unit.state = Unit::State::kForward;
  unshard(unit);
  wait_for_unshard(unit, /*forward=*/true);
}

void FullyShard::post_forward(Unit& unit, const torch::Tensor& output) {
  const auto reshard_to = spec_.reshard_group(unit.root);
  if (reshard_to == group_.world_size) reshard(unit);
  else if (reshard_to > 0) reshard_to_post_forward_group(unit);
  unit.post_forward_indices.push_back(post_forward_order_.size());
  post_forward_order_.push_back(&unit);
  unit.state = Unit::State::kIdle;
  if (torch::GradMode::is_enabled() && output.requires_grad()) {
    auto tensor = output;
    tensor.register_hook([this, &unit](const torch::Tensor&) {
      pre_backward(unit);
      return torch::Tensor();
    });
  }
  if (unit.root) forward_all_gather_ = torch::Tensor();
}

// FSDPState._pre_backward: the unit all-gathered again if it was resharded, then the prefetch: the unit before it
// in forward order (FSDP2's default), or the `backward_prefetch` blocks before it (set_modules_to_backward_prefetch;
// the root's are the last blocks).
void FullyShard::pre_backward(Unit& unit) {
  if (unit.state == Unit::State::kPreBackward) return;
  unit.state = Unit::State::kPreBackward;
  unshard(unit);
  wait_for_unshard(unit, /*forward=*/false);
  if (spec_.backward_prefetch <= 1) {
    if (unit.post_forward_indices.empty()) return;
    const auto current = unit.post_forward_indices.back();
    unit.post_forward_indices.pop_back();
    if (current > 0) unshard(*post_forward_order_[current - 1]);
    return;
  }
  const auto blocks = static_cast<std::int64_t>(units_.size()) - 1;
  const auto index = unit.root ? blocks : static_cast<std::int64_t>(
      std::find_if(units_.begin(), units_.end(), [&unit](const auto& u) { return u.get() == &unit; }) - units_.begin());
  for (std::int64_t k = 1; k <= spec_.backward_prefetch && index - k >= 0; ++k) unshard(*units_[index - k]);
}

// FSDPParamGroup.post_backward and foreach_reduce: the unsharded gradients taken from the parameters, the unit
// resharded, the last reduce-scatter input freed, the gradients chunk-cat into one input of the padded unsharded
// size and freed, reduce-scattered (averaged) into the padded shard size, whose views become the shards' gradients.
void FullyShard::post_backward(Unit& unit) {
  unit.state = Unit::State::kPostBackward;
  torch::NoGradGuard no_grad;
  std::vector<Unit::Param*> with_grad;
  std::vector<torch::Tensor> grads;
  for (auto& p : unit.params) {
    if (!p.full.grad().defined()) continue;
    with_grad.push_back(&p);
    grads.push_back(p.full.grad());
    p.full.mutable_grad() = torch::Tensor();
  }
  reshard(unit);
  if (grads.empty()) return;
  reduce_scatter_input_ = torch::Tensor();
  const auto world = static_cast<std::int64_t>(group_.world_size);
  std::int64_t numel = 0;
  for (const auto* p : with_grad) numel += p->padded_numel * world;
  // foreach_reduce: the input in the reduce dtype (the gradients' unless the policy names one), _chunk_cat casting.
  const auto reduce_dtype = spec_.reduce_dtype ? dtype_of(*spec_.reduce_dtype) : grads.front().scalar_type();
  auto input = torch::empty({numel}, grads.front().options().dtype(reduce_dtype));
  auto rows = input.view({world, -1});
  at::_chunk_cat_out(rows, grads, 0, world);
  // foreach_reduce loops over the gradients whenever there are several ranks (to chunk Shard(i > 0) ones) and its
  // loop variable stays on the last: unsharded_grads.clear() frees the others, the unit's last gradient lives until
  // foreach_reduce returns (after the reduce-scatter and the copy into the sharded gradients), here the end of this.
  const auto last_gradient = world > 1 ? grads.back() : torch::Tensor();
  grads.clear();
  // _get_gradient_divide_factors: fp16 risks overflow, so its sum is divided by about sqrt(N) before and the rest
  // after (in place); fp32 and bf16 are averaged by the collective.
  double pre = 1.0, post = 1.0;
  if (reduce_dtype == torch::kHalf && world > 1) {
    const auto factor = static_cast<double>(world);
    while (std::fmod(factor, pre) == 0.0 && factor / pre > pre) pre *= 2.0;
    post = factor / pre;
  }
  if (pre != 1.0) input.div_(pre);
  // The output, its division and its cast back: on the reduce-scatter stream (the sharded gradients live there).
  const OnSideStream reduce_scatter_stream(reduce_scatter_stream_, side_streams_, kReduceScatterStream);
  auto output = torch::empty({numel / world}, input.options());
  // FSDP2's op: fp16 is summed (divided around it above), fp32 and bf16 averaged by the collective.
  const auto op = reduce_dtype == torch::kHalf || world == 1 ? c10d::ReduceOp::SUM : c10d::ReduceOp::AVG;
  if (gloo_) {
    // ProcessGroupGloo::_reduce_scatter_base as it is: the input cloned, the clone all-reduced with the op and this
    // rank's chunk copied out. Gloo averages by dividing the sum by N on its worker thread, while the clone lives:
    // div_ makes a 0-dim int64 of N and its copy in the clone's dtype (12 B for fp32: PyTorch's step_peak where a
    // reduce-scatter is the peak). Gloo frees the clone with its work, on its worker thread when that lets go last;
    // done here, the clone is freed after the copy, every time.
    auto buffer = input.clone();
    std::vector<torch::Tensor> tensors{buffer};
    c10d::AllreduceOptions all_reduce;
    all_reduce.reduceOp = op;
    wait_and_release(group_.group->allreduce(tensors, all_reduce), "in a collective: all-reduce (reduce-scatter)");
    output.copy_(buffer.chunk(world)[group_.rank]);
  } else {
    c10d::ReduceScatterOptions options;
    options.reduceOp = op;
    wait_and_release(group_.group->_reduce_scatter_base(output, input, options),
                     "in a collective: reduce-scatter");
  }
  if (post != 1.0) output.div_(post);
  // Back to the shards' dtype (_to_dtype_if_needed(reduce_output, orig_dtype)): a new output, the reduced one freed.
  if (output.scalar_type() != with_grad.front()->shard.scalar_type()) {
    output = output.to(with_grad.front()->shard.scalar_type());
  }
  std::int64_t offset = 0;
  for (auto* p : with_grad) {
    auto view = output.as_strided(p->shard.sizes(), p->shard.contiguous().strides(), offset);
    if (host_) {
      // Offloaded: the view copied to the host (`.to("cpu", non_blocking=pin_memory and not to_accumulate_grad)`:
      // pinned only where nothing accumulates into it), its device output let go with the last view.
      const bool accumulate = p->shard.grad().defined();
      auto* allocator = accumulate ? host_->pageable : host_->shards;
      const c10::DispatchKeySet meta(c10::DispatchKey::Meta);
      at::Tensor copy = at::detail::empty_strided_generic(p->shard.sizes(), p->shard.contiguous().strides(), allocator,
                                                          meta, view.scalar_type());
      copy.copy_(view);
      view = std::move(copy);
    }
    if (p->shard.grad().defined()) p->shard.mutable_grad().add_(view);
    else p->shard.mutable_grad() = view;
    offset += p->padded_numel;
  }
  reduce_scatter_input_ = std::move(input);
}

void FullyShard::finish_backward() {
  // FSDPState._root_post_backward_final_callback: the states in module order, the root's first.
  post_backward_if_pending(*units_.back());
  for (auto& unit : units_) {
    post_backward_if_pending(*unit);
    unit->state = Unit::State::kIdle;
    unit->post_forward_indices.clear();
    unit->all_gather = torch::Tensor();  // a prefetch no pre-backward used
  }
  post_forward_order_.clear();
  reduce_scatter_input_ = torch::Tensor();
}

void FullyShard::post_backward_if_pending(Unit& unit) {
  if (unit.state != Unit::State::kPostBackward) post_backward(unit);
}

torch::Tensor FullyShard::run(const torch::nn::Module& block, const torch::Tensor& x, const BlockFn& forward) {
  const auto found = std::find_if(units_.begin(), units_.end(), [&block](const auto& u) { return u->module == &block; });
  if (found == units_.end()) return forward(x);
  auto& unit = **found;
  // FSDPState._pre_forward: the inputs cast (cast_forward_inputs), then the unit unsharded.
  auto input = cast_fp(x, param_dtype_);
  pre_forward(unit);
  if (torch::GradMode::is_enabled() && input.requires_grad()) {
    input = PostBackwardFunction::apply(input, c10::make_intrusive<PostBackwardHolder>([this, &unit] {
      post_backward(unit);
    }));
  }
  auto output = forward(input);
  post_forward(unit, output);
  return output;
}

FullyShard::ForwardScope::ForwardScope(FullyShard& fsdp) : fsdp_(fsdp), hook_(&fsdp) {
  fsdp_.pre_forward(*fsdp_.units_.back());
}

FullyShard::ForwardScope::~ForwardScope() {
  if (!finished_) fsdp_.forward_all_gather_ = torch::Tensor();
}

torch::Tensor FullyShard::ForwardScope::finish(torch::Tensor output) {
  fsdp_.post_forward(*fsdp_.units_.back(), output);
  finished_ = true;
  return output;
}

}  // namespace memgate
