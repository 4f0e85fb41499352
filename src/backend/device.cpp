// Device resolution and description (names, slugs, LibTorch / CUDA / cuDNN / driver versions).
#include "memgate/backend/device.h"

#include "memgate/base/error.h"

#include <fmt/format.h>

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/AllocatorConfig.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <dlfcn.h>
#include <sys/utsname.h>

#include <cctype>
#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <utility>
#include <vector>

#if __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#define MEMGATE_HAVE_CUDA_RUNTIME 1
#endif

namespace memgate {
namespace {

// The first processor's `model name` and `flags` in /proc/cpuinfo, read in one pass.
struct CpuInfo {
  std::string model = "cpu";
  std::string flags;
};

CpuInfo read_cpuinfo() {
  CpuInfo info;
  bool model = false, flags = false;
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while ((!model || !flags) && std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    auto value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(' '));
    if (!model && line.rfind("model name", 0) == 0) {
      info.model = value;
      model = true;
    } else if (!flags && line.rfind("flags", 0) == 0) {
      info.flags = value;
      flags = true;
    }
  }
  return info;
}

std::string version_string(long v, long major_div, long minor_div) {
  if (v <= 0) return {};
  return std::to_string(v / major_div) + "." + std::to_string((v % major_div) / minor_div) + "." +
         std::to_string(v % minor_div);
}

// The driver's version from NVML, opened at run time so that machines without a GPU need no libnvidia-ml.
std::string nvidia_driver_version() {
  void* nvml = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (nvml == nullptr) return {};
  using InitFn = int (*)();
  using VersionFn = int (*)(char*, unsigned);
  auto init = reinterpret_cast<InitFn>(dlsym(nvml, "nvmlInit_v2"));
  auto get = reinterpret_cast<VersionFn>(dlsym(nvml, "nvmlSystemGetDriverVersion"));
  auto shutdown = reinterpret_cast<InitFn>(dlsym(nvml, "nvmlShutdown"));
  std::string version;
  if (init != nullptr && get != nullptr && init() == 0) {
    char buffer[96] = {};
    if (get(buffer, sizeof buffer) == 0) version = buffer;
    if (shutdown != nullptr) shutdown();
  }
  dlclose(nvml);
  return version;
}

}  // namespace

std::string slugify(std::string_view name) {
  std::string slug;
  bool dash = false;
  for (char c : name) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      if (dash && !slug.empty()) slug += '-';
      slug += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      dash = false;
    } else {
      dash = true;
    }
  }
  return slug.empty() ? std::string("unknown") : slug;
}

bool cuda_available() { return torch::cuda::is_available(); }

c10::Device resolve_device(std::string_view spec) {
  if (spec == "auto") {
    return cuda_available() ? c10::Device(c10::DeviceType::CUDA, 0) : c10::Device(c10::DeviceType::CPU);
  }
  if (spec == "cpu") return c10::Device(c10::DeviceType::CPU);
  if (spec == "cuda" || spec.rfind("cuda:", 0) == 0) {
    int index = 0;
    if (spec.size() > 4) {
      auto digits = spec.substr(5);
      auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
      if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || index < 0) {
        throw Error("--device: expected auto, cpu, cuda or cuda:N, got '" + std::string(spec) + "'");
      }
    }
    const auto count = cuda_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
    if (index >= count) {
      throw Error("--device " + std::string(spec) + ": no such CUDA device (" + std::to_string(count) +
                  " visible; LibTorch " + (count == 0 ? "sees no GPU on this machine" : "sees fewer") + ")");
    }
    return {c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index)};
  }
  throw Error("--device: expected auto, cpu, cuda or cuda:N, got '" + std::string(spec) + "'");
}

