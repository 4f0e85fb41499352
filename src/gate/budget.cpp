// GPU fixtures and budget arithmetic.
#include "memgate/gate/budget.h"

#include "memgate/base/error.h"
#include "yaml_reader.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

namespace memgate {

std::int64_t GpuSpec::usable_bytes() const {
  return static_cast<std::int64_t>(std::floor(usable_fraction * static_cast<double>(memory_bytes)));
}

GpuSpec load_gpu(const std::string& path) {
  auto root = detail::load_yaml_file(path);
  detail::MapReader r(root, path, "");
  GpuSpec gpu;
  gpu.path = path;
  gpu.id = std::filesystem::path(path).stem().string();
  gpu.name = r.get_string("name", std::nullopt);
  gpu.memory_bytes = static_cast<std::int64_t>(r.get_double("memory_gib", std::nullopt, 0.01, 1 << 20) *
                                               static_cast<double>(1LL << 30));
  gpu.usable_fraction = r.get_double("usable_fraction", 0.90, 0.01, 1.0);
  gpu.outside_allocator_bytes =
      static_cast<std::int64_t>(r.get_double("outside_allocator_mib", 0.0, 0.0, 1 << 20) * (1 << 20));
  (void)r.get_string("note", std::string());
  r.finish();
  return gpu;
}

std::vector<GpuSpec> load_gpus(const std::string& dir) {
  std::vector<GpuSpec> gpus;
  if (!std::filesystem::is_directory(dir)) throw Error(dir + ": no such folder of GPU fixtures");
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".yaml") gpus.push_back(load_gpu(entry.path().string()));
  }
  std::sort(gpus.begin(), gpus.end(), [](const GpuSpec& a, const GpuSpec& b) {
    return a.memory_bytes != b.memory_bytes ? a.memory_bytes < b.memory_bytes : a.id < b.id;
  });
  return gpus;
}

const GpuSpec& find_gpu(const std::vector<GpuSpec>& gpus, const std::string& id) {
  for (const auto& g : gpus) {
    if (g.id == id) return g;
  }
  std::string known;
  for (const auto& g : gpus) known += (known.empty() ? "" : ", ") + g.id;
  throw Error("unknown GPU '" + id + "' (known: " + known + ")");
}

BudgetCheck check_budget(std::int64_t step_peak_reserved, const GpuSpec& gpu) {
  return {step_peak_reserved + gpu.outside_allocator_bytes, gpu.usable_bytes()};
}

std::optional<std::int64_t> largest_fitting_batch(const Profile& profile, const GpuSpec& gpu) {
  std::optional<std::int64_t> best;
  for (const auto& p : profile.probes) {
    if (!p.oom && check_budget(p.components.step_peak_reserved, gpu).fits()) {
      best = std::max(best.value_or(0), p.batch_size);
    }
  }
  return best;
}

}  // namespace memgate
