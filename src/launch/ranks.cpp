// The distributed probe: one process per rank (the rank executable, started with --memgate-rank), meeting through a
// c10d::FileStore in a folder of the probe's own; each measures its own components, and the parent gathers them. On
// the Meta device (an estimate) the ranks run in turn in this process.
#include "memgate/launch/ranks.h"

#include "machine.h"
#include "result_protocol.h"
#include "start.h"

#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/backend/device.h"
#include "memgate/distributed/process_group.h"
#include "memgate/launch/result.h"
#include "memgate/models/zoo.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace memgate {

namespace {

// A distributed probe's own figures from its ranks': the largest of each.
void fold_ranks(ProbeResult& result) {
  result.components = max_over_ranks(result.ranks);
  for (const auto& r : result.ranks) {
    result.comm_buffer_bytes = std::max(result.comm_buffer_bytes, r.comm_buffer_bytes);
    result.comm_buffers = std::max(result.comm_buffers, r.comm_buffers);
    result.communicator_bytes = std::max(result.communicator_bytes, r.communicator_bytes);
    result.outside_allocator_bytes = std::max(result.outside_allocator_bytes, r.outside_allocator_bytes);
    result.library_workspace_bytes = std::max(result.library_workspace_bytes, r.library_workspace_bytes);
  }
}

}  // namespace

std::vector<int> rank_kinds(const Workload& workload, int world, const PythonRuntime* python) {
  std::vector<int> kinds(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) kinds[static_cast<std::size_t>(r)] = r;
  const auto& spec = workload.training.distributed;
  if (!spec.enabled() || world < 2) return kinds;
  if (spec.strategy == DistributedStrategy::kDdp) {
    // DDP: every rank a full replica, its buckets the same.
    for (auto& k : kinds) k = 0;
    return kinds;
  }
  // FSDP: a rank is its rows of each parameter's dim-0 chunks (FullyShard's shards: torch.chunk, padded to the first
  // chunk), the post-forward group's parts and every buffer the same size on each.
  std::vector<std::int64_t> rows;
  try {
    const auto model = build_model(workload.model, c10::Device(c10::DeviceType::Meta), 0, python);
    for (const auto& p : model->module().named_parameters(/*recurse=*/true)) {
      rows.push_back(p.value().dim() > 0 ? p.value().size(0) : 1);
    }
  } catch (const std::exception&) {
    return kinds;  // a model that does not build on the Meta device: every rank estimated
  }
  std::map<std::vector<std::int64_t>, int> first_of;
  for (int r = 0; r < world; ++r) {
    std::vector<std::int64_t> owned;
    owned.reserve(rows.size());
    for (const auto n : rows) {
      const auto chunk = (n + world - 1) / world;
      owned.push_back(std::clamp(n - r * chunk, std::int64_t{0}, chunk));
    }
    kinds[static_cast<std::size_t>(r)] = first_of.emplace(std::move(owned), r).first->second;
  }
  return kinds;
}

