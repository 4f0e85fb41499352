// GPU fixtures, and where a project's files and memgate's own data are.
#include "memgate/spec/gpus.h"

#include "memgate/base/error.h"
#include "memgate/base/units.h"
#include "memgate/spec/yaml_reader.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>

namespace memgate {

namespace {

std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

}  // namespace

std::string project_dir() {
  for (const char* name : {"MEMGATE_PROJECT_DIR", "MEMGATE_SOURCE_DIR"}) {
    if (auto dir = environment(name); !dir.empty()) return dir;
  }
  return std::filesystem::current_path().string();
}

std::string data_dir() {
  if (auto dir = environment("MEMGATE_DATA_DIR"); !dir.empty()) return dir;
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  // <prefix>/bin/<exe>, or <prefix>/libexec/memgate/<exe> (the measuring half of the memgate command).
  for (auto prefix = exe.parent_path().parent_path(); const int depth : {0, 1}) {
    if (depth == 1) prefix = prefix.parent_path();
    if (const auto share = prefix / "share" / "memgate"; std::filesystem::is_directory(share, ec)) return share.string();
  }
  return "";
}

std::string gpus_dir(const std::string& project) {
  std::error_code ec;
  const auto own = std::filesystem::path(project) / "fixtures" / "gpus";
  if (std::filesystem::is_directory(own, ec)) return own.string();
  const auto data = data_dir();
  if (!data.empty() && std::filesystem::is_directory(std::filesystem::path(data) / "fixtures" / "gpus", ec)) {
    return (std::filesystem::path(data) / "fixtures" / "gpus").string();
  }
  throw Error("no GPU fixtures: neither " + own.string() + " nor " +
              (data.empty() ? std::string("memgate's data folder (set MEMGATE_DATA_DIR to <prefix>/share/memgate)")
                            : data + "/fixtures/gpus") +
              " exists");
}

std::int64_t GpuSpec::usable_bytes() const {
  return static_cast<std::int64_t>(std::floor(usable_fraction * static_cast<double>(memory_bytes))) -
         outside_allocator_bytes;
}

std::int64_t GpuSpec::library_workspace_bytes() const {
  constexpr std::int64_t kHopper = 4096LL * 8 * 1024, kOther = 4096LL * 2 * 1024 + 16LL * 8 * 1024, kLt = 1 << 20;
  const bool hopper = compute_capability.empty() || compute_capability.starts_with("9.");
  return 2 * (hopper ? kHopper : kOther) + kLt;
}

std::string format_usable(std::int64_t usable_bytes) { return format_mib(usable_bytes); }

namespace {

// cuDNN's device properties, each key of cudaDeviceProp (or cudaDeviceGetAttribute) that
// CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION requires (cuDNN 9.19 rejects a JSON without any one of them), written
// back as JSON in this order.
constexpr std::array<const char*, 23> kCudnnDeviceKeys{
    "deviceVer", "multiProcessorCount", "warpSize", "maxSharedMemoryPerBlock", "maxSharedMemoryPerBlockOptin",
    "reservedSharedMemoryPerBlock", "maxRegistersPerSM", "maxCtasPerSM", "maxThreadsPerBlock", "maxThreadsPerSM",
    "regsPerBlock", "totalGlobalMem", "smClockRateKHz", "l2CacheSize", "maxBlockSize", "memClockRateKHz",
    "maxGridSize", "supportCoopLaunch", "pciDeviceId", "isTccDriver", "cudaDeviceId", "driverVer", "deviceName"};

bool is_cudnn_device_list(const std::string& name) { return name == "maxBlockSize" || name == "maxGridSize"; }

void read_cudnn_device(detail::MapReader r, GpuSpec& gpu) {
  nlohmann::ordered_json json;
  for (const char* key : kCudnnDeviceKeys) {
    const std::string name = key;
    if (is_cudnn_device_list(name)) {
      json[name] = r.get_int_list(name, std::nullopt, 1);
    } else if (name == "deviceName") {
      json[name] = r.get_string(name, std::nullopt);
    } else {
      json[name] = r.get_int(name, std::nullopt, 0);
    }
  }
  gpu.cudnn_device_sources = r.get_string("sources", std::nullopt);
  r.finish();
  gpu.cudnn_device_json = json.dump();
}

}  // namespace

std::string checked_cudnn_device_json(const std::string& text, const std::string& where) {
  const auto expected = [&] {
    std::string keys;
    for (const char* key : kCudnnDeviceKeys) keys += std::string(keys.empty() ? "" : ", ") + key;
    return where + ": expected the JSON object of cuDNN's device properties (a GPU fixture's cudnn_device as JSON, "
                   "with its " + std::to_string(kCudnnDeviceKeys.size()) + " keys: " + keys + "), but ";
  };
  const auto shown = text.size() > 80 ? text.substr(0, 77) + "..." : text;
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    std::string hint;
    std::error_code ec;
    if (std::filesystem::is_regular_file(text, ec)) {
      hint = "; it names a file: give its JSON text instead (" + where + "=\"$(cat " + text + ")\")";
    }
    std::string what = e.what();
    if (const auto at = what.find("] "); at != std::string::npos) what = what.substr(at + 2);
    throw Error(expected() + "its value is not JSON ('" + shown + "': " + what + ")" + hint);
  }
  if (!json.is_object()) {
    throw Error(expected() + "its value is " + std::string(json.type_name()) + " ('" + shown + "'), not an object");
  }
  for (const char* key : kCudnnDeviceKeys) {
    const std::string name = key;
    const auto it = json.find(name);
    if (it == json.end()) throw Error(expected() + "key \"" + name + "\" is missing");
    std::string want;
    if (is_cudnn_device_list(name)) {
      const auto positive = [](const nlohmann::json& v) { return v.is_number_integer() && v >= 1; };
      const bool ok = it->is_array() && it->size() == 3 && std::all_of(it->begin(), it->end(), positive);
      if (!ok) want = "a list of 3 positive integers";
    } else if (name == "deviceName") {
      if (!it->is_string()) want = "a string";
    } else if (!it->is_number_integer() || *it < 0) {
      want = "a non-negative integer";
    }
    if (!want.empty()) throw Error(expected() + "key \"" + name + "\" is " + it->dump() + ", expected " + want);
  }
  return text;
}

