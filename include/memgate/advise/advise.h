// `memgate advise`: the largest batch that fits a target's memory, predicted from a few probes and confirmed by
// real steps under an allocator cap of the target's size, and the accumulation that reaches an effective batch.
#pragma once

#include "memgate/gate/budget.h"
#include "memgate/measure/probe.h"
#include "memgate/measure/train_step.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <string>
#include <vector>

namespace memgate {

/// A memory size to advise for: a GPU fixture, or a capacity given by hand.
struct AdviceTarget {
  std::string id;              ///< `rtx_4090_24gb`, or `capacity`
  std::string name;            ///< `NVIDIA GeForce RTX 4090`, or `1024 MiB`
  std::int64_t usable_bytes;   ///< what a step may use in the allocator: GpuSpec::usable_bytes(), or the capacity
  /// What an estimated step needs beside its reserved peak on this GPU: GpuSpec::library_workspace_bytes() (a
  /// measured probe has its own, measured); 0 for a capacity.
  std::int64_t library_workspace_bytes = 0;
  /// False for a GPU fixture memgate never measured (GpuSpec::measured): its answers say so.
  bool measured = true;
  /// The GPU's multiprocessors and threads per multiprocessor (GpuSpec's), which size CUDA's reduction staging in an
  /// estimate for it (EstimateContextGuard, estimate_context_for_gpu); 0: the defaults (an H100's).
  int multiprocessors = 0;
  int max_threads_per_multiprocessor = 0;
};

/// A GPU fixture as a target: its usable bytes (GpuSpec::usable_bytes()).
[[nodiscard]] AdviceTarget target_of(const GpuSpec& gpu);

/// One probe the search ran.
struct AdviceTrial {
  std::int64_t batch_size = 0;
  bool capped = false;                ///< run under the target's allocator cap (else measured freely)
  bool fits = false;                  ///< ran (capped) or needed no more than the usable bytes (free)
  std::optional<std::int64_t> peak;   ///< the step's peak (max of step_peak_reserved and eval_peak), if it ran
  std::int64_t accumulation_steps = 1;
};

/// The affine model of the peak in the batch size: fixed + per_sample x batch.
struct AffineFit {
  double fixed_bytes = 0.0;
  double per_sample_bytes = 0.0;
  /// The largest relative miss of the measured peaks from the line through the two largest batches (%), once
  /// three batches ran: how affine the step really is.
  std::optional<double> max_deviation_pct;
  [[nodiscard]] double at(std::int64_t batch_size) const {
    return fixed_bytes + per_sample_bytes * static_cast<double>(batch_size);
  }
};

/// The reach of an effective batch through accumulation on a target.
struct AccumulationAdvice {
  std::int64_t effective_batch = 0;
  std::int64_t micro_batch = 0;  ///< 0: not even batch 1 fits with accumulation
  std::int64_t steps = 0;        ///< micro-batches per optimizer step; micro_batch x steps = effective_batch
  std::int64_t step_peak_reserved = 0;  ///< of that step, measured under the cap
  bool fits = false;
};

/// A change users reach for when the batch they want does not fit, measured as a real fixture variant.
struct VariantAdvice {
  std::string name;    ///< `bf16 autocast`, `gradient checkpointing`, ...
  std::string change;  ///< the fixture keys it changes: `training.precision: bf16`
  std::optional<std::int64_t> batch_size;  ///< the largest batch it lets run on the target
  double step_seconds = 0.0;               ///< its measured step at batch 2 (or 1)
  double step_time_change_pct = 0.0;       ///< against the fixture as it is
  int probes = 0;
};

/// The advice for one target.
struct TargetAdvice {
  AdviceTarget target;
  std::optional<std::int64_t> batch_size;  ///< the largest batch that runs under the cap; none: not even 1
  std::optional<std::int64_t> predicted;   ///< the first prediction, before any probe of this target
  bool corrected = false;                  ///< the probes moved the answer away from the prediction
  int probes = 0;                          ///< probes run for this target, the shared first one included
  AffineFit fit;
  std::vector<AdviceTrial> trials;         ///< this target's probes, in order
  std::optional<AccumulationAdvice> accumulation;
  /// When the wanted batch (--effective-batch, else the fixture's largest batch size) does not fit: each variant
  /// the fixture allows, measured, best first (the batch it allows, then its step time).
  std::vector<VariantAdvice> variants;
  std::int64_t wanted_batch = 0;
};

/// The advice for a workload on a device.
struct Advice {
  DeviceInfo device;
  std::string fixture;
  std::vector<TargetAdvice> targets;
  int total_probes = 0;  ///< every probe run, shared ones counted once
  bool from_estimates = false;  ///< probes picked from estimates (AdviseOptions::from_estimates)
  /// A distributed fixture's ranks (0 on one device): every batch is a micro-batch per rank, each rank on a target.
  std::int64_t world_size = 0;
};

struct AdviseOptions {
  std::optional<std::int64_t> effective_batch;  ///< --effective-batch
  bool variants = true;                          ///< measure what would make the wanted batch fit
  std::optional<std::int64_t> wanted_batch;      ///< without --effective-batch: the batch wanted (the fixture's largest)
  std::int64_t max_batch = 1 << 20;              ///< the search never probes above this
  /// Told before each probe what it is for ("batch 12 under NVIDIA A100's cap"), and each probe's phases through
  /// ProbeOptions::on_phase: progress for a search that runs many probes.
  std::function<void(std::string_view probe)> on_probe;
  ProbeOptions probe;  ///< every probe's options
  /// Pick each probe from estimates (memgate estimate: the protocol on the Meta device, for the probes' kind of
  /// device) scaled by the nearest measured peak, instead of from the line through the measured peaks: the
  /// estimate knows where the peak is not affine in the batch (an optimizer step that dominates small batches).
  /// Every answer is still confirmed by real probes under the cap. On by default (issue 58: the line through
  /// batches 1 and 2 predicted 4,093 where the answer was 40); off, the line alone picks them.
  bool from_estimates = true;
  /// Told after each probe what it was for (as on_probe) and what it gave: a progress line per probe.
  std::function<void(std::string_view probe, const ProbeResult& result)> on_probe_done;
  /// Runs each probe of the search: run_probe, or run_probe_capped where `cap` is given (unset: those). A probe gives
  /// the same bytes each time it runs, so a caller that runs the same probes elsewhere too (a test's exhaustive search
  /// under the same cap) may give one that runs each distinct probe once.
  std::function<ProbeResult(const Workload& workload, std::int64_t batch_size, c10::Device device,
                            std::optional<std::int64_t> cap, const ProbeOptions& options)>
      run;
};

/// Finds, per target, the largest batch whose whole protocol (eval, the first and the measured optimizer steps)
/// runs under an allocator cap of the target's usable bytes, and shows that the next batch up does not fit.
/// Two free probes (batches 1 and 2, shared by the targets) start an affine model of the step's peak; each
/// further probe refits it (extrapolating from the two largest batches that fit, or interpolating towards the
/// first measured miss) and probes where it puts the boundary: the predicted batch under the cap, then the next
/// one up under a safety cap of four times the target, so that its peak is measured. The common case is two
/// probes per target after the shared two; when the model is far off it falls back to bisection.
/// The fixture variants users reach for that apply to `workload` (bf16 autocast, gradient checkpointing, a frozen
/// backbone, LoRA or a smaller LoRA rank, SGD instead of AdamW), each with its name and the keys it changes.
[[nodiscard]] std::vector<std::pair<VariantAdvice, Workload>> fit_variants(const Workload& workload);

[[nodiscard]] Advice advise(const Workload& workload, const std::vector<AdviceTarget>& targets, c10::Device device,
                            const AdviseOptions& options = {});

/// The advice as JSON (README: "memgate advise").
[[nodiscard]] nlohmann::json advice_to_json(const Advice& advice);

/// The advice as a table for a terminal.
[[nodiscard]] std::string format_advice(const Advice& advice);

/// The largest batch whose estimated training step fits a target (memgate estimate --gpu / --all-gpus).
struct EstimatedFit {
  AdviceTarget target;
  std::int64_t largest = 0;              ///< 0: not even batch 1 fits
  /// What the step needs at `largest` (at 1 when nothing fits): step_peak_reserved and the target's library
  /// workspaces.
  std::int64_t required_bytes = 0;
  std::int64_t next_required_bytes = 0;  ///< at largest + 1, which does not fit (0 where the search stopped at its cap)
  std::int64_t micro_batch = 0;          ///< with an effective batch: its largest divisor that fits ...
  std::int64_t accumulation_steps = 0;   ///< ... and the steps that accumulate to it
  bool capped = false;                   ///< `largest` is the search's cap: larger batches were not estimated
  /// Why largest + 1 cannot run on CUDA at all (CannotRunOnCudaError's first line), whatever the GPU's memory; empty
  /// where it needs more bytes than the GPU has. next_required_bytes is 0 then.
  std::string next_cannot_run;
};
struct EstimatedFits {
  std::vector<EstimatedFit> fits;
  std::int64_t world_size = 1;  ///< ranks, each on a GPU of its own: batches are per rank
  std::int64_t max_batch = 0;   ///< the search's cap
  std::int64_t estimates = 0;  ///< batch sizes estimated, each once for all targets
  double seconds = 0.0;
};
/// Searches each target's largest batch from estimates for CUDA (estimate_probe on the Meta device: the probe
/// protocol's requests through the caching allocator's model): batch 1, 2, 4, ... until the step's reserved peak
/// passes the target's usable bytes, then a binary search. With `effective_batch`, also the micro-batch (its largest
/// divisor that fits) and the accumulation steps that reach it. No GPU is used. `python`: in a Python process, what
/// memgate's extension lends its probes (ProbeOptions::python); without, a Python fixture's search runs in one.
[[nodiscard]] EstimatedFits largest_batches_by_estimate(const Workload& workload,
                                                        const std::vector<AdviceTarget>& targets,
                                                        std::optional<std::int64_t> effective_batch = {},
                                                        std::int64_t max_batch = std::int64_t{1} << 16,
                                                        const PythonRuntime* python = nullptr);
/// largest_batches_by_estimate in this process, for a request and an answer as run_python_search passes them (a
/// Python fixture's search runs in its Python process: child/rank.h's rank_main calls it with the extension's
/// `python`).
[[nodiscard]] std::string search_largest_batches_here(const Workload& workload, const std::string& request,
                                                      const PythonRuntime* python = nullptr);

/// The search's answer as text for a terminal, and as JSON (estimate --output: "largest_batch_by_estimate").
[[nodiscard]] std::string format_estimated_fits(const EstimatedFits& fits, std::optional<std::int64_t> effective_batch);
[[nodiscard]] nlohmann::json estimated_fits_to_json(const EstimatedFits& fits);

/// How many trials the usual search takes to find the same boundary: batch 1, 2, 4, ... until one fails, then a
/// binary search between the last two (Lightning's BatchSizeFinder in `binsearch` mode). `fits(b)` answers a trial.
[[nodiscard]] int power_of_two_then_binary_search_trials(const std::function<bool(std::int64_t)>& fits,
                                                         std::int64_t max_batch, std::int64_t* found = nullptr);

}  // namespace memgate