DeviceInfo describe_device(c10::Device device) {
  DeviceInfo info;
  info.device = device;
  info.torch_version = TORCH_VERSION;
  const auto& hooks = at::detail::getCUDAHooks();
  if (hooks.hasCUDA() || at::hasCUDA()) {
    info.cudnn_version = version_string(hooks.versionCuDNN(), 10000, 100);
  }
#ifdef MEMGATE_HAVE_CUDA_RUNTIME
  {
    int runtime = 0;
    if (cudaRuntimeGetVersion(&runtime) == cudaSuccess && runtime > 0) {
      info.cuda_version = std::to_string(runtime / 1000) + "." + std::to_string((runtime % 1000) / 10);
    }
  }
#endif
  if (device.is_cpu()) {
    const auto cpu = read_cpuinfo();
    info.name = cpu.model;
    info.slug = "cpu";
    const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
    if (cap == nullptr) cap = std::getenv("DNNL_MAX_CPU_ISA");
    info.cpu_isa = onednn_cpu_isa(cpu.flags, cap != nullptr ? cap : "");
    info.cpu_features = reduced_precision_cpu_features(cpu.flags);
    set_cpu_kernels(info, CpuKernels::kPortable);
    return info;
  }
#ifdef MEMGATE_HAVE_CUDA_RUNTIME
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device.index()) != cudaSuccess) {
    throw Error("cannot query CUDA device " + std::to_string(device.index()));
  }
  info.name = prop.name;
  info.slug = slugify(info.name);
  info.total_memory = static_cast<std::int64_t>(prop.totalGlobalMem);
#else
  info.name = "cuda";
  info.slug = "cuda";
#endif
  info.driver_version = nvidia_driver_version();
  if (const char* loading = std::getenv("CUDA_MODULE_LOADING")) info.cuda_module_loading = loading;
  info.allocator_settings = allocator_settings_from_environment();
  return info;
}

namespace {

// Runs while the program starts, before main() and so before any CUDA call LibTorch could make: every program
// linking the measure library measures with the CUDA environment PyTorch users have.
[[maybe_unused]] const bool kCudaEnvironmentPrepared = prepare_cuda_environment();

std::optional<int> parse_index(std::string_view text) {
  int value = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0) return std::nullopt;
  return value;
}

}  // namespace

bool prepare_cuda_environment() {
  static bool prepared = false;
  if (prepared) return true;
  prepared = true;
  setenv("CUDA_MODULE_LOADING", "LAZY", /*overwrite=*/0);
  setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", /*overwrite=*/0);
  return true;
}

namespace {

// The CUDA ordinal of the one GPU that CTest's `variable` ("id:N,slots:1") names, through CUDA_VISIBLE_DEVICES.
c10::DeviceIndex ctest_gpu_ordinal(std::string_view variable, std::string_view value, std::string_view visible,
                                   int device_count) {
  // "id:N,slots:1"; several entries (separated by ';') would be several GPUs for one resource group.
  const auto expected = fmt::format("{}: expected one GPU as \"id:N,slots:1\", got \"{}\"", variable, value);
  if (value.find(';') != std::string_view::npos || !value.starts_with("id:")) throw Error(expected);
  const auto comma = value.find(',');
  const auto id = parse_index(value.substr(3, comma == std::string_view::npos ? std::string_view::npos : comma - 3));
  if (!id) throw Error(expected);
  int ordinal = *id;
  if (!visible.empty()) {
    // The assigned id is a physical index; CUDA numbers the visible GPUs from 0 in the order listed.
    ordinal = -1;
    int position = 0;
    for (std::size_t start = 0; start <= visible.size(); ++position) {
      const auto end = std::min(visible.find(',', start), visible.size());
      const auto entry = parse_index(visible.substr(start, end - start));
      if (!entry) {
        throw Error(fmt::format("CUDA_VISIBLE_DEVICES=\"{}\": expected GPU indices separated by commas to map "
                                "CTest's GPU {} (UUIDs and MIG instances cannot be mapped: list indices, or unset it)",
                                visible, *id));
      }
      if (*entry == *id && ordinal < 0) ordinal = position;
      start = end + 1;
    }
    if (ordinal < 0) {
      throw Error(fmt::format("CTest assigned GPU {}, which CUDA_VISIBLE_DEVICES=\"{}\" hides: give CTest a resource "
                              "spec of the visible GPUs", *id, visible));
    }
  }
  if (ordinal >= device_count) {
    throw Error(fmt::format("CTest assigned GPU {} (ordinal {}), but this process sees {} CUDA device(s)", *id,
                            ordinal, device_count));
  }
  return static_cast<c10::DeviceIndex>(ordinal);
}

}  // namespace

c10::DeviceIndex assigned_gpu(std::string_view ctest_resource, std::string_view visible, int device_count) {
  if (device_count < 1) throw Error("no CUDA device is visible to this process");
  if (ctest_resource.empty()) {
    if (device_count > 1) {
      throw Error(fmt::format("{} GPUs are visible and CTest assigned none to this test: run the `gpu` test preset "
                              "(it passes a resource spec file), or set CUDA_VISIBLE_DEVICES to one GPU",
                              device_count));
    }
    return 0;
  }
  return ctest_gpu_ordinal("CTEST_RESOURCE_GROUP_0_GPUS", ctest_resource, visible, device_count);
}

