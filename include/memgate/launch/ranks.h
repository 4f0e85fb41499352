// Probes in processes of their own: the distributed probe (one process per rank, started from a program whose main()
// runs ranks, rank_main; on the Meta device, the ranks in turn in this process), and a Python fixture's probe in a
// Python process that imports memgate's extension (`python -m memgate`).
#pragma once

#include "memgate/estimate/meta_kernels.h"
#include "memgate/launch/result.h"
#include "memgate/measure/probe.h"

#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace memgate {

/// A distributed workload's probe: starts one process per rank (MEMGATE_RANK_EXECUTABLE, else this program, run as
/// `<program> --memgate-rank --request FILE` (launch/request.h), which must call rank_main(): the memgate CLI and the
/// memory suites do), which meet through a c10d::FileStore in a folder of the probe's own and each measure their own
/// components with the probe's protocol; gathers them into `ranks`, and the largest of each into `components`. A
/// rank that fails stops the others and is an error naming it, with what it printed. run_probe() calls it.
[[nodiscard]] ProbeResult run_distributed_probe(const Workload& workload, std::int64_t batch_size, c10::Device device,
                                                const ProbeOptions& options = {});

/// Whether `workload` is a Python fixture (arch: python) and this process cannot build it (no `here`: what memgate's
/// extension lends a Python process, ProbeOptions::python): its probes then run in a Python process
/// (run_python_probe). False in the Python process itself, whose rank_main passes it.
[[nodiscard]] bool runs_in_python(const Workload& workload, const PythonRuntime* here = nullptr);

/// A Python fixture's whole probe in a Python process of its own: the fixture's `python:`, else MEMGATE_PYTHON, else
/// python3, running `-m memgate --memgate-rank --request FILE` with memgate's package first on PYTHONPATH
/// (MEMGATE_PYTHONPATH, else this build's). It measures on `device` (its allocator capped at `cap_bytes` when > 0)
/// or, with `estimate`, estimates for that target on the Meta device; a distributed fixture's ranks are estimated in
/// it, or started from it. The result carries the model's parameter counts. A process that fails is an error naming
/// the fixture, the Python and the cause it printed (the Python error's last line for the user's code).
[[nodiscard]] ProbeResult run_python_probe(const Workload& workload, std::int64_t batch_size, c10::Device device,
                                           const ProbeOptions& options, std::optional<EstimateTarget> estimate,
                                           std::int64_t cap_bytes = 0);

/// run_python_probe at each of `batch_sizes` in turn, all in one Python process (its imports, several seconds with
/// the user's libraries, paid once); the next batch size still runs after an out-of-memory, as in one process of
/// the zoo's. A process that fails is an error naming the batch size it was at.
[[nodiscard]] std::vector<ProbeResult> run_python_probes(const Workload& workload,
                                                         std::span<const std::int64_t> batch_sizes, c10::Device device,
                                                         const ProbeOptions& options,
                                                         std::optional<EstimateTarget> estimate,
                                                         std::int64_t cap_bytes = 0);

/// A Python fixture's whole search of the largest batches by estimate for CUDA, in one Python process (its request's
/// `search`, which child/rank.h's rank_main runs), `request` its input and the answer's text returned: every estimate
/// of the search from one built module (PythonRuntime::reuse_builds). A process that fails is an error naming the
/// fixture.
[[nodiscard]] std::string run_python_search(const Workload& workload, const std::string& request,
                                            const ProbeOptions& options = {});

/// A Python fixture's checkpointable blocks and the FLOPs of its steps (plan/flops.h's count_checkpoint_flops), counted
/// in one Python process, where its model is built and its blocks run (its request's `flops`, which child/rank.h's
/// rank_main runs). `request` its input, the answer's text returned. A process that fails is an error naming the
/// fixture.
[[nodiscard]] std::string run_python_flops(const Workload& workload, const std::string& request,
                                           const ProbeOptions& options = {});

/// For an estimate of a distributed workload's ranks: for each rank, the first rank that makes the same requests (its
/// own index when none before it does), which the estimate reuses. DDP's ranks are all rank 0's; FSDP's are alike when
/// they own the same number of rows of every parameter's dim-0 chunk.
[[nodiscard]] std::vector<int> rank_kinds(const Workload& workload, int world, const PythonRuntime* python = nullptr);

/// Says that this program's main() runs a rank when started with --memgate-rank (child/rank.h's is_rank_command
/// calls it): distributed probes then start their ranks from this program, with its registered architectures.
void declare_rank_host();

}  // namespace memgate
