// Training over several ranks, one process each (a fixture's `training.distributed`): the c10d process group a rank
// joins, DistributedDataParallel as PyTorch drives LibTorch's c10d::Reducer, and the distributed probe that starts
// the ranks and gathers what each measured.
#pragma once

#include "memgate/base/components.h"
#include "memgate/measure/training.h"
#include "memgate/models/checkpoint.h"
#include "memgate/models/model.h"

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/nn/module.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace c10d {
class Reducer;
}  // namespace c10d

namespace memgate {

/// This process's place among the ranks of a distributed run.
struct RankGroup {
  int rank = 0;
  int world_size = 1;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  c10::intrusive_ptr<c10d::Store> store;  ///< where the ranks met (none on the Meta device)
  std::chrono::milliseconds timeout{0};
  /// Where its collectives run: the CPU (Gloo), or this rank's GPU (NCCL, join_nccl_group).
  c10::Device device{c10::DeviceType::CPU};
};

/// Joins the `world_size` ranks that meet through the c10d::FileStore at `store_path`, over LibTorch's own
/// ProcessGroupGloo (the backend PyTorch uses on CPUs) as the group's CPU backend. Blocks until every rank has
/// joined; a rank missing after `timeout` is an error, and so is a collective that waits longer.
[[nodiscard]] RankGroup join_gloo_group(const std::string& store_path, int rank, int world_size,
                                        std::chrono::seconds timeout);

/// Gives `group` LibTorch's ProcessGroupGloo as its CPU backend, with one worker thread (let_gloo_go).
void add_gloo_backend(c10d::ProcessGroup& group, const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                      std::chrono::milliseconds timeout);

/// Joins the `world_size` ranks that meet through the c10d::FileStore at `store_path` on this rank's GPU `device`
/// (cuda:N, made the current device first, so that nothing of this process lands on another GPU), as
/// torch.distributed.init_process_group("cpu:gloo,cuda:nccl", device_id=device) does: LibTorch's ProcessGroupNCCL
/// for CUDA tensors, bound to the device and connected now (its NCCL communicator created before anything is
/// measured), Gloo for CPU ones. What the communicator takes on the device outside the caching allocator (NCCL's
/// buffers, its stream, its kernels) is added to communicator_bytes(). Throws memgate::Error where memgate was built
/// without NCCL, or where LibTorch's NCCL is of another version than the nccl.h memgate was compiled against.
[[nodiscard]] RankGroup join_nccl_group(const std::string& store_path, int rank, int world_size, c10::Device device,
                                        std::chrono::seconds timeout);

/// Whether this memgate was built with NCCL (a CUDA LibTorch and NCCL's headers), so that ranks can train on GPUs.
[[nodiscard]] bool nccl_available();

/// Empty where LibTorch's ProcessGroupNCCL is laid out as memgate's headers say (the NCCL version LibTorch runs is
/// the one memgate was compiled against, and ProcessGroupNCCL::Options built by LibTorch read back as expected);
/// else what differs. join_nccl_group refuses to start a rank otherwise. Needs no GPU.
[[nodiscard]] std::string nccl_layout_problem();

/// The bytes this process's NCCL communicators took on its GPU outside the caching allocator, measured as each
/// connected (cudaMemGetInfo's used bytes across the connection, less what the caching allocator reserved
/// meanwhile); 0 without NCCL groups.
[[nodiscard]] std::int64_t communicator_bytes();

/// Shuts the NCCL backend of a GPU rank's group down (its communicators destroyed), as destroy_process_group does;
/// nothing for a CPU or Meta group.
void shut_down_nccl(const RankGroup& group);

/// Rank `rank` of `world_size` on the Meta device (an estimate): a process group of no other process, whose
/// collectives (all-reduce, broadcast) are done as they are issued, their outputs in place with their shapes.
[[nodiscard]] RankGroup meta_process_group(int rank, int world_size);

/// Returns once the group's backend has let go of every collective issued before (and so of the tensors they
/// held): a barrier behind them on Gloo's one worker thread. Nothing to wait for on the Meta device.
void let_gloo_go(const RankGroup& group);

/// The group of the `size` consecutive ranks of `group` that hold this rank (ranks [k*size, (k+1)*size)): a
/// ProcessGroupGloo of their own over a prefix of the store (each rank builds only its own), or on the Meta device
/// another Meta group. `size` divides the world size.
[[nodiscard]] RankGroup consecutive_subgroup(const RankGroup& group, int size);

/// consecutive_subgroup on GPUs: the ranks [first, first + size) of a GPU rank's `group`, over a ProcessGroupNCCL of
/// their own (a communicator of its own, connected now and counted in communicator_bytes()).
[[nodiscard]] RankGroup nccl_subgroup(const RankGroup& group, int first, int size);

/// Says that this program's main() runs a rank when started with --memgate-rank (gate/rank.h's is_rank_command
/// calls it): distributed probes then start their ranks from this program, with its registered architectures.
void declare_rank_host();

/// One rank's components in a distributed probe.
struct RankComponents {
  int rank = 0;
  Components components;
  /// What the strategy's communication keeps between steps, inside the allocator: DDP's gradient buckets.
  std::int64_t comm_buffer_bytes = 0;
  /// How many buffers those are (DDP: buckets after the first iteration's rebuild).
  std::int64_t comm_buffers = 0;
  /// On a GPU (0 on the CPU): what the rank's NCCL communicators take outside the caching allocator
  /// (communicator_bytes()), and all the device holds outside it after the measured step (CUDA context, kernels,
  /// libraries, the communicators; MemoryBackend::outside_allocator_bytes), and the cuBLAS workspaces made before
  /// the probe's base (ProbeResult::library_workspace_bytes).
  std::int64_t communicator_bytes = 0;
  std::int64_t outside_allocator_bytes = 0;
  std::int64_t library_workspace_bytes = 0;
  friend bool operator==(const RankComponents&, const RankComponents&) = default;
};

/// Rank `rank` among `ranks`, or nullptr.
[[nodiscard]] const RankComponents* find_rank(const std::vector<RankComponents>& ranks, int rank);

/// The largest value of each component over `ranks`: what a distributed probe's `components` hold.
[[nodiscard]] Components max_over_ranks(const std::vector<RankComponents>& ranks);

/// torch.nn.parallel.DistributedDataParallel over a module, in C++: what its constructor and forward do, with the
/// same c10d calls. The constructor checks the parameters' shapes across ranks and broadcasts parameters and buffers
/// from rank 0 (each in place, where DDP coalesces them into 250 MiB buffers: see broadcast_in_place in
/// distributed.cpp), then builds LibTorch's c10d::Reducer over the
/// parameters that train with the bucket assignment DDP passes it (compute_bucket_assignment_by_size: one bucket for
/// the first iteration, since no unused parameters are searched for; reversed), `bucket_cap_mb` and its first-bucket
/// cap, and `gradient_as_bucket_view`. The Reducer hooks each parameter's gradient accumulator, copies gradients
/// into its buckets, all-reduces each full bucket over the group and averages; after the first backward it rebuilds
/// its buckets in the order gradients arrived, at the next forward.
class DataParallel {
 public:
  DataParallel(torch::nn::Module& module, std::vector<torch::Tensor> trainable, const DistributedSpec& spec,
               RankGroup group);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  /// DistributedDataParallel._pre_forward: with gradients enabled and `sync` (not inside no_sync()),
  /// prepare_for_forward; with gradients enabled, rebuild the buckets once (before the forward's peak, as DDP
  /// does); broadcast the module's buffers from rank 0 while parameters are in sync.
  void pre_forward(bool sync);
  /// DistributedDataParallel._post_forward: with gradients enabled and `sync`, prepare_for_backward (no unused
  /// parameters are searched for).
  void post_forward(bool sync);
  /// Bytes of the Reducer's buckets (each bucket's flat gradient tensor) and how many there are.
  [[nodiscard]] std::int64_t bucket_bytes() const;
  [[nodiscard]] std::int64_t bucket_count() const;

