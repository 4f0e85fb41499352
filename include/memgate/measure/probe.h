// The probe: one workload (a fixture) at one batch size on one device, measured component by component
// (DESIGN.md, "The measurement protocol").
#pragma once

#include "memgate/base/components.h"
#include "memgate/measure/device.h"
#include "memgate/measure/memory_backend.h"
#include "memgate/measure/train_step.h"
#include "memgate/models/model.h"

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace memgate {

/// One batch size's result: components, or the out-of-memory that stopped it.
struct ProbeResult {
  std::int64_t batch_size = 0;
  bool oom = false;          ///< the device ran out of memory; `components` is not filled
  std::string error;         ///< the out-of-memory message
  Components components;
  double seconds = 0.0;      ///< wall time of the whole probe (build, warm-up, measured step)
  double step_seconds = 0.0; ///< wall time of the measured step alone
};

/// A workload's results on one device.
struct Profile {
  DeviceInfo device;
  std::string fixture;
  std::string fixture_hash;
  ParamCounts params;
  std::vector<ProbeResult> probes;
};

/// Knobs of the protocol; the defaults are the protocol of DESIGN.md.
struct ProbeOptions {
  /// Full training steps before the measured one (optimizer state, workspaces and caches exist after them).
  int warmup_steps = 1;
  /// Intra-op threads on the CPU during a probe: 1 makes the bytes independent of the machine's core count.
  int cpu_threads = 1;
  /// Seed of parameters and batches.
  std::uint64_t seed = 0;
};

/// Measures one workload at one batch size. An out-of-memory is returned as `oom`, not thrown; bad input throws
/// memgate::Error. Everything the probe allocated is freed (and the cache emptied) before it returns.
[[nodiscard]] ProbeResult run_probe(const Workload& workload, std::int64_t batch_size, c10::Device device,
                                    const ProbeOptions& options = {});

/// Probes each batch size in turn (the next batch size still runs after an out-of-memory).
[[nodiscard]] Profile run_profile(const Workload& workload, const std::vector<std::int64_t>& batch_sizes,
                                  c10::Device device, const ProbeOptions& options = {});

/// The description a probe of `workload` records: `describe_device`, with the workload's allocator settings where
/// it sets any and the intra-op threads the probe pins on the CPU.
[[nodiscard]] DeviceInfo describe_probe_device(c10::Device device, const Workload& workload,
                                               const ProbeOptions& options = {});

/// Counts the workload's parameters (total / trainable / frozen) on the meta device: nothing is allocated.
[[nodiscard]] ParamCounts workload_param_counts(const Workload& workload);

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

 private:
  std::unique_ptr<MemoryBackend> backend_;
  MemorySnapshot base_;
  std::unique_ptr<TrainingStep> step_;
};

/// Puts the device in the protocol's deterministic mode: cuDNN benchmark off, deterministic algorithms,
/// CUBLAS_WORKSPACE_CONFIG pinned. Call before the first CUDA work (run_probe calls it).
void configure_determinism();

}  // namespace memgate
