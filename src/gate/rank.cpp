// One rank of a distributed probe, in its own process.
#include "memgate/gate/rank.h"

#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/gate/fixture.h"
#include "memgate/distributed/process_group.h"
#include "memgate/measure/probe.h"
#include "memgate/launch/run.h"
#include "memgate/launch/ranks.h"

#include <fmt/format.h>

#include <chrono>
#include <exception>
#include <iostream>
#include <map>
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
    for (const auto* key : {"fixture", "store", "output"}) {
      if (!args.contains(key)) throw std::invalid_argument(std::string("--") + key + " is required");
    }
    rank = static_cast<int>(to_int(args, "rank"));
    const auto world = static_cast<int>(to_int(args, "world-size"));
    const auto batch_size = to_int(args, "batch-size");
    auto fixture = load_fixture(args["fixture"]);
    override_cpu_kernels(fixture, args["cpu-kernels"], "--cpu-kernels");
    if (!fixture.training.distributed.enabled()) {
      throw Error(fmt::format("{}: trains on one device (no training.distributed block), yet a rank of {} was started",
                              fixture.source, world));
    }
    // The probe's world size: the fixture's, or what `--world-size` set for the run (estimate, advise).
    fixture.training.distributed.world_size = world;
    ProbeOptions options;
    if (args.contains("warmup-steps")) options.warmup_steps = static_cast<int>(to_int(args, "warmup-steps"));
    if (args.contains("cpu-threads")) options.cpu_threads = static_cast<int>(to_int(args, "cpu-threads"));
    if (args.contains("seed")) options.seed = static_cast<std::uint64_t>(to_int(args, "seed"));
    if (args.contains("snapshot")) options.snapshot = SnapshotOptions{};
    // The CPU (Gloo), or the GPU of this rank's own (NCCL): cuda:N, which the probe gave it.
    const c10::Device device(args.contains("device") ? args["device"] : std::string("cpu"));
    if (!device.is_cpu() && !(device.is_cuda() && device.has_index())) {
      throw std::invalid_argument("--device: expected cpu or cuda:N, got " + args["device"]);
    }
    const auto group = device.is_cuda() ? join_nccl_group(args["store"], rank, world, device, kRankTimeout)
                                        : join_gloo_group(args["store"], rank, world, kRankTimeout);
    options.rank_group = &group;
    const auto cap = args.contains("cap-bytes") ? to_int(args, "cap-bytes") : 0;
    auto result = cap > 0 ? run_probe_capped(fixture, batch_size, device, cap, options)
                          : run_probe(fixture, batch_size, device, options);
    result.communicator_bytes = communicator_bytes();
    shut_down_nccl(group);
    if (args.contains("snapshot") && !result.snapshot.empty()) write_file_atomically(args["snapshot"], result.snapshot);
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