std::vector<c10::DeviceIndex> assigned_gpus(const std::vector<std::string>& ctest_resources, std::string_view visible,
                                            int device_count, int ranks) {
  if (ranks < 1) throw Error(fmt::format("{} ranks: expected at least one", ranks));
  std::vector<c10::DeviceIndex> out;
  if (ctest_resources.empty()) {
    if (device_count != ranks) {
      throw Error(fmt::format("{} ranks need a GPU each, and this process sees {} CUDA device(s) with none assigned by "
                              "CTest: run the `gpu` test preset (its resource spec gives each rank a GPU), or make "
                              "exactly {} GPUs visible (CUDA_VISIBLE_DEVICES)", ranks, device_count, ranks));
    }
    for (int r = 0; r < ranks; ++r) out.push_back(static_cast<c10::DeviceIndex>(r));
    return out;
  }
  if (static_cast<int>(ctest_resources.size()) != ranks) {
    throw Error(fmt::format("CTest assigned {} resource group(s) to a test of {} ranks: expected one GPU per rank "
                            "(RESOURCE_GROUPS {},gpus:1)", ctest_resources.size(), ranks, ranks));
  }
  for (int r = 0; r < ranks; ++r) {
    const auto ordinal = ctest_gpu_ordinal(fmt::format("CTEST_RESOURCE_GROUP_{}_GPUS", r),
                                           ctest_resources[static_cast<std::size_t>(r)], visible, device_count);
    if (std::find(out.begin(), out.end(), ordinal) != out.end()) {
      throw Error(fmt::format("CTest assigned GPU ordinal {} to two ranks: each rank needs a GPU of its own", ordinal));
    }
    out.push_back(ordinal);
  }
  return out;
}

std::vector<c10::DeviceIndex> consecutive_gpus(c10::DeviceIndex first, int ranks, int device_count) {
  if (ranks < 1) throw Error(fmt::format("{} ranks: expected at least one", ranks));
  if (first < 0 || first + ranks > device_count) {
    throw Error(fmt::format("{} ranks need a GPU each, cuda:{} to cuda:{}, and this process sees {} CUDA device(s): "
                            "run on a machine with {} GPUs, or estimate each rank without them (memgate estimate)",
                            ranks, first < 0 ? 0 : first, (first < 0 ? 0 : first) + ranks - 1, device_count, ranks));
  }
  std::vector<c10::DeviceIndex> out;
  for (int r = 0; r < ranks; ++r) out.push_back(static_cast<c10::DeviceIndex>(first + r));
  return out;
}

namespace {

std::vector<std::string_view> split_flags(std::string_view flags) {
  std::vector<std::string_view> have;
  for (std::size_t start = 0; start < flags.size();) {
    auto end = flags.find_first_of(" \t\n", start);
    if (end == std::string_view::npos) end = flags.size();
    if (end > start) have.push_back(flags.substr(start, end - start));
    start = end + 1;
  }
  return have;
}

}  // namespace

std::string reduced_precision_cpu_features(std::string_view flags) {
  // What ATen's mkldnn_bf16_device_check / mkldnn_fp16_device_check and oneDNN's ukernels read from cpuinfo.
  static constexpr std::string_view kFeatures[] = {"avx512_bf16", "avx512_fp16", "avx_ne_convert", "amx_bf16",
                                                   "amx_fp16"};
  const auto have = split_flags(flags);
  std::string out;
  for (const auto feature : kFeatures) {
    if (std::find(have.begin(), have.end(), feature) == have.end()) continue;
    if (!out.empty()) out += ' ';
    out += feature;
  }
  return out;
}

void set_cpu_kernels(DeviceInfo& info, CpuKernels kernels) {
  info.cpu_kernels = std::string(name_of(kCpuKernelsNames, kernels));
  if (kernels == CpuKernels::kPortable) {
    info.slug = "cpu";
    return;
  }
  struct utsname machine {};
  const std::string isa = !info.cpu_isa.empty() ? info.cpu_isa : uname(&machine) == 0 ? machine.machine : "unknown";
  info.slug = "cpu-" + slugify(isa);
}

