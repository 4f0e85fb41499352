// A Python fixture's probes and its search by estimate, each in a Python process of its own (`python -m memgate`),
// started as every memgate child is (start.h).
#include "memgate/launch/ranks.h"

#include "result_protocol.h"
#include "start.h"

#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/launch/result.h"
#include "memgate/models/python.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace memgate {

bool runs_in_python(const Workload& workload, const PythonRuntime* here) {
  return workload.model.arch == Arch::kPython && here == nullptr;
}

std::vector<ProbeResult> run_python_probes(const Workload& workload, std::span<const std::int64_t> batch_sizes,
                                           c10::Device device, const ProbeOptions& options,
                                           std::optional<EstimateTarget> estimate, std::int64_t cap_bytes) {
  if (batch_sizes.empty()) return {};
  for (const auto batch_size : batch_sizes) require_batch_size(workload, batch_size);
  detail::ProbeProcesses processes(workload, options.rank_timeout);
  const auto& dir = processes.dir();
  const auto& spec = workload.training.distributed;
  // Every batch size in the one process, in order: its imports (torch, the user's libraries) are paid once.
  auto request = detail::probe_request(workload, batch_sizes, 0, spec.enabled() ? spec.world_size : 1,
                                       dir / "rank0.json", options, cap_bytes, device.str());
  if (estimate) request.estimate = detail::estimate_for(workload, *estimate);
  const auto snapshot = dir / "probe.pickle";
  if (options.snapshot) request.snapshot = snapshot.string();
  // What the process writes for its i-th batch size (rank_main: a file per batch size when it probes several).
  const auto of_probe = [&](const std::filesystem::path& path, std::size_t i) {
    return std::filesystem::path(probe_file(path.string(), i, batch_sizes.size()));
  };
  processes.start("its Python probe", request, of_probe(dir / "rank0.json", batch_sizes.size() - 1).string());
  // The batch sizes whose results it wrote (all of them, unless it failed).
  std::size_t written = batch_sizes.size();
  std::optional<std::string> failed;
  if (auto failure = processes.wait()) {
    // The batch size it was at: the first whose result it had not written.
    std::size_t done = 0;
    std::error_code ec;
    while (done < batch_sizes.size() && std::filesystem::is_regular_file(of_probe(dir / "rank0.json", done), ec)) {
      ++done;
    }
    const auto message = fmt::format("{} at batch {}: {} (-m memgate): {}", workload.source,
                                     batch_sizes[std::min(done, batch_sizes.size() - 1)], processes.program(),
                                     *failure);
    // A profile's: the process ended at that batch size (a crash, a timeout); the ones before it are read, and the
    // ones after it run in a process of their own.
    if (!options.keep_going || done >= batch_sizes.size()) throw Error(message);
    written = done;
    failed = message;
  }
  std::vector<ProbeResult> results;
  for (std::size_t i = 0; i < written; ++i) {
    const auto j = detail::read_child_result(of_probe(dir / "rank0.json", i), "a probe's result file");
    detail::require_same_version(j, "the Python probe", processes.program() + " -m memgate");
    auto result = probe_result_from_json(j);
    result.batch_size = batch_sizes[i];
    if (options.snapshot) {
      std::error_code ec;
      const auto probe_snapshot = of_probe(snapshot, i);
      if (std::filesystem::is_regular_file(probe_snapshot, ec)) {
        result.snapshot = read_text_file(probe_snapshot.string(), "a memory snapshot");
      }
      for (std::size_t r = 0; r < result.ranks.size(); ++r) {
        const auto path = std::filesystem::path(fmt::format("{}.rank{}", probe_snapshot.string(), r));
        result.rank_snapshots.push_back(std::filesystem::is_regular_file(path, ec)
                                            ? read_text_file(path.string(), "a memory snapshot")
                                            : std::string());
      }
    }
    results.push_back(std::move(result));
  }
  if (failed) {
    ProbeResult result;
    result.batch_size = batch_sizes[written];
    result.failed = true;
    result.error = *failed;
    results.push_back(std::move(result));
    if (written + 1 < batch_sizes.size()) {
      for (auto& rest : run_python_probes(workload, batch_sizes.subspan(written + 1), device, options, estimate,
                                          cap_bytes)) {
        results.push_back(std::move(rest));
      }
    }
  }
  return results;
}

namespace {

// One Python process that runs `what` (a request's search or flops, set by `ask`) and writes its answer's text.
template <class Ask>
std::string run_python_request(const Workload& workload, EstimateTarget target, const ProbeOptions& options,
                               const char* what, const char* answer_of, Ask ask) {
  detail::ProbeProcesses processes(workload, options.rank_timeout);
  const auto& dir = processes.dir();
  const auto& spec = workload.training.distributed;
  const std::int64_t one[] = {1};
  auto probe = detail::probe_request(workload, one, 0, spec.enabled() ? spec.world_size : 1, dir / "rank0.json",
                                     options, 0, "meta");
  probe.estimate = detail::estimate_for(workload, target);
  ask(probe);
  processes.start(fmt::format("its Python {}", what), probe, (dir / "rank0.json").string());
  if (auto failure = processes.wait()) {
    throw Error(fmt::format("{}: {}: {} (-m memgate): {}", workload.source, answer_of, processes.program(),
                            *failure));
  }
  auto answer = read_text_file((dir / "rank0.json").string(), fmt::format("a {}'s answer", what));
  detail::require_same_version(nlohmann::json::parse(answer), fmt::format("the Python {}", what),
                               processes.program() + " -m memgate");
  return answer;
}

}  // namespace

std::string run_python_search(const Workload& workload, const std::string& request, const ProbeOptions& options) {
  return run_python_request(workload, EstimateTarget::kCuda, options, "search", "the search by estimate",
                            [&](ProbeRequest& probe) { probe.search = request; });
}

std::string run_python_flops(const Workload& workload, const std::string& request, const ProbeOptions& options) {
  const auto target = nlohmann::json::parse(request).at("target").get<std::string>() == "cpu" ? EstimateTarget::kCpu
                                                                                               : EstimateTarget::kCuda;
  return run_python_request(workload, target, options, "count", "the blocks and FLOPs of a plan",
                            [&](ProbeRequest& probe) { probe.flops = request; });
}

ProbeResult run_python_probe(const Workload& workload, std::int64_t batch_size, c10::Device device,
                             const ProbeOptions& options, std::optional<EstimateTarget> estimate,
                             std::int64_t cap_bytes) {
  const std::int64_t batch_sizes[] = {batch_size};
  return std::move(run_python_probes(workload, batch_sizes, device, options, estimate, cap_bytes).front());
}

}  // namespace memgate
