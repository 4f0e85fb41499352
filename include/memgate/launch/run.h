// Where a probe runs: in this process (measure_probe), or, for a distributed workload, as one process per rank
// (launch/ranks.h); capped, and over several batch sizes (a profile). What the gate, the advice and the CLI call.
#pragma once

#include "memgate/measure/probe.h"

#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace memgate {

/// Where a probe runs, decided once for it (place_of), each place with one runner: in this process (measure_probe),
/// in a Python process of its own (a Python fixture's whole probe: run_python_probes), as one process per rank (a
/// distributed workload: run_distributed_probe), or on the Meta device in this process, its ranks in turn (a
/// distributed workload's estimate: run_distributed_probe on the Meta device).
enum class Place { kHere, kPython, kRanks, kMetaRanks };

/// Where the probe of `workload` on `device` runs: in this process for a rank of a group (`options.rank_group`);
/// in a Python process for a Python fixture this process cannot build, unless its ranks are measured (each rank is
/// then a Python process); else its ranks for a distributed workload; else here.
[[nodiscard]] Place place_of(const Workload& workload, c10::Device device, const ProbeOptions& options = {});

/// Measures one workload at one batch size: in this process (measure_probe), or for a distributed workload
/// (without `options.rank_group`) by starting its ranks (run_distributed_probe). An out-of-memory is returned as
/// `oom`, not thrown; bad input throws memgate::Error. Everything the probe allocated is freed (and the cache
/// emptied) before it returns.
[[nodiscard]] ProbeResult run_probe(const Workload& workload, std::int64_t batch_size, c10::Device device,
                                    const ProbeOptions& options = {});

/// run_probe() with the device's allocator capped at `cap_bytes` (CUDA: the caching allocator's memory fraction of
/// the device; CPU: the counting allocator's limit, above what the process holds already): a step that needs more
/// runs out of memory. A distributed probe caps each rank's allocator at `cap_bytes`. The cap is lifted afterwards,
/// however the probe ends.
[[nodiscard]] ProbeResult run_probe_capped(const Workload& workload, std::int64_t batch_size, c10::Device device,
                                           std::int64_t cap_bytes, const ProbeOptions& options = {});

/// Told before each probe of a profile (`done` null) and after it (its result): for progress.
using ProbeCallback = std::function<void(std::size_t index, std::int64_t batch_size, const ProbeResult* done)>;

/// run_probe at each of `batch_sizes` in turn (the next still runs after an out-of-memory). A Python fixture on one
/// device probes them all in one Python process (run_python_probes): its imports are paid once.
[[nodiscard]] std::vector<ProbeResult> run_probes(const Workload& workload, std::span<const std::int64_t> batch_sizes,
                                                  c10::Device device, const ProbeOptions& options = {});

/// A profile's probes, from `probe` (which probes the batch sizes it is given): all at once when `in_one_process`,
/// else one batch size at a time; `on_probe` is told before each (before the first only, at once) and after each.
/// With `keep_going`, an error `probe` throws for one batch size is that probe's result (ProbeResult::failed) and
/// the next batch sizes still run. run_profile and estimate_profile share it.
[[nodiscard]] Profile collect_profile(const std::vector<std::int64_t>& batch_sizes, bool in_one_process,
                                      const std::function<std::vector<ProbeResult>(std::span<const std::int64_t>)>& probe,
                                      const ProbeCallback& on_probe, Profile profile, bool keep_going = false);

/// Probes each batch size in turn (the next batch size still runs after an out-of-memory, and with
/// `options.keep_going` after any error: that batch size is reported as failed).
[[nodiscard]] Profile run_profile(const Workload& workload, const std::vector<std::int64_t>& batch_sizes,
                                  c10::Device device, const ProbeOptions& options = {},
                                  const ProbeCallback& on_probe = {});

}  // namespace memgate
