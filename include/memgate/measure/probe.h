// The probe: one workload (a fixture) at one batch size on one device, measured component by component
// (DESIGN.md, "The measurement protocol").
#pragma once

#include <c10/core/DeviceGuard.h>

#include "memgate/base/components.h"
#include "memgate/base/module_breakdown.h"
#include "memgate/backend/device.h"
#include "memgate/distributed/process_group.h"
#include "memgate/backend/memory_backend.h"
#include "memgate/backend/memory_snapshot.h"
#include "memgate/measure/train_step.h"
#include "memgate/models/model.h"

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace memgate {

/// One batch size's result: components, or the out-of-memory that stopped it.
struct ProbeResult {
  std::int64_t batch_size = 0;
  bool oom = false;          ///< the device ran out of memory; `components` is not filled
  std::string error;         ///< the out-of-memory message, or the failure's
  Components components;
  /// Which module holds the bytes of activations, forward_peak, eval_peak and step_peak: a Python fixture's on the
  /// CPU (backend/module_attribution.h); empty elsewhere.
  ModuleBreakdown modules;
  double seconds = 0.0;      ///< wall time of the whole probe (build, warm-up, measured step)
  double step_seconds = 0.0; ///< wall time of the measured step alone
  /// cuBLAS / cuBLASLt workspaces on the device, created before `base` so that no component depends on what ran
  /// earlier in the process; outside the components, inside the allocator (0 on the CPU).
  std::int64_t library_workspace_bytes = 0;
  /// What the device holds outside its allocator after the measured step (CUDA context, loaded modules,
  /// libraries); the GPU fixtures' `outside_allocator_bytes` come from it. 0 on the CPU.
  std::int64_t outside_allocator_bytes = 0;
  /// With ProbeOptions::snapshot: the allocator's history over the whole probe (build, eval forwards, warm-up,
  /// measured step; up to the out-of-memory when there was one), as memory_viz's pickle.
  std::string snapshot;
  /// A distributed probe's snapshots instead, one per rank, by rank (each rank's allocator is its own).
  std::vector<std::string> rank_snapshots;
  /// A distributed probe's ranks, each with its own components (`components` holds the largest over them); empty
  /// on one device.
  std::vector<RankComponents> ranks;
  /// What the strategy's communication keeps between steps (DDP's buckets), the largest over ranks; 0 on one device.
  std::int64_t comm_buffer_bytes = 0;
  std::int64_t comm_buffers = 0;  ///< how many buffers those are
  /// A distributed probe on GPUs: what its ranks' NCCL communicators take outside the caching allocator, the largest
  /// over ranks (RankComponents::communicator_bytes); budgets add it to what a rank needs. 0 elsewhere.
  std::int64_t communicator_bytes = 0;
  /// The model's parameter counts where the probe ran in a process of its own that built it (a Python fixture's,
  /// in a Python process): a profile takes them from there. Unset otherwise.
  std::optional<ParamCounts> param_counts;
  /// The probe failed with another error than an out-of-memory (the model's code raised, an op the device cannot
  /// run, its process ended), `error` says which: a profile's probe under ProbeOptions::keep_going; `components` is
  /// not filled.
  bool failed = false;

  /// Whether the probe has components: it neither ran out of memory nor failed.
  [[nodiscard]] bool measured() const { return !oom && !failed; }

  /// What the step needs on the device beside its components: the library workspaces and the NCCL communicators.
  /// A budget (evaluate_budget) and advise's search add it to the peak they hold to the GPU's usable bytes.
  [[nodiscard]] std::int64_t bytes_beside_components() const { return library_workspace_bytes + communicator_bytes; }
};

/// Whether an error from a step is the device running out of memory in any of its forms: the caching allocator's
/// OutOfMemoryError, a cuBLAS / cuDNN workspace that could not be allocated, a cudaMalloc outside the allocator,
/// or the CPU's allocator. A probe reports those as out of memory at its batch size and the run goes on.
[[nodiscard]] bool is_out_of_memory(std::string_view message);

/// A workload's results on one device.
struct Profile {
  DeviceInfo device;
  std::string fixture;
  std::string fixture_hash;
  ParamCounts params;
  std::vector<ProbeResult> probes;
};

/// Knobs of the protocol; the defaults are the protocol of DESIGN.md.
/// A rank timeout unless the user gives one: PyTorch's default for Gloo.
inline constexpr std::chrono::seconds kDefaultRankTimeout{300};

/// A rank timeout as written (--rank-timeout, MEMGATE_RANK_TIMEOUT): whole seconds from 1 to 86400; nothing else.
[[nodiscard]] std::optional<std::chrono::seconds> parse_rank_timeout(std::string_view text);

/// How long a probe's processes may wait on one another or go silent: MEMGATE_RANK_TIMEOUT, else
/// kDefaultRankTimeout. A malformed MEMGATE_RANK_TIMEOUT throws memgate::Error naming it.
[[nodiscard]] std::chrono::seconds default_rank_timeout();

struct ProbeOptions {
  /// Full training steps before the measured one (optimizer state, workspaces and caches exist after them).
  int warmup_steps = 1;
  /// Intra-op threads on the CPU during a probe: 1 makes the bytes independent of the machine's core count.
  int cpu_threads = 1;
  /// Seed of parameters and batches.
  std::uint64_t seed = 0;
  /// Record the allocator's history for memory_viz (ProbeResult::snapshot). Recording does not change the bytes
  /// (the history is kept outside the device's allocator) but slows the step: its time is not representative.
  std::optional<SnapshotOptions> snapshot;
  /// Told each part of the protocol as it starts ("building the model", "eval forward", "warm-up step: forward",
  /// "measured step: backward", ...): progress for long probes.
  std::function<void(std::string_view phase)> on_phase;
  /// Set in a rank's process of a distributed probe: the step trains through this group (DDP) and the probe
  /// measures this rank. Unset, a distributed workload's probe starts its ranks (launch/ranks.h).
  const RankGroup* rank_group = nullptr;
  /// A distributed probe under run_probe_capped: each rank's allocator is capped at this many bytes
  /// above what its process holds (0: no cap). Set by run_probe_capped (launch/run.h), passed to the rank processes.
  std::int64_t rank_cap_bytes = 0;
  /// A distributed probe on CUDA: the GPU of each rank, rank 0's first (the memory suite's, from CTest's resource
  /// groups: gpus_for_test). Empty: one GPU per rank from the probe's device on (consecutive_gpus).
  std::vector<c10::DeviceIndex> rank_devices;
  /// A probe in processes of its own (ranks, a Python fixture's): how long a rank waits for the others (to join, in
  /// any one collective) and how long any of its processes may go without a heartbeat before the probe is ended as
  /// hung (--rank-timeout, MEMGATE_RANK_TIMEOUT).
  std::chrono::seconds rank_timeout = default_rank_timeout();
  /// A profile's probes (memgate profile): an error at one batch size is that probe's result (ProbeResult::failed,
  /// with its message) and the next batch sizes still run. Unset (the gate, advise), the error is thrown.
  bool keep_going = false;
  /// In a Python process that imported memgate's extension (child/rank.h's rank_main is given it): what builds the
  /// Python models, reuses an estimate's builds and collects Python's garbage before each probe reads its base
  /// (models/python.h). Unset, a Python fixture's probe runs in a Python process of its own (launch/ranks.h).
  const PythonRuntime* python = nullptr;
};

/// Measures one workload at one batch size in this process: the whole probe on one device, or, with
/// `options.rank_group`, this rank's part of a distributed one. An out-of-memory is returned as `oom`, not thrown; bad
/// input throws memgate::Error, and so does a distributed workload without a rank group (its ranks are processes of
/// their own: launch/run.h's run_probe starts them). Everything the probe allocated is freed (and the cache
/// emptied) before it returns.
[[nodiscard]] ProbeResult measure_probe(const Workload& workload, std::int64_t batch_size, c10::Device device,
                                        const ProbeOptions& options = {});

/// The description a probe of `workload` records: `describe_device`, with the workload's allocator settings where
/// it sets any and the intra-op threads the probe pins on the CPU.
[[nodiscard]] DeviceInfo describe_probe_device(c10::Device device, const Workload& workload,
                                               const ProbeOptions& options = {});

/// Counts the workload's parameters (total / trainable / frozen) on the meta device: nothing is allocated. A
/// registered model whose factory cannot build there (it builds on the CPU and moves) is counted on the CPU; any other
/// model that cannot be built there is counted on `fallback` where one is given (a Python builder that reads a value
/// drawn at random: a measurement's own device), `on_fallback` told first; else its error is thrown.
[[nodiscard]] ParamCounts workload_param_counts(const Workload& workload,
                                                std::optional<c10::Device> fallback = std::nullopt,
                                                const std::function<void()>& on_fallback = {},
                                                const PythonRuntime* python = nullptr);

/// A workload at a batch size built and warmed up on a device exactly as a probe does it, ready to run
/// steady-state steps: what the benchmarks time. The peak of its steps above `base()` is the probe's step_peak.
///
///   memgate::PreparedStep prepared(fixture, 8, torch::kCPU);
///   prepared.backend().reset_peak();
///   prepared.step().run();
///   auto peak = prepared.backend().snapshot().peak_allocated - prepared.base().allocated;
class PreparedStep {
 public:
  /// Applies the workload's allocator settings, empties the cache, reads `base`, builds the TrainingStep and
  /// runs the protocol's warm-up (`options.warmup_steps`); `observer` sees the build and the warm-up.
  PreparedStep(const Workload& workload, std::int64_t batch_size, c10::Device device,
               const ProbeOptions& options = {}, StepObserver* observer = nullptr);
  [[nodiscard]] TrainingStep& step() { return *step_; }
  [[nodiscard]] MemoryBackend& backend() { return *backend_; }
  /// What the device's allocator held before the model was built.
  [[nodiscard]] const MemorySnapshot& base() const { return base_; }
  [[nodiscard]] std::int64_t library_workspace_bytes() const { return library_workspace_bytes_; }

 private:
  c10::OptionalDeviceGuard guard_;  ///< the probe's device is current while it lives (cuda:N, not cuda:0)
  std::unique_ptr<MemoryBackend> backend_;
  std::int64_t library_workspace_bytes_ = 0;
  MemorySnapshot base_;
  std::unique_ptr<TrainingStep> step_;
};

/// Sets the kernel choices a workload is measured with (PreparedStep does it for each workload, so one fixture's
/// setting never carries into the next): cuDNN benchmark mode off, as PyTorch's default (it picks algorithms,
/// and their workspaces, by timing, so bytes would change from run to run); deterministic algorithms (and
/// deterministic cuDNN) only when `deterministic` (the fixture's `training.deterministic`), since they change
/// kernels, and their memory, away from what users run by default.
void configure_determinism(bool deterministic);

/// Sets the kernels the CPU runs for a workload (PreparedStep does it for each, like configure_determinism):
/// `kPortable` turns LibTorch's oneDNN (mkldnn) and NNPACK paths off, so convolutions, matmuls and attention run
/// LibTorch's own kernels, whose tensors do not depend on the CPU's ISA, caches or core count; `kHost` turns them
/// back on, as PyTorch runs by default.
void configure_cpu_kernels(CpuKernels kernels);

}  // namespace memgate
