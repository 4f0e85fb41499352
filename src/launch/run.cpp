// Where a probe runs: in this process, or as one process per rank for a distributed workload; capped; profiles.
#include "memgate/launch/run.h"

#include "memgate/backend/cpu_allocator.h"
#include "memgate/backend/device.h"
#include "memgate/backend/memory_backend.h"
#include "memgate/base/error.h"
#include "memgate/launch/ranks.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <functional>
#include <span>
#include <utility>
#include <vector>

namespace memgate {

Place place_of(const Workload& workload, c10::Device device, const ProbeOptions& options) {
  if (options.rank_group != nullptr) return Place::kHere;
  const bool distributed = workload.training.distributed.enabled();
  // A Python fixture's whole probe in a Python process of its own (a distributed one's ranks each run in one, started
  // by run_distributed_probe; on the Meta device the process estimates them).
  if (runs_in_python(workload, options.python) && (device.is_meta() || !distributed)) return Place::kPython;
  if (distributed) return device.is_meta() ? Place::kMetaRanks : Place::kRanks;
  return Place::kHere;
}

ProbeResult run_probe(const Workload& workload, std::int64_t batch_size, c10::Device device,
                      const ProbeOptions& options) {
  switch (place_of(workload, device, options)) {
    case Place::kPython:
      return run_python_probe(workload, batch_size, device, options, std::nullopt);
    case Place::kRanks:
    case Place::kMetaRanks:
      return run_distributed_probe(workload, batch_size, device, options);
    case Place::kHere:
      break;
  }
  return measure_probe(workload, batch_size, device, options);
}

ProbeResult run_probe_capped(const Workload& workload, std::int64_t batch_size, c10::Device device,
                             std::int64_t cap_bytes, const ProbeOptions& options) {
  if (cap_bytes <= 0) throw Error(workload.source + ": an allocator cap must be a positive number of bytes");
  const auto place = place_of(workload, device, options);
  if (place == Place::kRanks) {
    // Each rank is a process of its own: the cap goes to each of them.
    auto capped = options;
    capped.rank_cap_bytes = cap_bytes;
    return run_distributed_probe(workload, batch_size, device, capped);
  }
  if (place == Place::kPython) return run_python_probe(workload, batch_size, device, options, std::nullopt, cap_bytes);
  if (device.is_cpu()) {
    auto& counter = CountingCpuAllocator::install();
    struct Restore {
      CountingCpuAllocator& counter;
      std::int64_t previous;
      ~Restore() { counter.set_limit(previous); }
    } restore{counter, counter.limit()};
    counter.set_limit(counter.current_bytes() + cap_bytes);
    return run_probe(workload, batch_size, device, options);
  }
  const auto total = device_total_memory(device);
  if (total <= 0) throw Error("cannot cap " + device.str() + ": its memory size is unknown");
  auto backend = make_memory_backend(device);
  const MemoryFractionScope capped(*backend, std::min(1.0, static_cast<double>(cap_bytes) / static_cast<double>(total)));
  return run_probe(workload, batch_size, device, options);
}


std::vector<ProbeResult> run_probes(const Workload& workload, std::span<const std::int64_t> batch_sizes,
                                    c10::Device device, const ProbeOptions& options) {
  if (place_of(workload, device, options) == Place::kPython) {
    return run_python_probes(workload, batch_sizes, device, options, std::nullopt);
  }
  std::vector<ProbeResult> results;
  for (const auto batch_size : batch_sizes) results.push_back(run_probe(workload, batch_size, device, options));
  return results;
}

Profile collect_profile(const std::vector<std::int64_t>& batch_sizes, bool in_one_process,
                        const std::function<std::vector<ProbeResult>(std::span<const std::int64_t>)>& probe,
                        const ProbeCallback& on_probe, Profile profile, bool keep_going) {
  if (in_one_process && batch_sizes.size() > 1) {
    // One process probes them all: told before the first, then after each.
    if (on_probe) on_probe(0, batch_sizes.front(), nullptr);
    profile.probes = probe(batch_sizes);
    for (std::size_t i = 0; i < profile.probes.size(); ++i) {
      if (profile.probes[i].param_counts) profile.params = *profile.probes[i].param_counts;
      if (on_probe) on_probe(i, batch_sizes[i], &profile.probes[i]);
    }
    return profile;
  }
  for (std::size_t i = 0; i < batch_sizes.size(); ++i) {
    if (on_probe) on_probe(i, batch_sizes[i], nullptr);
    try {
      profile.probes.push_back(std::move(probe(std::span(batch_sizes).subspan(i, 1)).front()));
    } catch (const std::exception& e) {
      if (!keep_going) throw;
      // The model's error at this batch size: reported as this probe's, and the next batch sizes still run.
      ProbeResult failed;
      failed.batch_size = batch_sizes[i];
      failed.failed = true;
      const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
      failed.error = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
      profile.probes.push_back(std::move(failed));
    }
    if (profile.probes.back().param_counts) profile.params = *profile.probes.back().param_counts;
    if (on_probe) on_probe(i, batch_sizes[i], &profile.probes.back());
  }
  return profile;
}

Profile run_profile(const Workload& workload, const std::vector<std::int64_t>& batch_sizes, c10::Device device,
                    const ProbeOptions& options, const ProbeCallback& on_probe) {
  Profile profile;
  profile.device = describe_probe_device(device, workload, options);
  profile.fixture = workload.name;
  // A Python fixture's model is built in its probes' Python process, which counts its parameters.
  if (!runs_in_python(workload)) profile.params = workload_param_counts(workload);
  return collect_profile(
      batch_sizes, place_of(workload, device, options) == Place::kPython,
      [&](std::span<const std::int64_t> sizes) { return run_probes(workload, sizes, device, options); }, on_probe,
      std::move(profile), options.keep_going);
}

}  // namespace memgate
