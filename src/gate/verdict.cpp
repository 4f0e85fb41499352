// The gate's policy: status and message of a component against its baseline.
#include "memgate/gate/verdict.h"

#include "memgate/base/error.h"
#include "memgate/gate/suite.h"
#include "memgate/launch/run.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <optional>
#include <vector>

namespace memgate {

std::string provenance_differences(const BaselineProbe& recorded, const DeviceInfo& device) {
  auto now = probe_provenance(device, "", "");
  now.erase("fixture_hash");  // a changed fixture has a verdict of its own
  now.erase("commit");
  auto text = [](const nlohmann::json& v) {
    auto s = v.is_string() ? v.get<std::string>() : v.dump();
    return s.empty() ? std::string("(none)") : s;
  };
  std::string out;
  for (const auto& [key, value] : now.items()) {
    if (!recorded.provenance.contains(key)) continue;
    const auto then = text(recorded.provenance[key]), current = text(value);
    if (then != current) out += fmt::format("{}{} {} -> {}", out.empty() ? "" : ", ", key, then, current);
  }
  return out;
}

ComponentVerdict evaluate_component(const Fixture& fixture, const ProbeResult& probe, std::string_view component,
                                    const Baseline* baseline, const std::string& baseline_file,
                                    const DeviceInfo& device) {
  ComponentVerdict v;
  v.fixture = fixture.name;
  v.batch_size = probe.batch_size;
  v.component = std::string(component);
  const bool cuda = device.device.is_cuda();
  const auto how = fmt::format("record them with: {}ctest --preset {} (then commit baselines/{}/)",
                               device.cpu_kernels == "host" ? "MEMGATE_CPU_KERNELS=host " : "",
                               cuda ? "update-baselines-gpu" : "update-baselines", device.slug);
  const auto* recorded = baseline != nullptr ? baseline->find(probe.batch_size) : nullptr;
  if (recorded == nullptr) {
    v.status = Status::kMissing;
    v.message = baseline == nullptr
                    ? fmt::format("no baseline {} for device {}: {}", baseline_file, device.slug, how)
                    : fmt::format("{} has no batch size {}: {}", baseline_file, probe.batch_size, how);
    return v;
  }
  // A rank's component (rank1_gradients) against that rank's record.
  const auto ranked = parse_rank_component(component);
  const RankComponents* recorded_rank = ranked ? find_rank(recorded->ranks, ranked->first) : nullptr;
  if (ranked && recorded_rank == nullptr && recorded->fixture_hash() == fixture.hash) {
    v.status = Status::kMissing;
    v.message = fmt::format("{} (batch {}) has no rank {}: {}", baseline_file, probe.batch_size, ranked->first, how);
    return v;
  }
  const std::string name = ranked ? ranked->second : std::string(component);
  // (A rank the record lacks has no baseline: its fixture changed, e.g. its world size, and says so below.)
  if (recorded_rank != nullptr) v.baseline = recorded_rank->components.get(name);
  else if (!ranked) v.baseline = recorded->components.get(component);
  const auto differences = provenance_differences(*recorded, device);
  const auto provenance =
      differences.empty() ? std::string() : "\n  recorded with another setup than this run: " + differences;
  if (recorded->fixture_hash() != fixture.hash) {
    v.status = Status::kChanged;
    v.message = fmt::format(
        "the model changed: update the baselines. {} hashes to {} but {} (batch {}) was recorded for {}; {}",
        fixture.source, fixture.hash, baseline_file, probe.batch_size, recorded->fixture_hash(), how);
    return v;
  }
  if (probe.oom) {
    v.status = Status::kOom;
    v.message = fmt::format("{} at batch {} ran out of memory; its baseline {} is {} bytes.\n{}{}", fixture.name,
                            probe.batch_size, component, *v.baseline, probe.error, provenance);
    return v;
  }
  const auto tolerance = effective_tolerance(fixture, cuda);
  const RankComponents* measured_rank = ranked ? find_rank(probe.ranks, ranked->first) : nullptr;
  if (ranked && measured_rank == nullptr) {
    throw Error(fmt::format("{} at batch {}: rank {} measured nothing ({} ranks ran)", fixture.name,
                            probe.batch_size, ranked->first, probe.ranks.size()));
  }
  const auto cmp = compare_component(
      fixture.name, probe.batch_size, ranked ? fmt::format("rank {}'s {}", ranked->first, name) : name, *v.baseline,
      measured_rank != nullptr ? measured_rank->components.get(name) : probe.components.get(component), tolerance);
  v.measured = cmp.measured;
  v.allowed = cmp.allowed;
  switch (cmp.verdict) {
    case Verdict::kWithin: v.status = Status::kOk; break;
    case Verdict::kRegression: v.status = Status::kRegression; break;
    case Verdict::kStale: v.status = Status::kStale; break;
  }
  v.message = cmp.message() + provenance;
  if (ranked) {
    // The imbalance between ranks: what each measured of this component.
    std::int64_t low = INT64_MAX, high = 0;
    std::string each;
    for (const auto& r : probe.ranks) {
      const auto bytes = r.components.get(name);
      low = std::min(low, bytes);
      high = std::max(high, bytes);
      each += fmt::format("{}rank {} {}", each.empty() ? "" : ", ", r.rank, bytes);
    }
    v.message += fmt::format("\n  every rank: {} (imbalance {} bytes)", each, high - low);
  }
  if (v.status != Status::kOk && baseline->tolerance != tolerance) {
    v.message += fmt::format(
        "\n  the baseline was recorded with another tolerance (relative {}, absolute {} bytes; reserved {} / {} "
        "bytes) than the gate holds now (relative {}, absolute {} bytes; reserved {} / {} bytes)",
        baseline->tolerance.relative, baseline->tolerance.absolute, baseline->tolerance.reserved_relative,
        baseline->tolerance.reserved_absolute, tolerance.relative, tolerance.absolute, tolerance.reserved_relative,
        tolerance.reserved_absolute);
  }
  return v;
}

ComponentVerdict evaluate_budget(const Fixture& fixture, const ProbeResult& probe, const GpuSpec& gpu) {
  ComponentVerdict v;
  v.fixture = fixture.name;
  v.batch_size = probe.batch_size;
  v.component = gpu.id;
  if (probe.oom) {
    v.status = Status::kOom;
    v.message = fmt::format("{} at batch {} ran out of memory on this GPU, so it cannot be held to {}:\n{}",
                            fixture.name, probe.batch_size, gpu.name, probe.error);
    return v;
  }
  // The library workspaces live in the allocator outside the step's components, and the step needs them; so does a
  // GPU rank's NCCL communicator, outside the allocator and beyond the GPU's own context.
  const auto check = check_budget(probe.components.step_peak_reserved + probe.bytes_beside_components(), gpu);
  v.baseline = check.available;
  v.measured = check.required;
  v.status = check.fits() ? Status::kOk : Status::kOverBudget;
  v.message = fmt::format(
      "{} at batch {} {} {}{}: needs {} bytes (step_peak_reserved {} + library workspaces {}{} + outside the "
      "allocator {}), usable {} ({} x {}); {} {} bytes",
      fixture.name, probe.batch_size, check.fits() ? "fits" : "does not fit", gpu.name,
      probe.ranks.empty() ? "" : ", per rank", check.required, probe.components.step_peak_reserved,
      probe.library_workspace_bytes,
      probe.communicator_bytes > 0 ? fmt::format(" + NCCL communicators {}", probe.communicator_bytes) : "",
      gpu.outside_allocator_bytes, check.available, gpu.usable_fraction, gpu.memory_bytes,
      check.fits() ? "headroom" : "over by", check.fits() ? check.headroom() : -check.headroom());
  return v;
}

RecordedBaseline record_fixture(const Fixture& fixture, std::span<const std::int64_t> batch_sizes, c10::Device device,
                                const std::string& baselines_dir, const ProbeOptions& options) {
  auto probes = run_probes(fixture, batch_sizes, device, options);
  for (const auto& probe : probes) {
    if (probe.oom) {
      throw Error(fmt::format("{} at batch {} ran out of memory: there is nothing to record.\n{}", fixture.name,
                              probe.batch_size, probe.error));
    }
  }
  const auto info = describe_probe_device(device, fixture);
  RecordedBaseline recorded{baseline_path(baselines_dir, info.slug, fixture.name), false};
  recorded.changed = update_baseline(recorded.path, fixture, info, probes, source_commit(project_dir()));
  return recorded;
}

FixtureVerdicts judge_fixture(const Fixture& fixture, std::span<const std::int64_t> batch_sizes, c10::Device device,
                              const std::string& baselines_dir, std::span<const std::int64_t> extra_batch_sizes,
                              const ProbeOptions& options) {
  FixtureVerdicts out;
  out.device = describe_probe_device(device, fixture);
  out.baseline_file = baseline_path(baselines_dir, out.device.slug, fixture.name);
  std::optional<Baseline> baseline;
  if (std::filesystem::exists(out.baseline_file)) baseline = load_baseline(out.baseline_file, fixture.name, out.device.slug);
  // A missing or changed baseline is judged without a probe: the verdict needs no numbers.
  const auto judged = [&](std::int64_t batch_size) {
    const auto* recorded = baseline ? baseline->find(batch_size) : nullptr;
    return recorded != nullptr && recorded->fixture_hash() == fixture.hash;
  };
  // What to measure, each once, in order (the budgets' batch sizes last), in one run_probes: a Python fixture's
  // probes then share one Python process.
  std::vector<std::int64_t> measured;
  const auto add = [&](std::int64_t b) {
    if (std::find(measured.begin(), measured.end(), b) == measured.end()) measured.push_back(b);
  };
  for (const auto batch_size : batch_sizes) {
    if (judged(batch_size)) add(batch_size);
  }
  for (const auto batch_size : extra_batch_sizes) add(batch_size);
  out.probes = run_probes(fixture, measured, device, options);
  for (const auto batch_size : batch_sizes) {
    ProbeResult unmeasured;
    unmeasured.batch_size = batch_size;
    const ProbeResult probe = judged(batch_size) ? *find_probe(out, batch_size) : unmeasured;
    // A distributed fixture is gated rank by rank: each rank's components against that rank's record.
    const auto ranks = fixture.training.distributed.enabled() ? fixture.training.distributed.world_size : 0;
    for (std::int64_t r = 0; r < std::max<std::int64_t>(ranks, 1); ++r) {
      for (const auto& info : kComponentTable) {
        const auto name = ranks > 0 ? rank_component_name(static_cast<int>(r), info.name) : std::string(info.name);
        out.components.push_back(
            evaluate_component(fixture, probe, name, baseline ? &*baseline : nullptr, out.baseline_file, out.device));
      }
    }
  }
  return out;
}

const ProbeResult* find_probe(const FixtureVerdicts& verdicts, std::int64_t batch_size) {
  for (const auto& p : verdicts.probes) {
    if (p.batch_size == batch_size) return &p;
  }
  return nullptr;
}

}  // namespace memgate
