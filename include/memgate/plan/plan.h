// `memgate plan`: the ways to fit a batch on a GPU that keep the training the same (which blocks to checkpoint,
// gradient accumulation, the allocator's expandable segments, FSDP over --world-size ranks, activation offload to
// pinned host memory), each plan's step peak by the same estimate as `memgate estimate --gpu`, its cost counted, and
// the fixture keys that apply it (docs/plan.md).
#pragma once

#include "memgate/advise/advise.h"
#include "memgate/gate/fixture.h"
#include "memgate/launch/estimate.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace memgate {

struct PlanOptions {
  /// The batch of each step (micro-batch; accumulation is not searched); unset with effective_batch.
  std::optional<std::int64_t> batch;
  /// The batch of each optimizer step: micro-batch x accumulation steps, both searched (each divisor).
  std::optional<std::int64_t> effective_batch;
  /// Also the levers that change the training (bf16 autocast, a frozen backbone, SGD instead of AdamW).
  bool allow_changes = false;
  enum class Search { kAuto, kExhaustive, kGreedy };
  /// kAuto: exhaustive when the space has at most exhaustive_limit plans, else greedy. kExhaustive over more than
  /// 4,096 plans is an error (24 blocks are 2^24 subsets).
  Search search = Search::kAuto;
  std::int64_t exhaustive_limit = 64;
  /// The device the plans are estimated for: CUDA (a GPU fixture or a capacity; the default), or the CPU (a capacity:
  /// the estimate for the CPU's kernels, reserved = allocated, no library workspaces; what `memgate profile --device
  /// cpu` of the plan's fixture measures).
  EstimateTarget target = EstimateTarget::kCuda;
  /// The ranks the job runs on (`--world-size W`); the batch is each rank's, as everywhere for a distributed fixture.
  /// A distributed fixture is planned over W ranks instead of its own world_size (the change says so). From 2 ranks,
  /// a fixture on one device or under DDP also gets the sharding lever: FSDP2 over the W ranks
  /// (`training.distributed: {strategy: fsdp, world_size: W}`), alone and with every other lever. Unset: the
  /// fixture's own ranks, no sharding lever. W < 2 for a fixture on one device is an error (nothing to shard over).
  std::optional<std::int64_t> world_size;
  /// Estimates kept across plan() calls that share this object (a program that plans one fixture many ways: its
  /// tests); unset: each plan() estimates its own. See PlanEstimateMemo.
  std::shared_ptr<struct PlanEstimateMemo> memo;
};

/// What plan() estimated of each point, keyed by the fixture's path and content hash, --world-size, the target (and
/// the GPU's SMs), the point and its change: the same key is the same workload at the same micro-batch, whose estimate
/// is the same bytes. A plan() that finds its point here takes its bytes instead of estimating again; it still counts
/// the point in its `estimates` (its search asked for it), so what each search returns is unchanged.
struct PlanEstimateMemo {
  struct Bytes {
    std::int64_t step_peak = 0;
    std::int64_t step_peak_reserved = 0;
    std::int64_t host_bytes = 0;
    bool cannot_run = false;  ///< the estimate for CUDA cannot run the step (plan.required_bytes: kCannotRun)
  };
  std::map<std::string, Bytes> estimated;
};

