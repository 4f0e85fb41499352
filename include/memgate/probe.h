// The probe: one fixture at one batch size on one device, measured component by component (DESIGN.md).
#pragma once

#include "memgate/device.h"
#include "memgate/fixture.h"
#include "memgate/model.h"

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace memgate {

/// The measured components, in report order.
inline constexpr std::array<std::string_view, 8> kComponents{
    "params",        "gradients", "optimizer_state", "activations",
    "forward_peak",  "eval_peak", "step_peak",       "step_peak_reserved"};

/// Bytes of each component of one probe.
struct Components {
  std::int64_t params = 0;              ///< parameters and buffers on the device
  std::int64_t gradients = 0;           ///< .grad of trainable parameters after backward
  std::int64_t optimizer_state = 0;     ///< kept by the optimizer between steps
  std::int64_t activations = 0;         ///< kept for backward at the end of a train-mode forward
  std::int64_t forward_peak = 0;        ///< peak of the train-mode forward above what was allocated before it
  std::int64_t eval_peak = 0;           ///< peak of an eval-mode no-grad forward, absolute
  std::int64_t step_peak = 0;           ///< peak allocated during one steady-state step, absolute
  std::int64_t step_peak_reserved = 0;  ///< peak reserved during that step, absolute

  /// The component named `name` (one of kComponents); throws memgate::Error for another name.
  [[nodiscard]] std::int64_t get(std::string_view name) const;
  void set(std::string_view name, std::int64_t bytes);
  friend bool operator==(const Components&, const Components&) = default;
};

/// One batch size's result: components, or the out-of-memory that stopped it.
struct ProbeResult {
  std::int64_t batch_size = 0;
  bool oom = false;          ///< the device ran out of memory; `components` is not filled
  std::string error;         ///< the out-of-memory message
  Components components;
  double seconds = 0.0;      ///< wall time of the whole probe (build, warm-up, measured step)
  double step_seconds = 0.0; ///< wall time of the measured step alone
};

/// A fixture's results on one device.
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

/// Measures one fixture at one batch size. An out-of-memory is returned as `oom`, not thrown; bad input throws
/// memgate::Error. Everything the probe allocated is freed (and the cache emptied) before it returns.
[[nodiscard]] ProbeResult run_probe(const Fixture& fixture, std::int64_t batch_size, c10::Device device,
                                    const ProbeOptions& options = {});

/// Probes each batch size in turn (the next batch size still runs after an out-of-memory).
[[nodiscard]] Profile run_profile(const Fixture& fixture, const std::vector<std::int64_t>& batch_sizes,
                                  c10::Device device, const ProbeOptions& options = {});

/// The description a probe of `fixture` records: `describe_device`, with the fixture's allocator settings where it
/// sets any and the intra-op threads the probe pins on the CPU.
[[nodiscard]] DeviceInfo describe_probe_device(c10::Device device, const Fixture& fixture,
                                               const ProbeOptions& options = {});

/// Counts the fixture's parameters (total / trainable / frozen) on the meta device: nothing is allocated.
[[nodiscard]] ParamCounts fixture_param_counts(const Fixture& fixture);

/// Puts the device in the protocol's deterministic mode: cuDNN benchmark off, deterministic algorithms,
/// CUBLAS_WORKSPACE_CONFIG pinned. Call before the first CUDA work (run_probe calls it).
void configure_determinism();

}  // namespace memgate
