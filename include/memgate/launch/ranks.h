// The distributed probe: one process per rank, started from a program whose main() runs ranks (rank_main), each
// measuring its own components; on the Meta device, the ranks in turn in this process.
#pragma once

#include "memgate/measure/probe.h"

#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace memgate {

/// A distributed workload's probe: starts one process per rank (MEMGATE_RANK_EXECUTABLE, else this program, run as
/// `<program> --memgate-rank --fixture <workload.source> ...`, which must call rank_main(): the memgate CLI and the
/// memory suites do), which meet through a c10d::FileStore in a folder of the probe's own and each measure their own
/// components with the probe's protocol; gathers them into `ranks`, and the largest of each into `components`. A
/// rank that fails stops the others and is an error naming it, with what it printed. run_probe() calls it.
[[nodiscard]] ProbeResult run_distributed_probe(const Workload& workload, std::int64_t batch_size, c10::Device device,
                                                const ProbeOptions& options = {});

/// What a rank's process leaves for run_distributed_probe: its result as one JSON object.
[[nodiscard]] std::string rank_result_text(int rank, const ProbeResult& result);

/// Says that this program's main() runs a rank when started with --memgate-rank (gate/rank.h's is_rank_command
/// calls it): distributed probes then start their ranks from this program, with its registered architectures.
void declare_rank_host();

}  // namespace memgate
