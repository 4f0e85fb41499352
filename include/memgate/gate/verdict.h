// The gate's policy in one place: the status of one component of one probe against its baseline, with the
// sentence that explains it. The memory suite, `memgate summary` and `memgate check` all use it.
#pragma once

#include "memgate/base/status.h"
#include "memgate/gate/baseline.h"
#include "memgate/gate/budget.h"
#include "memgate/gate/fixture.h"
#include "memgate/measure/probe.h"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace memgate {

/// How the user records baselines, which every "record them with" message names: inside CTest the update-baselines
/// preset (the default), from `memgate check` its own --update-baselines with the flags it ran with. The caller
/// passes it with what it judges (evaluate_component, judge_fixture).
struct RecordCommand {
  bool cli = false;              ///< memgate check: `memgate check --update-baselines --config <fixture>`
  std::string baselines_dir;     ///< --baselines, when not the default
  std::string device;            ///< --device, when not auto
};
/// The command that records `fixture`'s baselines on `device`, as `record` says the caller was started.
[[nodiscard]] std::string record_command(const Fixture& fixture, const DeviceInfo& device,
                                         const RecordCommand& record = {});

/// Judges `component` of `probe` (fixture at a batch size, measured on `device`) against `baseline` (nullptr:
/// none for this device; `baseline_file` names where it was looked for), with the fixture's effective tolerance
/// on that device. The message names the case, the numbers, what to do (`record`'s command), and the provenance
/// fields (torch, CUDA, cuDNN, driver, allocator, threads, device) in which the baseline's recording differs from
/// this run.
[[nodiscard]] ComponentVerdict evaluate_component(const Fixture& fixture, const ProbeResult& probe,
                                                  std::string_view component, const Baseline* baseline,
                                                  const std::string& baseline_file, const DeviceInfo& device,
                                                  const RecordCommand& record = {});

/// How many components were compared with a baseline (ok, regression, stale, not repeatable): a gate that
/// compared none has checked nothing.
[[nodiscard]] std::size_t compared_components(std::span<const ComponentVerdict> verdicts);

/// The provenance fields in which a recorded probe differs from `device`: "torch 2.10.0 -> 2.11.0", ...; empty
/// when they agree.
[[nodiscard]] std::string provenance_differences(const BaselineProbe& recorded, const DeviceInfo& device);

/// Judges a measured step against a GPU's budget: kOverBudget when step_peak_reserved plus what lives outside the
/// allocator exceeds the GPU's usable bytes (kOom when the probe ran out of memory). `component` names the GPU.
[[nodiscard]] ComponentVerdict evaluate_budget(const Fixture& fixture, const ProbeResult& probe, const GpuSpec& gpu);

/// One fixture's probes on a device, judged: what `memgate check` prints and the memory suite's measuring tests
/// write for their component tests.
struct FixtureVerdicts {
  DeviceInfo device;                          ///< where the probes ran, with the provenance the baseline is read against
  std::string baseline_file;                  ///< <baselines>/<slug>/<fixture>.json, whether or not it exists
  std::vector<ProbeResult> probes;            ///< the probes that ran
  std::vector<ComponentVerdict> components;   ///< batch size x component (kComponentTable order)
};

/// Judges `fixture` at each of `batch_sizes` on `device` against <baselines_dir>/<slug>/<fixture>.json. A batch size
/// with no baseline, or one recorded for another fixture hash, is judged without measuring (missing, changed); the
/// others are measured once each, in the order given. `extra_batch_sizes` are measured too (for budgets) without
/// verdicts. Every probe runs with `options` (progress, snapshots); the messages name `record`'s command. A corrupt
/// baseline throws memgate::Error naming the file.
[[nodiscard]] FixtureVerdicts judge_fixture(const Fixture& fixture, std::span<const std::int64_t> batch_sizes,
                                            c10::Device device, const std::string& baselines_dir,
                                            std::span<const std::int64_t> extra_batch_sizes = {},
                                            const ProbeOptions& options = {}, const RecordCommand& record = {});

/// Records the baselines of `fixture` at each of `batch_sizes` on `device` into <baselines_dir>/<slug>/<fixture>.json
/// from one measurement each (update_baseline: only these probes rewritten, a file whose bytes did not change left as
/// it was); returns the file and whether it changed. A probe that runs out of memory throws memgate::Error: there is
/// nothing to record. The update workflows (the memory suite's, `memgate check --update-baselines`) call it.
struct RecordedBaseline {
  std::string path;
  bool changed = false;
};
[[nodiscard]] RecordedBaseline record_fixture(const Fixture& fixture, std::span<const std::int64_t> batch_sizes,
                                              c10::Device device, const std::string& baselines_dir,
                                              const ProbeOptions& options = {});

/// The probe of `fixture` at `batch_size` among `verdicts.probes`, or nullptr when it was not measured.
[[nodiscard]] const ProbeResult* find_probe(const FixtureVerdicts& verdicts, std::int64_t batch_size);

}  // namespace memgate
