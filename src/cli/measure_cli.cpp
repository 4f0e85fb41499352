// What memgate's measuring subcommands share: GPU targets, a profile's report and files, the options of runs that
// probe.
#include "measure_cli.h"

#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/gate/budget.h"
#include "memgate/gate/report.h"
#include "memgate/report/html_report.h"
#include "memgate/report/profile_document.h"
#include "memgate/models/python.h"
#include "memgate/models/torchscript.h"
#include "memgate/plan/plan.h"

#include <fmt/format.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace memgate::cli {

namespace {

// `path` with `suffix` before its extension: <stem><suffix><extension>, beside it.
std::string with_suffix(const std::string& path, const std::string& suffix) {
  const std::filesystem::path p(path);
  return (p.parent_path() / (p.stem().string() + suffix + p.extension().string())).string();
}

// Where the snapshot of batch size `batch` goes: `path` itself when it is the only batch size, else
// <stem>_bs<batch><extension> beside it.
std::string snapshot_path(const std::string& path, std::int64_t batch, std::size_t batches) {
  return batches <= 1 ? path : with_suffix(path, fmt::format("_bs{}", batch));
}

bool is_rank_timeout(std::string_view text) { return memgate::parse_rank_timeout(text).has_value(); }

}  // namespace

std::vector<memgate::AdviceTarget> gpu_targets(const std::string& dir, const std::vector<std::string>& ids, bool all) {
  std::vector<memgate::AdviceTarget> targets;
  if (!all && ids.empty()) return targets;
  const auto folder = dir.empty() ? memgate::gpus_dir(memgate::project_dir()) : dir;
  const auto gpus = memgate::load_gpus(folder);
  if (all) {
    for (const auto& g : gpus) targets.push_back(memgate::target_of(g));
  } else {
    for (const auto& id : ids) targets.push_back(memgate::target_of(gpu_by_id(gpus, id, folder)));
  }
  return targets;
}

