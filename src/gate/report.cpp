// Text and JSON reports of a profile.
#include "memgate/gate/report.h"

#include <cstdio>
#include <iomanip>
#include <sstream>

namespace memgate {

namespace {

// Table cells: MiB, or KiB below one MiB so that the tiny CPU twins do not read as zero.
std::string format_cell(std::int64_t bytes) {
  if (bytes >= (1 << 20) || bytes == 0) return format_mib(bytes);
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.1f KiB", static_cast<double>(bytes) / 1024.0);
  return buffer;
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
  for (const auto& info : kComponentTable) j[std::string(info.name)] = components.*info.member;
  return j;
}

nlohmann::json profile_to_json(const Profile& profile) {
  nlohmann::json probes = nlohmann::json::array();
  for (const auto& p : profile.probes) {
    nlohmann::json probe = {{"batch_size", p.batch_size}};
    if (p.oom) {
      probe["oom"] = true;
      probe["error"] = p.error;
    } else {
      probe["components"] = components_to_json(p.components);
      probe["step_seconds"] = p.step_seconds;
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
  std::ostringstream out;
  const auto& d = profile.device;
  out << "memgate profile: " << profile.fixture << " on " << d.name << " (" << d.slug << ")\n";
  out << "  torch " << d.torch_version;
  if (!d.cuda_version.empty()) out << ", CUDA " << d.cuda_version;
  if (!d.cudnn_version.empty()) out << ", cuDNN " << d.cudnn_version;
  if (!d.driver_version.empty()) out << ", driver " << d.driver_version;
  if (!d.allocator_settings.empty()) out << ", allocator " << d.allocator_settings;
  out << "\n";
  out << "  parameters: " << profile.params.total << " total, " << profile.params.trainable << " trainable, "
      << profile.params.frozen << " frozen\n\n";

  constexpr int kNameWidth = 20, kColWidth = 14;
  out << std::left << std::setw(kNameWidth) << "component";
  for (const auto& p : profile.probes) {
    out << std::right << std::setw(kColWidth) << ("bs " + std::to_string(p.batch_size));
  }
  out << "\n";
  for (const auto& info : kComponentTable) {
    out << std::left << std::setw(kNameWidth) << info.name;
    for (const auto& p : profile.probes) {
      out << std::right << std::setw(kColWidth) << (p.oom ? std::string("OOM") : format_cell(p.components.*info.member));
    }
    out << "\n";
  }
  out << std::left << std::setw(kNameWidth) << "step time";
  for (const auto& p : profile.probes) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%.3f s", p.step_seconds);
    out << std::right << std::setw(kColWidth) << (p.oom ? std::string("-") : std::string(buffer));
  }
  out << "\n";

  bool any_oom = false;
  for (const auto& p : profile.probes) {
    if (p.oom) {
      if (!any_oom) out << "\nout of memory:\n";
      any_oom = true;
      out << "  batch size " << p.batch_size << ": " << p.error.substr(0, p.error.find('\n')) << "\n";
    }
  }
  if (!gpus.empty()) {
    out << "\nlargest measured batch size that fits (step_peak_reserved + outside-allocator <= usable):\n";
    for (const auto& g : gpus) {
      auto best = largest_fitting_batch(profile, g);
      out << "  " << std::left << std::setw(28) << g.name << std::right << std::setw(12) << format_mib(g.usable_bytes())
          << " usable  ->  " << (best ? "bs " + std::to_string(*best) : std::string("none of the measured")) << "\n";
    }
    if (profile.device.device.is_cpu()) {
      out << "  (measured on the CPU: CUDA kernels and workspaces differ; profile on a GPU for a budget you can trust)\n";
    }
  }
  return out.str();
}

}  // namespace memgate
