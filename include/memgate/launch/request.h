// What a memgate process asks of a probe's own process (a rank of a distributed probe, a Python fixture's probe): one
// value, written as one JSON file that the child reads (its entry: rank_main). It carries the workload as the parent
// parsed it (the child never reads the fixture's file), what an estimate is for, and everything the probe's options
// say; the child's files (its result, heartbeat, snapshot, a rank's store) are named in it.
#pragma once

#include "memgate/estimate/estimate_context.h"
#include "memgate/measure/train_step.h"

#include <nlohmann/json_fwd.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace memgate {

struct ProbeRequest {
  Workload workload;                      ///< what is trained and how: the fixture as the parent parsed it
  std::vector<std::int64_t> batch_sizes;  ///< probed in turn; a rank probes one
  std::string device = "cpu";             ///< where it measures: cpu or cuda:N (meta: an estimate)
  std::optional<EstimateContext> estimate;  ///< an estimate on the Meta device, for this target and GPU
  std::int64_t cap_bytes = 0;               ///< the device allocator's cap; 0: none
  std::int64_t cpu_limit_bytes = 0;         ///< the counting CPU allocator's limit (profile --cpu-memory-limit-mib)
  int warmup_steps = 1;
  int cpu_threads = 1;
  std::uint64_t seed = 0;
  std::chrono::seconds timeout{0};  ///< how long the probe may make no progress (its own waits end after it)
  bool keep_going = false;          ///< a profile's: an error at one batch size is its result, and the next run
  int rank = 0;                     ///< this process's rank (0 for a whole probe)
  std::int64_t world_size = 1;      ///< the ranks of the probe
  std::string store;                ///< a rank's c10d::FileStore; empty: the whole probe in this process
  std::string output;               ///< its result file (probe_file's per batch size when it probes several)
  std::string heartbeat;            ///< its heartbeat file; empty: none
  std::string snapshot;             ///< where its memory snapshot goes (per batch size as its result); empty: none
  std::optional<std::string> search;  ///< a whole search of the largest batches by estimate: its request's text
  std::optional<std::string> flops;   ///< the blocks and FLOPs `memgate plan` needs (plan/flops.h): its request's text
  /// The memgate that wrote it (to_json writes this one's): the child must be the same memgate.
  std::string memgate_version;
};

/// The request as JSON: every field, the workload's model and training whole.
void to_json(nlohmann::json& j, const ProbeRequest& request);

/// The request from its JSON. Throws memgate::Error naming the key (its path from `request`, e.g.
/// `request.workload.training.lr`) and what was expected for a key missing, of the wrong type or out of range.
void from_json(const nlohmann::json& j, ProbeRequest& request);

/// Writes `request` to `path` (atomically), and reads one back: an error names the file and the key.
void write_probe_request(const std::string& path, const ProbeRequest& request);
[[nodiscard]] ProbeRequest read_probe_request(const std::string& path);

}  // namespace memgate