 private:
  void rebuild_buckets_on_meta();

  torch::nn::Module& module_;
  RankGroup group_;
  std::vector<torch::Tensor> params_;
  DistributedSpec spec_;
  std::unique_ptr<c10d::Reducer> reducer_;
  bool require_forward_param_sync_ = true;
  /// On the Meta device: the order in which the first backward's gradients arrived (parameter indices), recorded
  /// by hooks on the parameters until the buckets are rebuilt from it.
  struct ArrivalLog {
    bool recording = true;
    std::vector<std::int64_t> order;
  };
  std::shared_ptr<ArrivalLog> arrival_;
};

/// FSDP2's fully_shard over a model, in C++: what torch/distributed/fsdp/_fully_shard does to memory, with the same
/// c10d collectives (FSDP2 is Python only). Each unit (each block, then the root with the rest; or the root alone)
/// keeps, per parameter, a dim-0 shard padded to ceil(dim0 / N) rows, equal on every rank (a rank past the last row
/// holds an empty view of its padding); the model's full parameters keep their tensors but no storage.
///
/// Forward: a unit's pre-forward copies its shards into its rank's slice of one all-gather buffer of N x the unit's
/// padded shards, all-gathers (`_allgather_base`), and copies each parameter out into its own padded unsharded
/// storage; the buffer is freed at the next unit's copy-out (the last one at the root's post-forward). A unit's
/// post-forward frees its unsharded parameters when `reshard_after_forward` says so (unset: the blocks', not the
/// root's) and hooks its outputs.
/// Backward: the hook all-gathers the unit again if it was resharded and prefetches the next `backward_prefetch`
/// units in reverse forward order (their all-gather buffers wait for their own pre-backward's copy-out). A unit's
/// post-backward (when the gradient of its forward input is computed; the root's at the end of backward) frees its
/// unsharded parameters, copies their gradients into one reduce-scatter input of the unsharded padded size
/// (`_chunk_cat`), frees them, reduce-scatters into an output of the padded shard size whose views are the sharded
/// gradients (added to them under gradient accumulation), and keeps the input until the next unit's reduce-scatter.
/// The optimizer steps the shards. Installed as the thread's BlockHook while a forward runs (ForwardScope).
///
/// Mixed precision is FSDP2's MixedPrecisionPolicy(param_dtype=<precision>, reduce_dtype=spec.reduce_dtype) in
/// place of autocast: the shards (and so the optimizer) stay in their dtype; a unit's shards are cast into one
/// copy-in buffer of the param dtype before the all-gather, which gathers and unshards in that dtype; each unit's
/// floating forward inputs are cast to it; gradients come in it, are reduce-scattered in the reduce dtype (unset:
/// theirs) and cast back to the shards' dtype.
///
/// Streams: FSDP2 allocates a unit's copy-in and all-gather buffers on its all-gather copy-in stream, and the
/// reduce-scatter's output (and its cast back) on its reduce-scatter stream; everything else (the unsharded
/// parameters, the reduce-scatter input) on the current one. A GPU's caching allocator keeps a pool per stream, so
/// those buffers never reuse the default stream's free blocks nor it theirs. An estimate for CUDA makes those
/// requests on the streams below (CountingMetaAllocator::StreamScope), and its model of the allocator keeps the pools
/// apart; the CPU has one. On a GPU the same buffers are allocated on two streams of CUDA's pool.
class FullyShard final : public BlockHook {
 public:
  /// The estimate's stand-ins for FSDP2's all_gather_copy_in_stream and reduce_scatter_stream (0 is the default).
  static constexpr std::uint64_t kAllGatherCopyInStream = 1;
  static constexpr std::uint64_t kReduceScatterStream = 2;
  /// `precision`: the policy's param_dtype (fp32: no mixed precision).
  FullyShard(Model& model, const DistributedSpec& spec, Precision precision, RankGroup group);
  ~FullyShard() override;
  FullyShard(const FullyShard&) = delete;
  FullyShard& operator=(const FullyShard&) = delete;

