// What FSDP2's collectives move per optimizer step, counted from the parameters as fully_shard shards them: what
// `memgate plan` charges sharding (docs/plan.md).
#pragma once

#include "memgate/gate/fixture.h"

#include <cstdint>
#include <optional>

namespace memgate {

/// Bytes one rank sends per optimizer step in FSDP2's collectives (and as many it receives), as a ring moves them:
/// an all-gather over g ranks sends the rank's part to g - 1 ranks ((g - 1) x the part), a reduce-scatter over N
/// ranks (N - 1) x the rank's padded shard of the unit's gradients.
struct FsdpCommunication {
  std::int64_t all_gather_forward = 0;   ///< each unit all-gathered before its forward
  std::int64_t all_gather_backward = 0;  ///< the units resharded after forward, all-gathered again for backward
  std::int64_t reduce_scatter = 0;       ///< each unit's gradients, reduce-scattered after its backward
  [[nodiscard]] std::int64_t total() const { return all_gather_forward + all_gather_backward + reduce_scatter; }
};

/// FSDP2's collectives of `workload` (training.distributed: {strategy: fsdp}) per optimizer step, summed over its
/// accumulation steps (FSDP2 all-gathers and reduce-scatters every micro-batch). Counted from the model's parameters
/// built on the Meta device: each unit (units: blocks: each block, then the root with the rest; units: root: one)
/// holds every parameter's dim-0 shard padded to ceil(rows / N) rows; it is all-gathered in the unsharded dtype
/// (MixedPrecisionPolicy's param_dtype: training.precision bf16 or fp16; else the parameter's) before its forward, and
/// again before its backward where reshard_after_forward reshards it (FSDP2's default: the blocks, not the root; k:
/// from its group of k ranks, each holding 1/k of the unit) and its output needs a gradient (the unit or one before it
/// in the model's parameter order trains); its trainable parameters' gradients are reduce-scattered in reduce_dtype
/// (unset: the unsharded dtype). Unset (nullopt) for a workload that is not FSDP, and for a Python or TorchScript
/// fixture, whose parameters this process does not build.
[[nodiscard]] std::optional<FsdpCommunication> fsdp_communication(const Workload& workload);

/// Bytes rank 0 moves over its host link per optimizer step under FSDP2's CPUOffloadPolicy (training.distributed.
/// offload_policy: cpu | cpu_pinned, what an estimate for CUDA models: fully_shard.h): each padded shard copied to the
/// device before each all-gather of its unit (before forward; before backward too where the unit resharded to its
/// shards after forward and its output needs a gradient: reshard_after_forward true, the blocks' default), in the
/// shard's dtype (param_dtype's cast is made on the device), and each trainable parameter's reduce-scattered
/// gradient copied back (rank 0 owns each parameter's first chunk whole: its padded shard's bytes), every
/// micro-batch. Rank 0 moves the most (a rank past a parameter's last row copies back an empty gradient).
struct FsdpHostTransfer {
  std::int64_t to_device_forward = 0;   ///< the shards, before each unit's forward all-gather
  std::int64_t to_device_backward = 0;  ///< the shards again, before the backward all-gather of a resharded unit
  std::int64_t to_host_gradients = 0;   ///< the sharded gradients, after each unit's reduce-scatter
  [[nodiscard]] std::int64_t total() const { return to_device_forward + to_device_backward + to_host_gradients; }
};

/// What `workload` (training.distributed: {strategy: fsdp}) would move under CPUOffloadPolicy per optimizer step,
/// counted from its parameters as fsdp_communication counts them (whatever its own offload_policy); unset for a
/// workload that is not FSDP, and for a Python or TorchScript fixture.
[[nodiscard]] std::optional<FsdpHostTransfer> fsdp_host_transfer(const Workload& workload);

}  // namespace memgate
