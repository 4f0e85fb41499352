// Device resolution and description (names, slugs, LibTorch / CUDA / cuDNN / driver versions).
#include "memgate/measure/device.h"

#include "memgate/base/error.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/AllocatorConfig.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <dlfcn.h>

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <fstream>

#if __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#define MEMGATE_HAVE_CUDA_RUNTIME 1
#endif

namespace memgate {
namespace {

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) {
        auto value = line.substr(colon + 1);
        value.erase(0, value.find_first_not_of(' '));
        return value;
      }
    }
  }
  return "cpu";
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
    info.name = cpu_model_name();
    info.slug = "cpu";
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
  if (const char* conf = std::getenv("PYTORCH_ALLOC_CONF")) info.allocator_settings = conf;
  else if (const char* old = std::getenv("PYTORCH_CUDA_ALLOC_CONF")) info.allocator_settings = old;
  return info;
}

}  // namespace memgate