  /// The shards of the parameters that train, in module order: what the optimizer steps.
  [[nodiscard]] std::vector<torch::Tensor> trainable_shards() const;

  /// The root's forward inputs as its pre-forward casts them (cast_forward_inputs): floating tensors to the param
  /// dtype, the rest as they are. The target is not an input of the module and stays.
  [[nodiscard]] Batch cast_forward_inputs(const Batch& batch) const;

  /// The model's forward, wrapped as the root's: its pre-forward before, the blocks' hooks during, its post-forward
  /// after (hooking `output`, the loss: the root's backward starts at it).
  class ForwardScope {
   public:
    explicit ForwardScope(FullyShard& fsdp);
    ~ForwardScope();
    ForwardScope(const ForwardScope&) = delete;
    ForwardScope& operator=(const ForwardScope&) = delete;
    /// The root's post-forward on the forward's output; returns it.
    torch::Tensor finish(torch::Tensor output);

   private:
    FullyShard& fsdp_;
    BlockHookScope hook_;
    bool finished_ = false;
  };

  /// The root's post-backward callback: the post-backward of every unit whose forward input took no gradient (the
  /// root's), then the last reduce-scatter input freed. Call after backward returns.
  void finish_backward();

  torch::Tensor run(const torch::nn::Module& block, const torch::Tensor& x, const BlockFn& forward) override;

  struct Unit;

 private:
  void pre_forward(Unit& unit);
  void post_forward(Unit& unit, const torch::Tensor& output);
  void pre_backward(Unit& unit);
  void post_backward(Unit& unit);
  void post_backward_if_pending(Unit& unit);
  void unshard(Unit& unit);
  void wait_for_unshard(Unit& unit, bool forward);
  void reshard(Unit& unit);
  void reshard_to_post_forward_group(Unit& unit);

  RankGroup group_;
  DistributedSpec spec_;
  std::optional<torch::ScalarType> param_dtype_;  ///< MixedPrecisionPolicy.param_dtype; unset: none
  bool gloo_ = true;  ///< collectives as ProcessGroupGloo runs them (the CPU), else as NCCL does
  bool side_streams_ = false;  ///< an estimate for CUDA: its buffers on FSDP2's streams (above)
  /// On a GPU: FSDP2's all-gather copy-in and reduce-scatter streams, from CUDA's pool; their buffers are allocated on
  /// them, in pools of their own.
  std::optional<c10::Stream> all_gather_stream_;
  std::optional<c10::Stream> reduce_scatter_stream_;
  /// The group a unit reshards to after forward when that is a part of the ranks (an integer
  /// reshard_after_forward: FSDP2's post-forward mesh), and all-gathers from in the backward that follows.
  std::optional<RankGroup> post_forward_group_;
  std::vector<std::unique_ptr<Unit>> units_;  ///< the blocks in order, then the root
  /// The last forward all-gather buffer, freed at the next forward copy-out (FSDP2's comm_ctx.all_gather_state).
  torch::Tensor forward_all_gather_;
  /// The last reduce-scatter input, freed at the next reduce-scatter (FSDP2's comm_ctx.reduce_scatter_state).
  torch::Tensor reduce_scatter_input_;
  std::vector<Unit*> post_forward_order_;
};

}  // namespace memgate
