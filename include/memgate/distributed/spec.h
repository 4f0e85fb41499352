// A fixture's `training.distributed` block: the strategy (DDP or FSDP), the world size and each strategy's settings.
#pragma once

#include "memgate/base/enum_names.h"
#include "memgate/models/autocast.h"

#include <cstdint>
#include <optional>
#include <string>

namespace memgate {

/// How training is spread over ranks (one process each, on its own GPU or on the CPU).
enum class DistributedStrategy {
  kNone,  ///< one device
  kDdp,   ///< torch.nn.parallel.DistributedDataParallel: a full replica per rank, gradients all-reduced in buckets
  kFsdp,  ///< FSDP2's fully_shard: parameters, gradients and optimizer state sharded over the ranks
};

/// The words of DistributedStrategy (`none` is not written in fixtures: no `distributed` block).
inline constexpr EnumNames<DistributedStrategy, 3> kDistributedStrategyNames{
    {{DistributedStrategy::kNone, "none"}, {DistributedStrategy::kDdp, "ddp"}, {DistributedStrategy::kFsdp, "fsdp"}}};

/// fsdp: FSDP2's offload_policy. `cpu` and `cpu_pinned` are CPUOffloadPolicy(pin_memory=False | True): the sharded
/// parameters, their gradients and the optimizer state live in host memory, each unit's shards copied to the device
/// for its all-gather and its reduced gradients copied back (on CPU ranks those copies are no-ops: the shards are the
/// CPU's already; pinning needs CUDA, so `cpu_pinned` runs on GPUs only).
enum class FsdpOffload {
  kNone,       ///< none: OffloadPolicy(), everything on the rank's device
  kCpu,        ///< cpu: CPUOffloadPolicy(pin_memory=False)
  kCpuPinned,  ///< cpu_pinned: CPUOffloadPolicy(pin_memory=True), FSDP2's default for the class
};
inline constexpr EnumNames<FsdpOffload, 3> kFsdpOffloadNames{
    {{FsdpOffload::kNone, "none"}, {FsdpOffload::kCpu, "cpu"}, {FsdpOffload::kCpuPinned, "cpu_pinned"}}};

/// A fixture's `training.distributed` block (DESIGN.md); the defaults are PyTorch's.
struct DistributedSpec {
  DistributedStrategy strategy = DistributedStrategy::kNone;
  std::int64_t world_size = 1;  ///< ranks, one process each
  /// ddp: DistributedDataParallel's bucket_cap_mb. Unset is PyTorch's default (bucket_cap_mb=None): 25 MiB buckets
  /// after a first bucket of 1 MiB (dist._DEFAULT_FIRST_BUCKET_BYTES); a value given caps the first bucket too.
  std::optional<double> bucket_cap_mb;
  bool gradient_as_bucket_view = false;  ///< ddp: gradients are views into the buckets (no second copy)
  /// fsdp: the modules fully_shard wraps: `blocks` (each repeated block, then the root with the rest) or `root`
  /// (the whole model one unit).
  std::string units = "blocks";
  /// fsdp: free a unit's unsharded parameters after its forward (all-gathering them again in backward). Unset is
  /// FSDP2's default (None): every block but not the root, whose parameters backward needs at once; true or false
  /// is given to every unit, the root too, as fully_shard(reshard_after_forward=...) on each does.
  std::optional<bool> reshard_after_forward;
  /// fsdp: reshard_after_forward given as an integer k (then reshard_after_forward is unset), for every unit: the
  /// size of the group of consecutive ranks a unit reshards to after forward (FSDP2's post-forward mesh): 1 is
  /// none, the world size the whole group (as true), and a divisor between keeps 1/k of the unsharded parameters,
  /// all-gathered again in backward from the k ranks.
  std::int64_t reshard_after_forward_group = 0;
  /// The size of the group a unit reshards to after forward: 0 when it keeps its unsharded parameters, the world
  /// size when it reshards fully, a divisor between for a part (`root`: whether the unit is the root, which
  /// FSDP2's default keeps gathered).
  [[nodiscard]] std::int64_t reshard_group(bool root) const {
    if (reshard_after_forward_group > 0) return reshard_after_forward_group == 1 ? 0 : reshard_after_forward_group;
    return reshard_after_forward.value_or(!root) ? world_size : 0;
  }
  /// fsdp: units all-gathered ahead in backward (FSDP2: 1, the next unit in reverse forward order; more through
  /// set_modules_to_backward_prefetch).
  std::int64_t backward_prefetch = 1;
  /// fsdp: MixedPrecisionPolicy.reduce_dtype, the dtype gradients are reduce-scattered in. Unset is PyTorch's None:
  /// the gradients' own dtype (the training's precision, which is the policy's param_dtype under FSDP).
  std::optional<Precision> reduce_dtype;
  /// fsdp: FSDP2's offload_policy (above); none unless the fixture says `offload_policy`.
  FsdpOffload offload_policy = FsdpOffload::kNone;
  [[nodiscard]] bool enabled() const { return strategy != DistributedStrategy::kNone; }
  /// The Reducer's bucket_bytes_cap: int(bucket_cap_mb * 1024 * 1024), 25 MiB unset.
  [[nodiscard]] std::int64_t bucket_bytes_cap() const {
    return static_cast<std::int64_t>(bucket_cap_mb.value_or(25.0) * 1024.0 * 1024.0);
  }
  /// The Reducer's first_bucket_bytes_cap: 1 MiB unless bucket_cap_mb is given, as DistributedDataParallel has it.
  [[nodiscard]] std::int64_t first_bucket_bytes_cap() const {
    return bucket_cap_mb ? bucket_bytes_cap() : std::int64_t{1} << 20;
  }
};

}  // namespace memgate