void write_profile(const memgate::Profile& profile, const nlohmann::json& json, const ProfileFiles& files,
                   const std::string& config, std::string_view history) {
  for (const auto& p : profile.probes) {
    if (files.snapshot.empty()) break;
    const auto path = snapshot_path(files.snapshot, p.batch_size, profile.probes.size());
    // A distributed probe: one snapshot per rank, <stem>_rank<r><extension>.
    for (std::size_t r = 0; r < p.rank_snapshots.size(); ++r) {
      const auto rank_path = with_suffix(path, fmt::format("_rank{}", r));
      if (p.rank_snapshots[r].empty()) {
        fmt::print(stderr, "memgate: no snapshot of rank {} at batch size {} could be taken\n", r, p.batch_size);
        continue;
      }
      write_output("--snapshot", rank_path, p.rank_snapshots[r]);
      fmt::print(stderr, "memgate: wrote {} of rank {} at batch size {} to {} (open it at https://pytorch.org/memory_viz)\n",
                 history, r, p.batch_size, rank_path);
    }
    if (!p.rank_snapshots.empty()) continue;
    if (p.snapshot.empty()) {
      fmt::print(stderr, "memgate: no snapshot of batch size {} could be taken\n", p.batch_size);
      continue;
    }
    write_output("--snapshot", path, p.snapshot);
    fmt::print(stderr, "memgate: wrote {} of batch size {} to {} (open it at https://pytorch.org/memory_viz)\n",
               history, p.batch_size, path);
  }
  fmt::print("{}", memgate::format_profile(profile, gpu_specs(files.gpus)));
  if (!files.output.empty()) {
    write_output("--output", files.output, json.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    fmt::print("\nwrote {}\n", files.output);
  }
  if (!files.html.empty()) {
    std::vector<memgate::ProfileDocument> docs{memgate::profile_document_from_json(json, config)};
    docs.front().path = files.output;
    memgate::label_documents(docs);
    write_output("--html", files.html,
                 memgate::render_report_html(docs, gpu_lines(files.gpus), {.title = "", .generator = generator()}));
    fmt::print("wrote {}\n", files.html);
  }
}

void add_cpu_kernels_option(CLI::App& app, std::string& kernels) {
  app.add_option("--cpu-kernels", kernels,
                 "On the CPU: portable (LibTorch's own kernels, the same bytes on every CPU; baselines/cpu) or host "
                 "(what PyTorch runs on this CPU, oneDNN for its ISA class; baselines/cpu-<class>). Default: the "
                 "fixture's training.cpu_kernels, portable unless it says otherwise")
      ->envname("MEMGATE_CPU_KERNELS")
      ->type_name("KERNELS")
      ->check(CLI::IsMember(memgate::enum_words(memgate::kCpuKernelsNames)));
}

void add_rank_timeout_option(CLI::App& app, std::int64_t& seconds) {
  app.add_option("--rank-timeout", seconds,
                 "A probe in processes of its own (a distributed or a Python fixture's): how long a rank waits for "
                 "the others, to join and in any one collective, and how long any of its processes may go without a "
                 "heartbeat, before the probe is ended as hung (exit 3)")
      ->envname("MEMGATE_RANK_TIMEOUT")
      ->type_name("SECONDS")
      ->default_str(std::to_string(memgate::kDefaultRankTimeout.count()))
      ->check(check_value(is_rank_timeout, "whole seconds from 1 to 86400 (--rank-timeout or MEMGATE_RANK_TIMEOUT)"));
}

void set_world_size(memgate::Fixture& fixture, std::int64_t world_size, const std::string& config) {
  if (world_size <= 0) return;
  if (!fixture.training.distributed.enabled()) {
    throw memgate::Error(fmt::format("--world-size {}: {} trains on one device (no training.distributed block)",
                                     world_size, config));
  }
  const auto group = fixture.training.distributed.reshard_after_forward_group;
  if (group > 0 && world_size % group != 0) {
    throw memgate::Error(fmt::format("--world-size {}: {} reshards after forward to groups of {} ranks "
                                     "(training.distributed.reshard_after_forward), which {} ranks do not divide into",
                                     world_size, config, group, world_size));
  }
  fixture.training.distributed.world_size = world_size;
}

std::vector<FileArg> fixture_inputs(const std::string& flag, const std::string& path,
                                    const memgate::Fixture* fixture) {
  std::vector<FileArg> files{{flag, path}};
  if (fixture == nullptr) return files;
  const auto of = [&](const char* key) { return fmt::format("{} of {}", key, path); };
  if (const auto* ts = std::get_if<memgate::TorchScriptOptions>(&fixture->model.options)) {
    files.push_back({of("model.path"), ts->path});
  }
  if (const auto* py = std::get_if<memgate::PythonOptions>(&fixture->model.options)) {
    files.push_back({of("model.entry"), py->entry_file});
    files.push_back({of("model.loss"), py->loss_file});
    files.push_back({of("model.batch"), py->batch.file});
    files.push_back({of("model.compute_loss"), py->compute_loss.file});
    files.push_back({of("training.optimizer"), py->optimizer.file});
  }
  return files;
}

std::vector<FileArg> project_inputs(const std::string& baselines) {
  return {{"the baselines folder (--baselines)", baselines, true}, {"the GPU fixtures", default_gpus_dir(), true}};
}

memgate::Fixture load_fixture_for_run(const std::string& path, const std::string& cpu_kernels) {
  auto fixture = memgate::load_fixture(path);
  memgate::override_cpu_kernels(fixture, cpu_kernels, "--cpu-kernels");
  return fixture;
}

nlohmann::json plans_for(const memgate::Fixture& fixture, const std::vector<memgate::AdviceTarget>& targets,
                         std::int64_t batch, std::optional<std::int64_t> effective_batch, std::string& text) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& target : targets) {
    memgate::PlanOptions options;
    if (effective_batch) {
      options.effective_batch = effective_batch;
    } else {
      options.batch = batch;
    }
    text += "\n";
    try {
      const auto result = memgate::plan(fixture, target, options);
      text += memgate::format_plan(result);
      out[target.id] = memgate::plan_to_json(result);
    } catch (const memgate::Error& e) {
      // No plan fits: the search's own message (the batch, the GPU and the least it needed), and the rest go on.
      text += fmt::format("memgate plan: {}\n", e.what());
      out[target.id] = {{"error", e.what()}};
    }
  }
  return out;
}

}  // namespace memgate::cli