namespace {

GpuSpec gpu_from_yaml(const YAML::Node& root, const std::string& path) {
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
  gpu.compute_capability = r.get_string("compute_capability", std::string());
  if (!gpu.compute_capability.empty()) {
    const auto& cc = gpu.compute_capability;
    const auto dot = cc.find('.');
    if (dot == std::string::npos || dot == 0 || dot + 1 == cc.size() ||
        cc.find_first_not_of("0123456789.") != std::string::npos || cc.find('.', dot + 1) != std::string::npos) {
      r.fail("compute_capability", "a compute capability as major.minor (\"9.0\", \"7.5\")", cc);
    }
  }
  gpu.multiprocessors = static_cast<int>(r.get_int("multiprocessors", 0, 0, 10000));
  gpu.max_threads_per_multiprocessor = static_cast<int>(r.get_int("max_threads_per_multiprocessor", 0, 0, 1 << 16));
  gpu.sources = r.get_string("sources", std::string());
  gpu.measured = r.get_bool("measured", false);
  if (r.has("cudnn_device")) read_cudnn_device(r.child("cudnn_device"), gpu);
  if (gpu.usable_bytes() <= 0) {
    r.fail("outside_allocator_mib",
           "less than memory_gib x usable_fraction (" + format_bytes(gpu.usable_bytes() + gpu.outside_allocator_bytes) +
               "), so that some memory is usable",
           format_bytes(gpu.outside_allocator_bytes));
  }
  r.finish();
  return gpu;
}

}  // namespace

GpuSpec load_gpu(const std::string& path) { return gpu_from_yaml(detail::load_yaml_file(path), path); }

GpuSpec gpu_from_text(const std::string& text, const std::string& name) {
  try {
    return gpu_from_yaml(YAML::Load(text), name);
  } catch (const YAML::Exception& e) {
    throw Error(name + ":" + std::to_string(e.mark.line + 1) + ": not valid YAML: " + e.msg);
  }
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

}  // namespace memgate