ProbeResult run_distributed_probe(const Workload& workload, std::int64_t batch_size, c10::Device device,
                                  const ProbeOptions& options) {
  require_batch_size(workload, batch_size);
  const auto& spec = workload.training.distributed;
  const int world = static_cast<int>(spec.world_size);
  if (device.is_meta()) {
    // An estimate: each rank in turn, in this process, over the Meta device's process group.
    // Ranks whose parts of the model have the same shapes make the same requests: each kind is estimated once.
    ProbeResult result;
    result.batch_size = batch_size;
    const auto start = std::chrono::steady_clock::now();
    const auto kinds = rank_kinds(workload, world, options.python);
    for (int r = 0; r < world; ++r) {
      if (const auto like = kinds[static_cast<std::size_t>(r)]; like != r) {
        auto same = result.ranks[static_cast<std::size_t>(like)];
        same.rank = r;
        result.ranks.push_back(same);
        if (options.snapshot) result.rank_snapshots.push_back(result.rank_snapshots[static_cast<std::size_t>(like)]);
        continue;
      }
      const auto group = meta_process_group(r, world);
      auto rank_options = options;
      rank_options.rank_group = &group;
      auto one = measure_probe(workload, batch_size, device, rank_options);
      if (one.oom) return one;
      if (options.snapshot) result.rank_snapshots.push_back(std::move(one.snapshot));
      result.step_seconds = std::max(result.step_seconds, one.step_seconds);
      result.ranks.push_back({r, one.components, one.comm_buffer_bytes, one.comm_buffers});
    }
    fold_ranks(result);
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return result;
  }
  if (!device.is_cpu() && !device.is_cuda()) {
    throw Error(fmt::format("{}: a distributed probe runs on the CPU (Gloo) or on GPUs (NCCL), not on {}",
                            workload.source, device.str()));
  }
  // On GPUs, one per rank; this process touches none of them (no context of its own on a rank's GPU).
  std::vector<std::string> rank_devices(static_cast<std::size_t>(world), "cpu");
  if (device.is_cuda()) {
    if (!nccl_available()) {
      throw Error(fmt::format("{}: this memgate was built without NCCL, so its ranks cannot train on GPUs: build it "
                              "against a CUDA LibTorch with NCCL's headers, or estimate the ranks (memgate estimate "
                              "--world-size {})", workload.source, world));
    }
    const auto gpus = !options.rank_devices.empty()
                          ? options.rank_devices
                          : consecutive_gpus(device.has_index() ? device.index() : 0, world,
                                             static_cast<int>(torch::cuda::device_count()));
    if (static_cast<int>(gpus.size()) != world) {
      throw Error(fmt::format("{}: {} GPUs given for {} ranks: expected one per rank", workload.source, gpus.size(),
                              world));
    }
    for (int r = 0; r < world; ++r) rank_devices[static_cast<std::size_t>(r)] = fmt::format("cuda:{}", gpus[r]);
  }
  if (device.is_cpu()) detail::require_cpu_room(workload, world);
  detail::ProbeProcesses processes(workload, options.rank_timeout);
  const auto& dir = processes.dir();
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < world; ++r) {
    const std::int64_t one[] = {batch_size};
    auto request = detail::probe_request(workload, one, r, world, dir / fmt::format("rank{}.json", r), options,
                                         options.rank_cap_bytes, rank_devices[static_cast<std::size_t>(r)]);
    request.store = (dir / "store").string();
    if (options.snapshot) request.snapshot = (dir / fmt::format("rank{}.pickle", r)).string();
    try {
      processes.start(fmt::format("rank {} of {}", r, world), request, (dir / fmt::format("rank{}.json", r)).string());
    } catch (const Error& e) {
      throw Error(fmt::format("{} at batch {}: {}", workload.source, batch_size, e.what()));
    }
  }
  // Each rank's end; the first that fails (or stops answering) ends the others: they would wait on it in a collective.
  const auto failure = processes.wait();
  ProbeResult result;
  result.batch_size = batch_size;
  if (failure) {
    // A rank that ran out of memory leaves the collective its peers wait in: they fail with a closed connection.
    // Ranks differ (FSDP's shards do), so one may run out alone: the probe ran out of memory, as that rank did.
    for (int r = 0; r < world; ++r) {
      try {
        const auto j = detail::read_child_result(dir / fmt::format("rank{}.json", r), "a rank's result file");
        if (j.at("oom").get<bool>()) {
          result.oom = true;
          result.error = detail::rank_oom_error(r, j);
          result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          return result;
        }
      } catch (const std::exception&) {
        // No result from this rank: not the one that ran out of memory.
      }
    }
    throw Error(fmt::format("{} at batch {}: {}", workload.source, batch_size, *failure));
  }
  for (int r = 0; r < world; ++r) {
    nlohmann::json j;
    try {
      j = detail::read_child_result(dir / fmt::format("rank{}.json", r), "a rank's result file");
    } catch (const std::exception& e) {
      throw Error(fmt::format("{}: rank {} left no result ({})", workload.source, r, e.what()));
    }
    detail::require_same_version(j, fmt::format("rank {}", r), processes.program());
    const auto one = probe_result_from_json(j);
    if (one.oom) {
      result.oom = true;
      if (result.error.empty()) result.error = detail::rank_oom_error(r, j);
      continue;
    }
    result.step_seconds = std::max(result.step_seconds, one.step_seconds);
    result.ranks.push_back(detail::rank_components_of(r, one));
  }
  if (result.oom) result.ranks.clear();
  else fold_ranks(result);
  if (options.snapshot && !result.oom) {
    for (int r = 0; r < world; ++r) {
      const auto path = dir / fmt::format("rank{}.pickle", r);
      result.rank_snapshots.push_back(std::filesystem::is_regular_file(path) ? read_text_file(path, "a memory snapshot")
                                                                              : std::string());
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace memgate
