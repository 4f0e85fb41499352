// FSDP2's fully_shard in C++: parameters, gradients and optimizer state sharded over the ranks, unsharded unit by
// unit around each block's forward and backward with the same c10d collectives.
#pragma once

#include "memgate/distributed/process_group.h"
#include "memgate/distributed/spec.h"
#include "memgate/models/autocast.h"
#include "memgate/models/checkpoint.h"
#include "memgate/models/model.h"

#include <c10/core/Stream.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace memgate {

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
/// CPUOffloadPolicy (`offload_policy: cpu | cpu_pinned`): on CPU ranks and in an estimate for the CPU the device is the
/// host, and FSDP2's copies return the tensors themselves (nothing changes but that bf16 casts each shard on its own).
/// In an estimate for CUDA the padded shards are host memory (HostAllocators: pinned with cpu_pinned); before each
/// all-gather each shard is copied to the device on its own and, under a param_dtype, cast on its own (FSDP2 skips its
/// foreach copy-in for offloaded parameters), each living until the all-gather is issued; each reduce-scattered
/// gradient view is copied back to the host (pinned with cpu_pinned unless it accumulates into the gradient there)
/// and its device output let go; the unsharded parameters and the collective buffers stay on the device. On a GPU it
/// is refused: no GPU has run it against memgate's measurement yet.
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
  /// Where CPUOffloadPolicy (`offload_policy: cpu | cpu_pinned`) keeps the shards in an estimate for CUDA: host memory
  /// outside the device's count (measure/activation_offload.h's EstimatedHostMemory makes and counts it).
  struct HostAllocators {
    /// The padded shards and each reduce-scattered gradient copied back (pinned blocks with cpu_pinned).
    c10::Allocator* shards = nullptr;
    /// A gradient copied back to be added into the one already there (`non_blocking=False`: pageable).
    c10::Allocator* pageable = nullptr;
  };
  /// `precision`: the policy's param_dtype (fp32: no mixed precision). `host`: needed, and only taken, in an estimate
  /// for CUDA whose spec offloads (CPU ranks and an estimate for the CPU keep the shards where they are: the host).
  FullyShard(Model& model, const DistributedSpec& spec, Precision precision, RankGroup group,
             std::optional<HostAllocators> host = std::nullopt);
  ~FullyShard() override;
  FullyShard(const FullyShard&) = delete;
  FullyShard& operator=(const FullyShard&) = delete;

  /// The shards of the parameters that train, in module order: what the optimizer steps.
  [[nodiscard]] std::vector<torch::Tensor> trainable_shards() const;

  /// Whether the shards are host memory apart from the device's (an estimate for CUDA under CPUOffloadPolicy): then
  /// the optimizer steps host tensors, and what it allocates belongs in the host's allocator too.
  [[nodiscard]] bool offloads_to_host() const { return host_.has_value(); }

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
  std::optional<HostAllocators> host_;  ///< offloads_to_host()
};

}  // namespace memgate