std::string onednn_cpu_isa(std::string_view flags, std::string_view cap) {
  // oneDNN's x86 ISA classes, lowest first, each with the CPU flags it needs (cpu_isa_traits.hpp).
  static const std::vector<std::pair<std::string, std::vector<std::string>>> kIsas = {
      {"sse41", {"sse4_1"}},
      {"avx", {"avx"}},
      {"avx2", {"avx2"}},
      {"avx2_vnni", {"avx2", "avx_vnni"}},
      {"avx512_core", {"avx512f", "avx512bw", "avx512vl", "avx512dq"}},
      {"avx512_core_vnni", {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}},
      {"avx512_core_bf16", {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16"}},
      {"avx512_core_fp16", {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16", "avx512_fp16"}},
      {"avx512_core_amx",
       {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}},
  };
  const auto have = split_flags(flags);
  auto has = [&](const std::string& flag) { return std::find(have.begin(), have.end(), flag) != have.end(); };
  std::string lower_cap(cap);
  for (auto& c : lower_cap) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // oneDNN spells some caps by their AVX10 names.
  if (lower_cap == "avx10_1_512") lower_cap = "avx512_core_fp16";
  if (lower_cap == "avx10_1_512_amx" || lower_cap == "avx10_1_512_amx_fp16") lower_cap = "avx512_core_amx";
  std::string best;
  for (const auto& [isa, needs] : kIsas) {
    if (!std::all_of(needs.begin(), needs.end(), has)) continue;
    best = isa;
    if (isa == lower_cap) break;  // the cap: nothing above it
  }
  return best;
}

std::int64_t device_total_memory(c10::Device device) {
#ifdef MEMGATE_HAVE_CUDA_RUNTIME
  cudaDeviceProp prop{};
  if (device.is_cuda() && cudaGetDeviceProperties(&prop, device.index()) == cudaSuccess) {
    return static_cast<std::int64_t>(prop.totalGlobalMem);
  }
#endif
  return 0;
}

std::string allocator_settings_from_environment() {
  if (const char* conf = std::getenv("PYTORCH_ALLOC_CONF")) return conf;
  if (const char* old = std::getenv("PYTORCH_CUDA_ALLOC_CONF")) return old;
  return {};
}

std::string merge_allocator_settings(std::string_view environment, std::string_view fixture) {
  std::vector<std::pair<std::string, std::string>> merged;
  auto add = [&](std::string_view settings, std::string_view where) {
    for (std::size_t start = 0; start < settings.size();) {
      auto end = settings.find(',', start);
      if (end == std::string_view::npos) end = settings.size();
      const auto entry = settings.substr(start, end - start);
      start = end + 1;
      if (entry.empty()) continue;
      const auto colon = entry.find(':');
      if (colon == std::string_view::npos || colon == 0 || colon + 1 == entry.size()) {
        throw Error(fmt::format("{}: allocator setting '{}': expected key:value (e.g. expandable_segments:True)",
                                where, entry));
      }
      const std::string key(entry.substr(0, colon)), value(entry.substr(colon + 1));
      auto it = std::find_if(merged.begin(), merged.end(), [&](const auto& kv) { return kv.first == key; });
      if (it != merged.end()) it->second = value;
      else merged.emplace_back(key, value);
    }
  };
  add(environment, "PYTORCH_ALLOC_CONF");
  add(fixture, "the fixture's training.allocator");
  std::string out;
  for (const auto& [key, value] : merged) out += (out.empty() ? "" : ",") + key + ":" + value;
  return out;
}

std::vector<c10::DeviceIndex> gpus_for_test(int ranks) {
  std::vector<std::string> groups;
  if (const char* count = std::getenv("CTEST_RESOURCE_GROUP_COUNT"); count != nullptr && *count != '\0') {
    const auto n = parse_index(count);
    if (!n) throw Error(fmt::format("CTEST_RESOURCE_GROUP_COUNT=\"{}\": expected a number of resource groups", count));
    for (int g = 0; g < *n; ++g) {
      const char* value = std::getenv(fmt::format("CTEST_RESOURCE_GROUP_{}_GPUS", g).c_str());
      groups.emplace_back(value != nullptr ? value : "");
    }
  }
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return assigned_gpus(groups, visible != nullptr ? visible : "", static_cast<int>(torch::cuda::device_count()), ranks);
}

c10::Device gpu_for_test() {
  const char* resource = std::getenv("CTEST_RESOURCE_GROUP_0_GPUS");
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return {c10::DeviceType::CUDA, assigned_gpu(resource != nullptr ? resource : "", visible != nullptr ? visible : "",
                                              static_cast<int>(torch::cuda::device_count()))};
}

}  // namespace memgate
