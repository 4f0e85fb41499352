// One probe of a fixture in a process of its own: a rank of a distributed probe, or the whole probe of a Python
// fixture in a Python process (python -m memgate), started by the launcher (launch/ranks.h).
#include "memgate/gate/rank.h"

#include "fork_server_main.h"

#include "memgate/backend/cpu_allocator.h"
#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/base/heartbeat.h"
#include "memgate/base/signals.h"
#include "memgate/distributed/process_group.h"
#include "memgate/estimate/estimate_context.h"
#include "memgate/gate/fixture.h"
#include "memgate/launch/estimate.h"
#include "memgate/launch/ranks.h"
#include "memgate/launch/run.h"
#include "memgate/measure/probe.h"

#include <fmt/format.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <exception>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
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

std::int64_t to_int(const std::map<std::string, std::string>& args, const std::string& key) {
  const auto it = args.find(key);
  if (it == args.end()) throw std::invalid_argument("--" + key + " is required");
  return parse_int(it->second, key);
}

// memgate's tests of the launcher: MEMGATE_TEST_RANK_FAULT=<rank>:<fault>:<phase> makes rank <rank> fail when a
// phase containing <phase> starts: `error` (a LibTorch error, with its C++ stack), `exit` (status 7 at once), `stop`
// (SIGSTOP to itself, once its heartbeat has said where: a stopped process), `hang` (sleeps for ever, heartbeat
// going: a wedged call, which makes no progress), `crash` (SIGSEGV), `slow` (a minute's sleep, heartbeat going: a
// long step).
void inject_fault(int rank, std::string_view phase) {
  const char* spec = std::getenv("MEMGATE_TEST_RANK_FAULT");
  if (spec == nullptr) return;
  const std::string_view text(spec);
  const auto first = text.find(':'), second = text.find(':', first + 1);
  if (first == std::string_view::npos || second == std::string_view::npos) return;
  if (text.substr(0, first) != std::to_string(rank) || phase.find(text.substr(second + 1)) == std::string_view::npos) {
    return;
  }
  const auto fault = text.substr(first + 1, second - first - 1);
  if (fault == "error") TORCH_CHECK(false, "a fault injected by MEMGATE_TEST_RANK_FAULT at ", phase);
  if (fault == "exit") std::_Exit(7);
  if (fault == "stop") {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::raise(SIGSTOP);
  }
  if (fault == "slow") std::this_thread::sleep_for(std::chrono::minutes(1));
  if (fault == "hang") {
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }
  if (fault == "crash") std::raise(SIGSEGV);
}

RankSearch& rank_search() {
  static RankSearch search;
  return search;
}

}  // namespace

void set_rank_search(RankSearch search) { rank_search() = std::move(search); }

bool is_rank_command(int argc, char** argv) {
  declare_rank_host();
  return argc > 1 && (std::string(argv[1]) == "--memgate-rank" || is_fork_server_command(argc, argv));
}