/// One way to run the step, estimated for the target.
struct Plan {
  bool fits = false;
  std::int64_t micro_batch = 0;
  std::int64_t accumulation_steps = 1;
  std::int64_t world_size = 1;
  std::int64_t global_batch = 0;          ///< micro_batch x accumulation_steps x world_size
  std::string strategy = "none";          ///< none | ddp | fsdp: how the plan's step is spread over its ranks
  /// Bytes each rank sends per optimizer step in FSDP's collectives (as many it receives; plan/communication.h): 0
  /// without sharding (one device, or DDP, whose gradient all-reduce is not counted), unset for a Python fixture
  /// under FSDP (its parameters are not built here).
  std::optional<std::int64_t> communication_bytes = 0;
  std::vector<std::string> checkpointed;  ///< blocks recomputed, as the fixture names them ("blocks.3")
  std::int64_t blocks = 0;                ///< blocks the model can checkpoint
  /// The ops whose outputs the checkpointed blocks save, in PyTorch's selective checkpointing (a Python fixture's
  /// blocks saving their attention's output); empty: whole blocks recomputed.
  std::vector<std::string> checkpoint_save;
  std::string allocator;                  ///< training.allocator
  std::int64_t step_peak = 0;             ///< estimate for the target (CUDA on its GPU, or the CPU): allocated
  std::int64_t step_peak_reserved = 0;    ///< ... and reserved
  std::int64_t required_bytes = 0;        ///< reserved + the GPU's library workspaces (as estimate --gpu)
  std::int64_t headroom_bytes = 0;        ///< usable - required (negative: does not fit)
  /// Host memory the plan holds: the peak of its offloaded activations (the estimate's host_activations) or, under
  /// FSDP's CPUOffloadPolicy, of its shards, their gradients and the optimizer's state (host_state); 0 where it does
  /// not offload.
  std::int64_t host_bytes = 0;
  /// Bytes moved over the host link per optimizer step: activation offload's 2 x the copies' bytes (to the host in
  /// forward, back in backward) x the accumulation steps; FSDP's offload the largest rank's shards to the device before
  /// each all-gather and gradients back (plan/communication.h's fsdp_host_transfer); 0 where it does not offload.
  std::int64_t host_transfer_bytes = 0;
  std::int64_t recompute_flops = 0;       ///< per micro-batch: the checkpointed blocks' forward
  std::int64_t step_flops = 0;            ///< per micro-batch: forward and backward without recomputation
  double recompute_flops_fraction = 0.0;  ///< recompute_flops / step_flops
  bool changes_training = false;
  nlohmann::json change = nlohmann::json::object();  ///< the fixture's keys that apply it
  std::vector<std::string> levers;                   ///< in words
  Workload workload;                                 ///< the fixture with the change applied (not in the JSON)
};

struct PlanResult {
  std::string model;
  AdviceTarget target;
  std::int64_t batch = 0;          ///< the batch per optimizer step the plans reach
  std::string estimated_for = "cuda";  ///< cuda | cpu
  std::string search;              ///< exhaustive | greedy
  std::int64_t space = 0;          ///< plans in the space searched
  std::int64_t estimates = 0;      ///< estimates run (FLOP counts included)
  double seconds = 0.0;
  /// --world-size's sharding lever: "FSDP over W ranks" where it is searched, why not where it is not, "" unasked.
  std::string sharding;
  std::optional<Plan> as_is;       ///< the fixture at the batch, unchanged
  std::vector<Plan> plans;         ///< the plans that fit, cheapest first
};

/// Searches the plans that fit `target` for `fixture` at the batch `options` asks (the fixture's largest batch size
/// by default). Per micro-batch and accumulation (and allocator setting where it changes the reserved bytes): the
/// checkpointed blocks with the fewest recomputed FLOPs that fit, exhaustively over every subset of the blocks when
/// the space is small, else greedily, adding the block that saves the most reserved bytes per recomputed FLOP, each
/// step estimated; with options.world_size, each again sharded with FSDP over those ranks; for CUDA, each again with
/// activations offloaded to pinned host memory. Cheapest first: bytes moved to the host and back, recomputed FLOPs,
/// accumulation steps, communication bytes, fewer levers, more headroom.
/// A batch that no plan fits is an error naming the fixture, the batch, the GPU and the least the search needed.
[[nodiscard]] PlanResult plan(const Fixture& fixture, const AdviceTarget& target, const PlanOptions& options);

/// The plans as JSON (DESIGN.md, `memgate plan`), and as a table for a terminal.
[[nodiscard]] nlohmann::json plan_to_json(const PlanResult& result);
[[nodiscard]] std::string format_plan(const PlanResult& result);

/// `fixture_yaml` (a fixture's text) with `change` (a plan's) merged into it as a JSON merge patch (an object key by
/// key, a null removing the key): the fixture that runs the plan.
[[nodiscard]] std::string apply_change(const std::string& fixture_yaml, const nlohmann::json& change);

}  // namespace memgate
