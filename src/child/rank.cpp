// One probe of a fixture in a process of its own: a rank of a distributed probe, or the whole probe of a Python
// fixture in a Python process (python -m memgate), started by the launcher (launch/ranks.h).
#include "memgate/child/rank.h"

#include "fork_server_main.h"

#include "memgate/advise/advise.h"
#include "memgate/backend/cpu_allocator.h"
#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/base/heartbeat.h"
#include "memgate/base/signals.h"
#include "memgate/distributed/process_group.h"
#include "memgate/estimate/estimate_context.h"
#include "memgate/gate/fixture.h"
#include "memgate/launch/estimate.h"
#include "memgate/launch/fault_points.h"
#include "memgate/launch/ranks.h"
#include "memgate/launch/request.h"
#include "memgate/launch/run.h"
#include "memgate/measure/probe.h"
#include "memgate/plan/flops.h"

#include <fmt/format.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <exception>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace memgate {
namespace {

// How often a probe process tells its supervisor it is alive and how far its work has got (launch/children.h reads
// it).
constexpr std::chrono::milliseconds kHeartbeatInterval{250};

// A rank's own waits (the store's, Gloo's, NCCL's) end this much after the probe's timeout: the supervisor, which sees
// every rank's progress, ends a stuck probe first and names the rank that stuck first, not a peer whose collective
// timed out waiting on it. They remain for a rank whose supervisor is gone.
constexpr std::chrono::seconds kAfterTheSupervisor{5};

std::int64_t parse_int(const std::string& text, const std::string& key) {
  std::size_t used = 0;
  const auto value = std::stoll(text, &used);
  if (used != text.size()) throw std::invalid_argument("--" + key + ": expected an integer, got " + text);
  return value;
}

}  // namespace

bool is_rank_command(int argc, char** argv) {
  declare_rank_host();
  return argc > 1 && (std::string(argv[1]) == "--memgate-rank" || is_fork_server_command(argc, argv));
}