int rank_main(int argc, char** argv) {
  if (is_fork_server_command(argc, argv)) return fork_server_main(argc, argv);
  std::map<std::string, std::string> args;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    if (!key.starts_with("--")) {
      std::cerr << "memgate rank: expected --key value pairs, got '" << key << "'\n";
      return 2;
    }
    args[key.substr(2)] = argv[i + 1];
  }
  // A rank whose peer has gone gets an error from its collective, which it prints, rather than dying of SIGPIPE with
  // an empty log (a write to the peer's socket): the launcher then names the rank that failed first, by its log, and
  // not the one that wrote to it last (RankFaultTest.RandomFaults...: a peer's error at warm-up backward).
  ::signal(SIGPIPE, SIG_IGN);
  int rank = -1;
  // The group outlives the result's write: a peer whose group closes fails its collective, and the launcher then
  // ends the rest, which must have written what they have (an out-of-memory) by then.
  std::optional<RankGroup> group;
  std::optional<Heartbeat> heartbeat;
  try {
    for (const auto* key : {"fixture", "output"}) {
      if (!args.contains(key)) throw std::invalid_argument(std::string("--") + key + " is required");
    }
    rank = static_cast<int>(to_int(args, "rank"));
    // Gone with the launcher however it ends, its files with it; a launcher already gone ends this at once.
    if (args.contains("parent-pid")) {
      const auto folder = std::filesystem::path(args["output"]).parent_path().string();
      if (!end_with_parent(static_cast<pid_t>(to_int(args, "parent-pid")), folder)) {
        std::cerr << "memgate rank " << rank << ": the memgate that started it has ended\n";
        return 3;
      }
    }
    if (args.contains("heartbeat")) heartbeat.emplace(args["heartbeat"], kHeartbeatInterval);
    if (args.contains("memgate-version") && args["memgate-version"] != MEMGATE_VERSION) {
      throw Error(fmt::format("this rank program is memgate {}, and the memgate that started it is {}: the probe's "
                              "processes must run the same memgate", MEMGATE_VERSION, args["memgate-version"]));
    }
    const auto timeout = args.contains("timeout-s") ? std::chrono::seconds(to_int(args, "timeout-s"))
                                                    : kDefaultRankTimeout;
    const auto world = static_cast<int>(to_int(args, "world-size"));
    // One batch size, or (the whole probe of a Python fixture) several, probed in turn in this process: result i
    // then goes to <output>.<i> (and its snapshot to <snapshot>.<i>), each written as soon as it is known.
    std::vector<std::int64_t> batch_sizes;
    std::stringstream list(args.contains("batch-size") ? args["batch-size"] : std::string());
    for (std::string item; std::getline(list, item, ',');) batch_sizes.push_back(parse_int(item, "batch-size"));
    if (batch_sizes.empty()) throw std::invalid_argument("--batch-size is required");
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
    options.rank_timeout = timeout;
    options.on_phase = [rank](std::string_view phase) {
      set_phase(phase);
      inject_fault(rank, phase);
    };
    if (args.contains("warmup-steps")) options.warmup_steps = static_cast<int>(to_int(args, "warmup-steps"));
    if (args.contains("cpu-threads")) options.cpu_threads = static_cast<int>(to_int(args, "cpu-threads"));
    if (args.contains("seed")) options.seed = static_cast<std::uint64_t>(to_int(args, "seed"));
    if (args.contains("snapshot")) options.snapshot = SnapshotOptions{};
    const auto cap = args.contains("cap-bytes") ? to_int(args, "cap-bytes") : 0;
    // The launcher's CPU limit (profile --cpu-memory-limit-mib): this process's CPU tensors are held to it, as the
    // launcher's own probes are (a Python fixture's model and batch, a rank's).
    if (args.contains("cpu-limit-bytes")) {
      CountingCpuAllocator::install().set_limit(to_int(args, "cpu-limit-bytes"));
    }
    // The whole probe reports the model's parameter counts. They are counted first, on the Meta device: a Python
    // model's imports (modules whose import allocates tensors, PEFT's among them) then happen before the probe, as in
    // a training script, and are not counted as the model's (its ranks count them for that alone).
    std::optional<ParamCounts> counts;
    if (!is_rank || fixture.model.arch == Arch::kPython) {
      options.on_phase("counting the model's parameters (building it on the Meta device)");
      try {
        counts = workload_param_counts(fixture);
      } catch (const std::exception&) {
        // A Python builder that cannot run on the Meta device (it reads a value drawn at random there): a measurement
        // counts them on its own device, where the probe builds the model anyway (each probe then starts from an
        // empty cache); an estimate, which runs on Meta alone, has the builder's error.
        if (fixture.model.arch != Arch::kPython || args.contains("estimate-for")) throw;
        options.on_phase("counting the model's parameters (building it on the probe's device: not on the Meta device)");
        const c10::Device device(args.contains("device") ? args["device"] : std::string("cpu"));
        auto model = build_model(fixture.model, device);
        (void)select_trainable(*model, fixture.training.trainable, fixture.source);
        counts = count_parameters(model->module());
      }
    }
    if (is_rank && batch_sizes.size() > 1) throw std::invalid_argument("--batch-size: a rank probes one batch size");
    // An estimate of a Python model on one device: one build serves every batch size (models/python.h), the first
    // probe's (the parameter count's build is not kept: the imports it paid are not the model's). Not under ranks
    // (their hooks stay on the module), nor a cap (a build replayed past it would stop halfway).
    const bool reuse = args.contains("estimate-for") && !fixture.training.distributed.enabled() && cap == 0;
    if (reuse) reuse_python_builds(true);
    if (args.contains("search")) {
      if (!rank_search()) throw Error("--search: this program cannot search (memgate's Python extension can)");
      const auto answer = rank_search()(fixture, read_text_file(args["search"], "a search's request"));
      write_file_atomically(args["output"], answer);
      return 0;
    }
    const bool keep_going = args.contains("keep-going") && args["keep-going"] == "1";
    // An estimate for a GPU of the search's (ranks.cpp passes it): its reductions staged for that GPU's SMs.
    std::optional<EstimateContextGuard> for_gpu;
    if (args.contains("estimate-gpu-sms")) {
      const auto& text = args["estimate-gpu-sms"];
      const auto x = text.find('x');
      if (x == std::string::npos) {
        throw std::invalid_argument("--estimate-gpu-sms: expected <SMs>x<threads>, got " + text);
      }
      for_gpu.emplace(estimate_context_for_gpu({static_cast<int>(parse_int(text.substr(0, x), "estimate-gpu-sms")),
                                                static_cast<int>(parse_int(text.substr(x + 1), "estimate-gpu-sms"))}));
    }
    const auto of_probe = [&](const std::string& path, std::size_t i) {
      return probe_file(path, i, batch_sizes.size());
    };
    for (std::size_t i = 0; i < batch_sizes.size(); ++i) {
      const auto batch_size = batch_sizes[i];
      ProbeResult result;
      try {
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
          if (is_rank) {
            options.on_phase("joining the process group");
            const auto waits = timeout + kAfterTheSupervisor;
            group = device.is_cuda() ? join_nccl_group(args["store"], rank, world, device, waits)
                                     : join_gloo_group(args["store"], rank, world, waits);
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
      if (args.contains("snapshot")) {
        const auto snapshot = of_probe(args["snapshot"], i);
        if (!result.snapshot.empty()) write_file_atomically(snapshot, result.snapshot);
        for (std::size_t r = 0; r < result.rank_snapshots.size(); ++r) {
          write_file_atomically(fmt::format("{}.rank{}", snapshot, r), result.rank_snapshots[r]);
        }
      }
      write_file_atomically(of_probe(args["output"], i), rank_result_text(rank, result));
    }
    return 0;
  } catch (const c10::Error& e) {
    // The message, not LibTorch's C++ stack after it: the launcher shows the line that says what went wrong.
    std::cerr << "memgate rank " << rank << ": " << e.what_without_backtrace() << "\n";
    return 3;
  } catch (const std::invalid_argument& e) {
    std::cerr << "memgate rank: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "memgate rank " << rank << ": " << e.what() << "\n";
    return 3;
  }
}

}  // namespace memgate
