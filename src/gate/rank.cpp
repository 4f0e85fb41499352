// One probe of a fixture in a process of its own: a rank of a distributed probe, or the whole probe of a Python
// fixture in a Python process (python -m memgate), started by the launcher (launch/ranks.h).
#include "memgate/gate/rank.h"

#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/distributed/process_group.h"
#include "memgate/gate/fixture.h"
#include "memgate/launch/estimate.h"
#include "memgate/launch/ranks.h"
#include "memgate/launch/run.h"
#include "memgate/measure/probe.h"

#include <fmt/format.h>

#include <chrono>
#include <exception>
#include <iostream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

namespace memgate {
namespace {

// How long a rank waits for the others: to join, and in any one collective.
constexpr std::chrono::seconds kRankTimeout{300};

std::int64_t to_int(const std::map<std::string, std::string>& args, const std::string& key) {
  const auto it = args.find(key);
  if (it == args.end()) throw std::invalid_argument("--" + key + " is required");
  std::size_t used = 0;
  const auto value = std::stoll(it->second, &used);
  if (used != it->second.size()) throw std::invalid_argument("--" + key + ": expected an integer, got " + it->second);
  return value;
}

}  // namespace

bool is_rank_command(int argc, char** argv) {
  declare_rank_host();
  return argc > 1 && std::string(argv[1]) == "--memgate-rank";
}

int rank_main(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    if (!key.starts_with("--")) {
      std::cerr << "memgate rank: expected --key value pairs, got '" << key << "'\n";
      return 2;
    }
    args[key.substr(2)] = argv[i + 1];
  }
  int rank = -1;
  try {
    for (const auto* key : {"fixture", "output"}) {
      if (!args.contains(key)) throw std::invalid_argument(std::string("--") + key + " is required");
    }
    rank = static_cast<int>(to_int(args, "rank"));
    const auto world = static_cast<int>(to_int(args, "world-size"));
    const auto batch_size = to_int(args, "batch-size");
    auto fixture = load_fixture(args["fixture"]);
    override_cpu_kernels(fixture, args["cpu-kernels"], "--cpu-kernels");
    // With a store this process is one rank of a distributed probe; without, it runs the whole probe (a Python
    // fixture's, in a Python process): on a device, capped or not, or as an estimate on the Meta device.
    const bool is_rank = args.contains("store");
    if (is_rank && !fixture.training.distributed.enabled()) {
      throw Error(fmt::format("{}: trains on one device (no training.distributed block), yet a rank of {} was started",
                              fixture.source, world));
    }
    // The probe's world size: the fixture's, or what `--world-size` set for the run (estimate, advise).
    if (fixture.training.distributed.enabled()) fixture.training.distributed.world_size = world;
    ProbeOptions options;
    if (args.contains("warmup-steps")) options.warmup_steps = static_cast<int>(to_int(args, "warmup-steps"));
    if (args.contains("cpu-threads")) options.cpu_threads = static_cast<int>(to_int(args, "cpu-threads"));
    if (args.contains("seed")) options.seed = static_cast<std::uint64_t>(to_int(args, "seed"));
    if (args.contains("snapshot")) options.snapshot = SnapshotOptions{};
    const auto cap = args.contains("cap-bytes") ? to_int(args, "cap-bytes") : 0;
    // The whole probe reports the model's parameter counts. They are counted first, on the Meta device: a Python
    // model's imports (modules whose import allocates tensors, PEFT's among them) then happen before the probe, as in
    // a training script, and are not counted as the model's (its ranks count them for that alone).
    std::optional<ParamCounts> counts;
    if (!is_rank || fixture.model.arch == Arch::kPython) counts = workload_param_counts(fixture);
    ProbeResult result;
    if (args.contains("estimate-for")) {
      const auto& target = args["estimate-for"];
      if (target != "cpu" && target != "cuda") throw std::invalid_argument("--estimate-for: expected cpu or cuda");
      result = estimate_probe(fixture, batch_size, target == "cpu" ? EstimateTarget::kCpu : EstimateTarget::kCuda,
                              options);
    } else {
      // The CPU (Gloo), or the GPU of this rank's own (NCCL): cuda:N, which the probe gave it.
      const c10::Device device(args.contains("device") ? args["device"] : std::string("cpu"));
      if (!device.is_cpu() && !(device.is_cuda() && device.has_index())) {
        throw std::invalid_argument("--device: expected cpu or cuda:N, got " + args["device"]);
      }
      std::optional<RankGroup> group;
      if (is_rank) {
        group = device.is_cuda() ? join_nccl_group(args["store"], rank, world, device, kRankTimeout)
                                 : join_gloo_group(args["store"], rank, world, kRankTimeout);
        options.rank_group = &*group;
      }
      result = cap > 0 ? run_probe_capped(fixture, batch_size, device, cap, options)
                       : run_probe(fixture, batch_size, device, options);
      if (group) {
        result.communicator_bytes = communicator_bytes();
        shut_down_nccl(*group);
      }
    }
    if (!is_rank) result.param_counts = counts;
    if (args.contains("snapshot")) {
      if (!result.snapshot.empty()) write_file_atomically(args["snapshot"], result.snapshot);
      for (std::size_t r = 0; r < result.rank_snapshots.size(); ++r) {
        write_file_atomically(fmt::format("{}.rank{}", args["snapshot"], r), result.rank_snapshots[r]);
      }
    }
    write_file_atomically(args["output"], rank_result_text(rank, result));
    return 0;
  } catch (const std::invalid_argument& e) {
    std::cerr << "memgate rank: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "memgate rank " << rank << ": " << e.what() << "\n";
    return 3;
  }
}

}  // namespace memgate
