// Starting a probe's memgate children (a distributed probe's ranks, a Python fixture's probe or search): the program
// they run and its environment, the fork server they are forked from, the request each reads. The one way the
// launcher starts a child (ProbeProcesses), for run_python_probes, run_python_search and run_distributed_probe.
#pragma once

#include "children.h"
#include "fork_server.h"

#include "memgate/launch/request.h"
#include "memgate/measure/probe.h"

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace memgate::detail {

/// What every probe process is asked (launch/request.h), but a rank's store and snapshot and what an estimate is for:
/// `batch_sizes` of `workload` as rank `rank` of `world`, its result in `output` (its heartbeat beside it), on
/// `device`, capped at `cap_bytes`, with the options' warm-up, threads, seed, timeout and keep-going, and this
/// process's CPU limit (profile --cpu-memory-limit-mib): a probe in a process of its own runs out of memory at it as
/// one here does.
[[nodiscard]] ProbeRequest probe_request(const Workload& workload, std::span<const std::int64_t> batch_sizes, int rank,
                                         std::int64_t world, const std::filesystem::path& output,
                                         const ProbeOptions& options, std::int64_t cap_bytes,
                                         const std::string& device);

/// What an estimate for `target` is for in a process of its own: this thread's context (the GPU `estimate --gpu`
/// sets), for `target` and the workload's CPU kernels.
[[nodiscard]] EstimateContext estimate_for(const Workload& workload, EstimateTarget target);

/// The memgate children of one probe: started from one program (the rank executable, or a Python fixture's Python
/// running `-m memgate`) with one environment, each forked from that program's fork server where it can, in a run
/// folder of the probe's own, watched together (launch/children.h). Each child is `<program> --memgate-rank --request
/// FILE`, its request written beside its result; its log is `rank<r>.log` in the folder.
class ProbeProcesses {
 public:
  ProbeProcesses(const Workload& workload, std::chrono::seconds timeout);
  [[nodiscard]] const std::filesystem::path& dir() const { return run_.path(); }
  /// The program the children run (for messages).
  [[nodiscard]] const std::string& program() const { return command_.front(); }
  /// Starts the child that runs `request`, called `name` in messages; it has succeeded once it wrote `result`.
  void start(std::string name, const ProbeRequest& request, std::string result);
  /// Children::wait: the first failure, or nothing when each wrote its result.
  [[nodiscard]] std::optional<std::string> wait() { return children_.wait(); }

 private:
  std::vector<std::string> command_;
  std::vector<std::string> env_;
  ForkServer* server_;
  std::vector<std::string> scan_;
  std::string note_;
  RunDir run_;
  Children children_;
};

}  // namespace memgate::detail
