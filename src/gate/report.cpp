// Text and JSON reports of a profile.
#include "memgate/gate/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>

namespace memgate {

namespace {

constexpr const char* kCachingAllocatorNote =
    "(on CUDA each component counts the caching allocator's blocks, not the tensors' sizes: sizes round up to 512 "
    "bytes, and a cached block reused without a split can be up to 1 MiB larger than its tensor, so a component "
    "that holds the same tensors, such as gradients, can differ between batch sizes)\n";

// Table cells: MiB, or KiB below one MiB so that the tiny CPU twins do not read as zero.
std::string format_cell(std::int64_t bytes) {
  if (bytes >= (1 << 20) || bytes == 0) return format_mib(bytes);
  return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / 1024.0);
}

}  // namespace

nlohmann::json device_to_json(const DeviceInfo& d) {
  nlohmann::json j = {{"name", d.name},
                      {"slug", d.slug},
                      {"torch", d.torch_version},
                      {"cuda", d.cuda_version},
                      {"cudnn", d.cudnn_version},
                      {"driver", d.driver_version},
                      {"allocator", d.allocator_settings}};
  if (d.total_memory > 0) j["total_memory"] = d.total_memory;
  if (d.cpu_threads > 0) j["cpu_threads"] = d.cpu_threads;
  return j;
}

nlohmann::json components_to_json(const Components& components) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& info : kComponentTable) {
    if (has_component(components, info)) j[std::string(info.name)] = components.*info.member;
  }
  return j;
}

nlohmann::json ranks_to_json(const std::vector<RankComponents>& ranks) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : ranks) {
    out.push_back({{"rank", r.rank},
                   {"components", components_to_json(r.components)},
                   {"comm_buffer_bytes", r.comm_buffer_bytes},
                   {"comm_buffers", r.comm_buffers}});
  }
  return out;
}

nlohmann::json profile_to_json(const Profile& profile) {
  nlohmann::json probes = nlohmann::json::array();
  for (const auto& p : profile.probes) {
    nlohmann::json probe = {{"batch_size", p.batch_size}};
    if (p.oom) {
      probe["oom"] = true;
      probe["error"] = p.error;
    } else if (p.failed) {
      // Not measured: the error that stopped this batch size (the others were measured).
      probe["failed"] = true;
      probe["error"] = p.error;
    } else {
      probe["components"] = components_to_json(p.components);
      if (!p.modules.empty()) probe["modules"] = module_breakdown_to_json(p.modules);
      probe["step_seconds"] = p.step_seconds;
      probe["library_workspace_bytes"] = p.library_workspace_bytes;
      probe["outside_allocator_bytes"] = p.outside_allocator_bytes;
      if (!p.ranks.empty()) {
        // A distributed probe: `components` is the largest over ranks; each rank's own, and its buffers.
        probe["comm_buffer_bytes"] = p.comm_buffer_bytes;
        probe["ranks"] = ranks_to_json(p.ranks);
        if (p.communicator_bytes > 0) {
          // On GPUs: what each rank's device holds outside its allocator, NCCL's communicators among it.
          probe["communicator_bytes"] = p.communicator_bytes;
          for (std::size_t i = 0; i < p.ranks.size(); ++i) {
            probe["ranks"][i]["communicator_bytes"] = p.ranks[i].communicator_bytes;
            probe["ranks"][i]["outside_allocator_bytes"] = p.ranks[i].outside_allocator_bytes;
          }
        }
      }
    }
    probe["probe_seconds"] = p.seconds;
    probes.push_back(probe);
  }
  return {{"device", device_to_json(profile.device)},
          {"model",
           {{"name", profile.fixture},
            {"fixture_hash", profile.fixture_hash},
            {"total_params", profile.params.total},
            {"trainable_params", profile.params.trainable},
            {"frozen_params", profile.params.frozen}}},
          {"probes", probes}};
}

