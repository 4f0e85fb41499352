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

namespace {
// Shell-quoted where a path needs it, so that the command can be pasted as printed.
std::string quoted(const std::string& text) {
  if (!text.empty() && text.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@") ==
                           std::string::npos) {
    return text;
  }
  std::string out = "'";
  for (const char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

bool is_peak(std::string_view component) {
  const auto ranked = parse_rank_component(component);
  const std::string_view name = ranked ? std::string_view(ranked->second) : component;
  return name == "forward_peak" || name == "eval_peak" || name == "step_peak" || name == "step_peak_reserved";
}
}  // namespace

std::string record_command(const Fixture& fixture, const DeviceInfo& device, const RecordCommand& c) {
  if (c.cli) {
    auto out = fmt::format("{}memgate check --update-baselines --config {}",
                           device.cpu_kernels == "host" ? "MEMGATE_CPU_KERNELS=host " : "", quoted(fixture.source));
    if (!c.baselines_dir.empty()) out += " --baselines " + quoted(c.baselines_dir);
    if (!c.device.empty() && c.device != "auto") out += " --device " + quoted(c.device);
    return out;
  }
  return fmt::format("{}ctest --preset {}", device.cpu_kernels == "host" ? "MEMGATE_CPU_KERNELS=host " : "",
                     device.device.is_cuda() ? "update-baselines-gpu" : "update-baselines");
}

std::size_t compared_components(std::span<const ComponentVerdict> verdicts) {
  return static_cast<std::size_t>(std::count_if(verdicts.begin(), verdicts.end(), [](const ComponentVerdict& v) {
    return v.status == Status::kOk || v.status == Status::kRegression || v.status == Status::kStale ||
           v.status == Status::kNotRepeatable;
  }));
}

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
                                    const DeviceInfo& device, const RecordCommand& record_with) {
  ComponentVerdict v;
  v.fixture = fixture.name;
  v.batch_size = probe.batch_size;
  v.component = std::string(component);
  const bool cuda = device.device.is_cuda();
  const auto record = record_command(fixture, device, record_with);
  // The folder to commit: baselines/<slug>/ as the project lays it out, else the folder --baselines named.
  const auto folder = std::filesystem::path(baseline_file).parent_path();
  const auto how = fmt::format("record them with: {} (then commit {}/)", record,
                               folder.parent_path().filename() == "baselines" && !record_with.cli
                                   ? "baselines/" + device.slug
                                   : folder.string());
  const auto* recorded = baseline != nullptr ? baseline->find(probe.batch_size) : nullptr;
  if (recorded == nullptr) {
    v.status = Status::kMissing;
    v.message = baseline == nullptr
                    ? fmt::format("no baseline {} for device {} (looked in {}): {}", baseline_file, device.slug,
                                  std::filesystem::absolute(std::filesystem::path(baseline_file).parent_path())
                                      .lexically_normal()
                                      .string(),
                                  how)
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
  if (const auto* info = find_component(name); info != nullptr && recorded->fixture_hash() == fixture.hash &&
                                               !has_component(recorded->components, *info)) {
    v.status = Status::kMissing;  // `ema`, recorded before the fixture kept an EMA copy
    v.message = fmt::format("{} (batch {}) has no {}: {}", baseline_file, probe.batch_size, name, how);
    return v;
  }
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
  auto cmp = compare_component(
      fixture.name, probe.batch_size, ranked ? fmt::format("rank {}'s {}", ranked->first, name) : name, *v.baseline,
      measured_rank != nullptr ? measured_rank->components.get(name) : probe.components.get(component), tolerance);
  cmp.record_command = record;
  v.measured = cmp.measured;
  v.allowed = cmp.allowed;
  switch (cmp.verdict) {
    case Verdict::kWithin: v.status = Status::kOk; break;
    case Verdict::kRegression: v.status = Status::kRegression; break;
    case Verdict::kStale: v.status = Status::kStale; break;
  }
  v.message = cmp.message() + provenance;
  // Which modules moved: the breakdowns of the baseline and of this probe, where both have one of this component.
  if (const auto* then = ranked ? nullptr : recorded->modules.find(component),
      *now = ranked ? nullptr : probe.modules.find(component);
      now != nullptr) {
    std::string by_module;
    if (then != nullptr) {
      auto changes = module_changes(*then, *now);
      if (!changes.empty()) by_module = "\n  by module: " + describe_module_changes(changes);
      if (changes.size() > kModuleChangesKept) changes.resize(kModuleChangesKept);
      v.modules = std::move(changes);
    } else {
      by_module = fmt::format("\n  by module: the baseline has no per-module breakdown of {}; record it again to name "
                              "the modules that change",
                              component);
    }
    if (v.status != Status::kOk && !by_module.empty()) {
      // After the numbers, before what to do.
      auto at = v.message.find("\n  If this growth");
      if (at == std::string::npos) at = v.message.find("\n  Memory went down");
      v.message.insert(at == std::string::npos ? v.message.size() : at, by_module);
    }
  }
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
      "{} at batch {} {} {}{}: needs {} bytes (step_peak_reserved {} + library workspaces {}{}), usable {} ({} "
      "bytes: memory {} x {} - outside the allocator {}); {} {} bytes",
      fixture.name, probe.batch_size, check.fits() ? "fits" : "does not fit", gpu.name,
      probe.ranks.empty() ? "" : ", per rank", check.required, probe.components.step_peak_reserved,
      probe.library_workspace_bytes,
      probe.communicator_bytes > 0 ? fmt::format(" + NCCL communicators {}", probe.communicator_bytes) : "",
      format_usable(check.available), check.available, gpu.memory_bytes, gpu.usable_fraction,
      gpu.outside_allocator_bytes, check.fits() ? "headroom" : "over by",
      check.fits() ? check.headroom() : -check.headroom());
  return v;
}

namespace {

// The components (a rank's as rankN_<name>) whose bytes differ between two measurements of one probe: name, first,
// second.
struct Difference {
  std::string component;
  std::int64_t first = 0;
  std::int64_t second = 0;
};
std::vector<Difference> differences_between(const ProbeResult& a, const ProbeResult& b) {
  std::vector<Difference> out;
  if (a.oom || b.oom) return out;  // an out-of-memory has no components
  for (const auto& info : kComponentTable) {
    if (!has_component(a.components, info) && !has_component(b.components, info)) continue;
    const auto x = a.components.get(info.name), y = b.components.get(info.name);
    if (x != y) out.push_back({std::string(info.name), x, y});
  }
  for (const auto& ra : a.ranks) {
    const auto* rb = find_rank(b.ranks, ra.rank);
    if (rb == nullptr) continue;
    for (const auto& info : kComponentTable) {
      if (!has_component(ra.components, info) && !has_component(rb->components, info)) continue;
      const auto x = ra.components.get(info.name), y = rb->components.get(info.name);
      if (x != y) out.push_back({rank_component_name(ra.rank, info.name), x, y});
    }
  }
  return out;
}

std::string describe_differences(const std::vector<Difference>& differences) {
  std::string out;
  for (const auto& d : differences) {
    out += fmt::format("{}{} {} then {} bytes ({:+})", out.empty() ? "" : "; ", d.component, d.first, d.second,
                       d.second - d.first);
  }
  return out;
}

}  // namespace

RecordedBaseline record_fixture(const Fixture& fixture, std::span<const std::int64_t> batch_sizes, c10::Device device,
                                const std::string& baselines_dir, const ProbeOptions& options) {
  auto probes = run_probes(fixture, batch_sizes, device, options);
  for (const auto& probe : probes) {
    if (probe.oom) {
      throw Error(fmt::format("{} at batch {} ran out of memory: there is nothing to record.\n{}", fixture.name,
                              probe.batch_size, probe.error));
    }
  }
  // A baseline is a promise that the same probe gives the same bytes: each probe is measured a second time, from a
  // process or a base of its own, and bytes that differ are refused rather than recorded as truth.
  const auto again = run_probes(fixture, batch_sizes, device, options);
  std::string refused;
  for (std::size_t i = 0; i < probes.size() && i < again.size(); ++i) {
    if (again[i].oom) {
      refused += fmt::format("\n  batch {}: ran out of memory the second time, not the first", again[i].batch_size);
      continue;
    }
    const auto differences = differences_between(probes[i], again[i]);
    if (!differences.empty()) {
      refused += fmt::format("\n  batch {}: {}", probes[i].batch_size, describe_differences(differences));
    }
  }
  if (!refused.empty()) {
    throw Error(fmt::format(
        "{}: not repeatable, nothing recorded: measured twice, these components differ{}\n  A baseline must be the "
        "bytes every run gives: look for what differs between runs (unseeded randomness in the model or the batch, "
        "data-dependent shapes, a cache that fills as it runs).",
        fixture.source, refused));
  }
  const auto info = describe_probe_device(device, fixture);
  RecordedBaseline recorded{baseline_path(baselines_dir, info.slug, fixture.name), false};
  recorded.changed = update_baseline(recorded.path, fixture, info, probes, source_commit(project_dir()));
  return recorded;
}

FixtureVerdicts judge_fixture(const Fixture& fixture, std::span<const std::int64_t> batch_sizes, c10::Device device,
                              const std::string& baselines_dir, std::span<const std::int64_t> extra_batch_sizes,
                              const ProbeOptions& options, const RecordCommand& record) {
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
        if (!keeps_component(fixture.training, info)) continue;
        const auto name = ranks > 0 ? rank_component_name(static_cast<int>(r), info.name) : std::string(info.name);
        out.components.push_back(
            evaluate_component(fixture, probe, name, baseline ? &*baseline : nullptr, out.baseline_file, out.device,
                               record));
      }
    }
  }
  // A component that moved beyond its tolerance is measured a second time before it is believed: bytes that differ
  // between two runs of one probe are "not repeatable", not a regression or a stale baseline.
  std::vector<std::int64_t> again;
  for (const auto& v : out.components) {
    if ((v.status == Status::kRegression || v.status == Status::kStale) &&
        std::find(again.begin(), again.end(), v.batch_size) == again.end()) {
      again.push_back(v.batch_size);
    }
  }
  if (!again.empty()) {
    const auto second = run_probes(fixture, again, device, options);
    for (const auto& probe : second) {
      const auto* first = find_probe(out, probe.batch_size);
      if (first == nullptr) continue;
      for (const auto& d : differences_between(*first, probe)) {
        for (auto& v : out.components) {
          if (v.batch_size != probe.batch_size || v.component != d.component || !v.baseline) continue;
          v.status = Status::kNotRepeatable;
          v.measured = d.first;
          v.message = fmt::format(
              "{} at batch {}: {} is not repeatable: two measurements of the same probe gave {} and {} bytes ({:+}); "
              "its baseline is {} bytes. The gate cannot judge bytes that move between runs: look for what differs "
              "(unseeded randomness in the model or the batch, data-dependent shapes, a cache that fills as it "
              "runs). Nothing else of this probe is believed until it repeats.",
              fixture.name, probe.batch_size, d.component, d.first, d.second, d.second - d.first, *v.baseline);
        }
      }
    }
  }
  // A component that shrank while a peak of the same probe grew beyond its tolerance: memory moved, it did not go
  // down, and recording "the smaller baseline" would record the grown peak with it.
  for (auto& v : out.components) {
    if (v.status != Status::kStale) continue;
    std::string grown;
    for (const auto& p : out.components) {
      if (p.batch_size == v.batch_size && p.status == Status::kRegression && is_peak(p.component) && p.baseline &&
          p.measured) {
        grown += fmt::format("{}{} {:+} bytes", grown.empty() ? "" : ", ", p.component, *p.measured - *p.baseline);
      }
    }
    if (grown.empty()) continue;
    const auto at = v.message.find("\n  Memory went down:");
    if (at != std::string::npos) v.message.erase(at, v.message.find('\n', at + 1) - at);
    v.message += fmt::format(
        "\n  Do not record this smaller baseline on its own: at the same batch size {} grew beyond tolerance, so "
        "memory moved rather than went down. Fix or accept the regression first.",
        grown);
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