int rank_main(int argc, char** argv, const PythonRuntime* python) {
  if (is_fork_server_command(argc, argv)) return fork_server_main(argc, argv);
  // `--memgate-rank --request FILE`, and `--parent-pid P` from whoever started it (its launcher or the fork server).
  std::string request_path;
  std::optional<pid_t> parent;
  for (int i = 2; i < argc; i += 2) {
    const std::string key = argv[i];
    if ((key != "--request" && key != "--parent-pid") || i + 1 >= argc) {
      std::cerr << "memgate rank: expected --request FILE [--parent-pid PID], got '" << key << "'\n";
      return 2;
    }
    if (key == "--request") {
      request_path = argv[i + 1];
      continue;
    }
    try {
      parent = static_cast<pid_t>(parse_int(argv[i + 1], "parent-pid"));
    } catch (const std::exception&) {
      std::cerr << "memgate rank: --parent-pid: expected a process id, got '" << argv[i + 1] << "'\n";
      return 2;
    }
  }
  if (request_path.empty()) {
    std::cerr << "memgate rank: --request FILE is required (memgate writes it: launch/request.h)\n";
    return 2;
  }
  // A rank whose peer has gone gets an error from its collective, which it prints, rather than dying of SIGPIPE with
  // an empty log (a write to the peer's socket): the launcher then names the rank that failed first, by its log, and
  // not the one that wrote to it last (RankFaultTest.RandomFaults...: a peer's error at warm-up backward).
  ::signal(SIGPIPE, SIG_IGN);
  int rank = -1;
  // Before the request is read the rank is not known: "memgate rank", not "memgate rank -1".
  const auto who = [&rank] { return rank < 0 ? std::string("memgate rank") : fmt::format("memgate rank {}", rank); };
  // The group outlives the result's write: a peer whose group closes fails its collective, and the launcher then
  // ends the rest, which must have written what they have (an out-of-memory) by then.
  std::optional<RankGroup> group;
  std::optional<Heartbeat> heartbeat;
  try {
    // The whole request, the workload as the launcher parsed it among it: the fixture's file is not read again.
    auto request = read_probe_request(request_path);
    rank = request.rank;
    // Gone with the launcher however it ends, its files with it; a launcher already gone ends this at once.
    if (parent) {
      const auto folder = std::filesystem::path(request.output).parent_path().string();
      if (!end_with_parent(*parent, folder)) {
        std::cerr << "memgate rank " << rank << ": the memgate that started it has ended\n";
        return 3;
      }
    }
    if (!request.heartbeat.empty()) heartbeat.emplace(request.heartbeat, kHeartbeatInterval);
    const auto timeout = request.timeout;
    const auto world = static_cast<int>(request.world_size);
    // One batch size, or (the whole probe of a Python fixture) several, probed in turn in this process: result i
    // then goes to <output>.<i> (and its snapshot to <snapshot>.<i>), each written as soon as it is known.
    const auto& batch_sizes = request.batch_sizes;
    if (batch_sizes.empty()) throw Error(request_path + ": request.batch_sizes: expected at least one batch size");
    const auto& fixture = request.workload;
    // With a store this process is one rank of a distributed probe; without, it runs the whole probe (a Python
    // fixture's, in a Python process): on a device, capped or not, or as an estimate on the Meta device.
    const bool is_rank = !request.store.empty();
    if (is_rank && !fixture.training.distributed.enabled()) {
      throw Error(fmt::format("{}: trains on one device (no training.distributed block), yet a rank of {} was started",
                              fixture.source, world));
    }
    // What an estimate is for (the GPU a search's target speaks for among it), for the whole process.
    std::optional<EstimateContextGuard> estimating;
    if (request.estimate) estimating.emplace(*request.estimate);
    ProbeOptions options;
    options.rank_timeout = timeout;
    options.on_phase = [rank](std::string_view phase) {
      set_phase(phase);
      fault_points::at_phase(rank, phase);
    };
    options.warmup_steps = request.warmup_steps;
    options.cpu_threads = request.cpu_threads;
    options.seed = request.seed;
    options.python = python;
    if (!request.snapshot.empty()) options.snapshot = SnapshotOptions{};
    const auto cap = request.cap_bytes;
    // The launcher's CPU limit (profile --cpu-memory-limit-mib): this process's CPU tensors are held to it, as the
    // launcher's own probes are (a Python fixture's model and batch, a rank's).
    if (request.cpu_limit_bytes > 0) CountingCpuAllocator::install().set_limit(request.cpu_limit_bytes);
    // The whole probe reports the model's parameter counts. They are counted first, on the Meta device: a Python
    // model's imports (modules whose import allocates tensors, PEFT's among them) then happen before the probe, as in
    // a training script, and are not counted as the model's (its ranks count them for that alone).
    std::optional<ParamCounts> counts;
    if (!is_rank || fixture.model.arch == Arch::kPython) {
      options.on_phase("counting the model's parameters (building it on the Meta device)");
      // A Python builder that cannot run on the Meta device (it reads a value drawn at random there): a measurement
      // counts them on its own device, where the probe builds the model anyway (each probe then starts from an empty
      // cache); an estimate, which runs on Meta alone, has the builder's error.
      std::optional<c10::Device> fallback;
      if (fixture.model.arch == Arch::kPython && !request.estimate) fallback = c10::Device(request.device);
      counts = workload_param_counts(
          fixture, fallback,
          [&] {
            options.on_phase(
                "counting the model's parameters (building it on the probe's device: not on the Meta device)");
          },
          python);
    }
    if (is_rank && batch_sizes.size() > 1) {
      throw Error(request_path + ": request.batch_sizes: a rank probes one batch size");
    }
    // An estimate of a Python model on one device: one build serves every batch size (models/python.h), the first
    // probe's (the parameter count's build is not kept: the imports it paid are not the model's). Not under ranks
    // (their hooks stay on the module), nor a cap (a build replayed past it would stop halfway).
    // A Python fixture's blocks and FLOPs for `memgate plan` (plan/flops.h), counted here where its blocks run: each
    // count builds the model anew (no build kept: the count runs outside a probe's reuse).
    if (request.flops) {
      write_file_atomically(request.output, count_checkpoint_flops_here(fixture, *request.flops, python));
      return 0;
    }
    const bool reuse = request.estimate && !fixture.training.distributed.enabled() && cap == 0;
    if (reuse && python != nullptr && python->reuse_builds) python->reuse_builds(true);
    // A Python fixture's whole search (advise's), in this process: one built module serves every batch size.
    if (request.search) {
      write_file_atomically(request.output, search_largest_batches_here(fixture, *request.search, python));
      return 0;
    }
    const bool keep_going = request.keep_going;
    const auto of_probe = [&](const std::string& path, std::size_t i) {
      return probe_file(path, i, batch_sizes.size());
    };
    for (std::size_t i = 0; i < batch_sizes.size(); ++i) {
      const auto batch_size = batch_sizes[i];
      ProbeResult result;
      try {
        if (request.estimate) {
          result = estimate_probe(fixture, batch_size, request.estimate->target, options);
        } else {
          // The CPU (Gloo), or the GPU of this rank's own (NCCL): cuda:N, which the probe gave it.
          const c10::Device device(request.device);
          if (!device.is_cpu() && !(device.is_cuda() && device.has_index())) {
            throw Error(request_path + ": request.device: expected cpu or cuda:N, got " + request.device);
          }
          if (is_rank) {
            options.on_phase("joining the process group");
            const auto waits = timeout + kAfterTheSupervisor;
            group = device.is_cuda() ? join_nccl_group(request.store, rank, world, device, waits)
                                     : join_gloo_group(request.store, rank, world, waits);
            options.rank_group = &*group;
          }
          result = cap > 0 ? run_probe_capped(fixture, batch_size, device, cap, options)
                           : run_probe(fixture, batch_size, device, options);
          if (group) {
            result.communicator_bytes = communicator_bytes();
            shut_down_nccl(*group);
          }
        }
      } catch (const std::invalid_argument&) {
        throw;
      } catch (const std::exception& e) {
        // A profile's whole probe (--keep-going): the model's error at this batch size is its result, and the next
        // batch sizes still run in this process.
        if (is_rank || !keep_going) throw;
        const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
        const std::string message = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
        const auto where = fmt::format("{} at batch {}: ", fixture.source, batch_size);
        result = ProbeResult{};
        result.batch_size = batch_size;
        result.failed = true;
        result.error = message.starts_with(where) ? message : where + message;
      }
      if (!is_rank) result.param_counts = counts;
      if (!request.snapshot.empty()) {
        const auto snapshot = of_probe(request.snapshot, i);
        if (!result.snapshot.empty()) write_file_atomically(snapshot, result.snapshot);
        for (std::size_t r = 0; r < result.rank_snapshots.size(); ++r) {
          write_file_atomically(fmt::format("{}.rank{}", snapshot, r), result.rank_snapshots[r]);
        }
      }
      write_file_atomically(of_probe(request.output, i), rank_result_text(rank, result));
    }
    return 0;
  } catch (const c10::Error& e) {
    // The message, not LibTorch's C++ stack after it: the launcher shows the line that says what went wrong.
    std::cerr << who() << ": " << e.what_without_backtrace() << "\n";
    return 3;
  } catch (const std::invalid_argument& e) {
    std::cerr << "memgate rank: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << who() << ": " << e.what() << "\n";
    return 3;
  }
}

}  // namespace memgate