std::string format_profile(const Profile& profile, const std::vector<GpuSpec>& gpus) {
  std::string text;
  auto out = std::back_inserter(text);
  const auto& d = profile.device;
  // An estimate runs on the Meta device: nothing was measured, its step time is the Meta run's.
  const bool estimated = d.device.is_meta();
  fmt::format_to(out, "memgate {}: {} on {} ({})\n", estimated ? "estimate" : "profile", profile.fixture, d.name, d.slug);
  fmt::format_to(out, "  torch {}", d.torch_version);
  if (!d.cuda_version.empty()) fmt::format_to(out, ", CUDA {}", d.cuda_version);
  if (!d.cudnn_version.empty()) fmt::format_to(out, ", cuDNN {}", d.cudnn_version);
  if (!d.driver_version.empty()) fmt::format_to(out, ", driver {}", d.driver_version);
  if (!d.allocator_settings.empty()) fmt::format_to(out, ", allocator {}", d.allocator_settings);
  fmt::format_to(out, "\n  parameters: {} total, {} trainable, {} frozen\n\n", profile.params.total,
                 profile.params.trainable, profile.params.frozen);

  // Component x batch size: the name left-aligned, one right-aligned column per batch size.
  constexpr int kNameWidth = 20, kColWidth = 14;
  fmt::format_to(out, "{:<{}}", "component", kNameWidth);
  for (const auto& p : profile.probes) fmt::format_to(out, "{:>{}}", fmt::format("bs {}", p.batch_size), kColWidth);
  fmt::format_to(out, "\n");
  for (const auto& info : kComponentTable) {
    const bool any = std::any_of(profile.probes.begin(), profile.probes.end(),
                                 [&](const ProbeResult& p) { return has_component(p.components, info); });
    if (!any) continue;  // `ema` where no EMA copy is kept
    fmt::format_to(out, "{:<{}}", info.name, kNameWidth);
    for (const auto& p : profile.probes) {
      fmt::format_to(out, "{:>{}}",
                     p.oom ? std::string("OOM") : p.failed ? std::string("failed") : format_cell(p.components.*info.member),
                     kColWidth);
    }
    fmt::format_to(out, "\n");
  }
  // CUDA's components are the caching allocator's blocks, not the tensors' sizes: said where a reader would
  // otherwise take a difference between batch sizes for a wrong number.
  if (d.device.is_cuda() || (estimated && d.slug == "cuda")) {
    fmt::format_to(out, "{}", kCachingAllocatorNote);
  }
  if (!estimated) {
    fmt::format_to(out, "{:<{}}", "step time", kNameWidth);
    for (const auto& p : profile.probes) {
      fmt::format_to(out, "{:>{}}", p.measured() ? fmt::format("{:.3f} s", p.step_seconds) : std::string("-"), kColWidth);
    }
    fmt::format_to(out, "\n");
  }

  // A distributed probe: each rank's peak, gradients and DDP's buckets (FSDP keeps none between steps); the table
  // holds the largest over ranks.
  for (const auto& p : profile.probes) {
    if (p.ranks.empty()) continue;
    fmt::format_to(out, "\nbs {}, per rank (the table holds the largest over ranks):\n", p.batch_size);
    for (const auto& r : p.ranks) {
      fmt::format_to(out, "  rank {}: step_peak {}, gradients {}", r.rank, format_cell(r.components.step_peak),
                     format_cell(r.components.gradients));
      if (r.comm_buffers > 0) {
        fmt::format_to(out, ", DDP buckets {} ({} buckets)", format_cell(r.comm_buffer_bytes), r.comm_buffers);
      }
      if (r.communicator_bytes > 0) {
        fmt::format_to(out, ", NCCL communicators {} (outside the allocator {} in all)", format_cell(r.communicator_bytes),
                       format_cell(r.outside_allocator_bytes));
      }
      fmt::format_to(out, "\n");
    }
  }

  bool any_oom = false;
  for (const auto& p : profile.probes) {
    if (p.oom) {
      if (!any_oom) fmt::format_to(out, "\nout of memory:\n");
      any_oom = true;
      fmt::format_to(out, "  batch size {}: {}\n", p.batch_size, p.error.substr(0, p.error.find('\n')));
    }
  }
  bool any_failed = false;
  for (const auto& p : profile.probes) {
    if (p.failed) {
      if (!any_failed) fmt::format_to(out, "\nfailed (not {}):\n", estimated ? "estimated" : "measured");
      any_failed = true;
      fmt::format_to(out, "  batch size {}: {}\n", p.batch_size, p.error.substr(0, p.error.find('\n')));
    }
  }
  if (!gpus.empty()) {
    fmt::format_to(out, "\nlargest {} batch size that fits (step_peak_reserved <= usable: memory x usable_fraction - "
                        "outside the allocator):\n",
                   estimated ? "estimated" : "measured");
    std::int64_t largest_tried = 0;
    for (const auto& p : profile.probes) {
      if (p.measured()) largest_tried = std::max(largest_tried, p.batch_size);
    }
    bool any_capped = false;
    for (const auto& g : gpus) {
      const auto best = largest_fitting_batch(profile, g);
      // The largest batch size of this profile fits: the GPU takes at least that, and how much more is not known here.
      const bool capped = best && *best == largest_tried;
      any_capped = any_capped || capped;
      fmt::format_to(out, "  {:<28}{:>12} usable  ->  {}\n", g.name, format_usable(g.usable_bytes()),
                     !best    ? std::string(estimated ? "none of the estimated" : "none of the measured")
                     : capped ? fmt::format("bs {} or more (every batch size {} fits)", *best,
                                            estimated ? "estimated" : "measured")
                              : fmt::format("bs {}", *best));
    }
    if (any_capped) {
      fmt::format_to(out, "  (\"or more\": the largest batch such a GPU fits was not searched; memgate estimate --gpu "
                          "<id> finds it by estimate in seconds, memgate advise --gpu <id> confirms it)\n");
    }
    if (profile.device.device.is_cpu()) {
      fmt::format_to(out, "  (measured on the CPU: CUDA kernels and workspaces differ; profile on a GPU for a budget "
                          "you can trust)\n");
    }
  }
  return text;
}

}  // namespace memgate
