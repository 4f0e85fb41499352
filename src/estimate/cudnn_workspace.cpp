// cuDNN's convolution workspaces without a GPU: the backend C API of the cuDNN the torch wheel ships, given a GPU's
// device properties as JSON, runs its heuristics and builds execution plans with no device and no driver (cuDNN looks
// for libcuda, does not find it, and goes on). Only libcudnn_graph.so.9 is loaded, at run time; it loads cuDNN's
// heuristic and engine libraries (and NVRTC, for the runtime-compiled engines' plans) from beside itself.
#include "memgate/estimate/cudnn_workspace.h"

#include "memgate/base/error.h"
#include "memgate/estimate/estimate_context.h"
#include "memgate/spec/gpus.h"

#include <c10/core/CPUAllocator.h>

#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if MEMGATE_HAS_CUDNN_HEADERS
#include <cudnn_graph.h>
#endif

namespace memgate {

#if MEMGATE_HAS_CUDNN_HEADERS
namespace {

// The few functions of cuDNN's backend API this needs, found in the loaded library.
struct CudnnLibrary {
  decltype(&cudnnGetVersion) get_version = nullptr;
  decltype(&cudnnGetErrorString) error_string = nullptr;
  decltype(&cudnnGetLastErrorString) last_error = nullptr;
  decltype(&cudnnBackendCreateDescriptor) create = nullptr;
  decltype(&cudnnBackendDestroyDescriptor) destroy = nullptr;
  decltype(&cudnnBackendSetAttribute) set = nullptr;
  decltype(&cudnnBackendGetAttribute) get = nullptr;
  decltype(&cudnnBackendFinalize) finalize = nullptr;
  std::string path;
  std::string failure;  ///< why it could not be loaded ("" when it was)
};

// LibTorch's own folder (torch/lib of the wheel, or an unzipped libtorch's lib), from where its c10 was loaded.
std::string torch_library_folder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&c10::GetCPUAllocator), &info) == 0 || info.dli_fname == nullptr) return "";
  return std::filesystem::path(info.dli_fname).parent_path().string();
}

// Beside LibTorch's libraries first: the wheel's site-packages/nvidia/cudnn/lib (the cuDNN torch itself runs: the
// baselines' provenance says 9.19.0), or an unzipped libtorch's lib; then the default search path.
std::vector<std::string> library_candidates() {
  std::vector<std::string> candidates;
  if (const auto torch = torch_library_folder(); !torch.empty()) {
    const std::filesystem::path lib(torch);
    candidates.push_back((lib / ".." / ".." / "nvidia" / "cudnn" / "lib" / "libcudnn_graph.so.9").lexically_normal().string());
    candidates.push_back((lib / "libcudnn_graph.so.9").string());
  }
  candidates.emplace_back("libcudnn_graph.so.9");
  return candidates;
}

// cuDNN opens NVRTC (libnvrtc.so.<its CUDA's major>, 109 MB) to build a runtime-compiled engine's plan and closes it
// again before the plan is finalized: each such plan loaded, relocated and initialised it anew, half the CPU time of a
// conv net's estimates for CUDA (camo_seg_stage2's search by estimate over the GPUs and camo_seg_stage1's per GPU,
// 12.7 s against 6.0). So the file that cuDNN's open finds is opened here, once, and kept (RTLD_NODELETE): cuDNN's
// open then finds it loaded (by its soname). Only where the dynamic loader's search from libcudnn_graph finds it in
// LD_LIBRARY_PATH or libcudnn_graph's RUNPATH (the wheel's nvidia/cu13/lib): in the system's folders the loader's cache
// decides, and cuDNN opens it as before. A plan's workspace is the same either way.
void keep_nvrtc_loaded(void* cudnn_graph, std::size_t cudart_version) {
  Dl_serinfo size{};
  if (cudart_version < 1000 || dlinfo(cudnn_graph, RTLD_DI_SERINFOSIZE, &size) != 0) return;
  // Room to spare: glibc 2.36 wrote past the size it counted (the folders of libcudnn_graph's search: 547 bytes).
  std::vector<std::max_align_t> buffer((2 * size.dls_size + 4096) / sizeof(std::max_align_t));
  auto* info = reinterpret_cast<Dl_serinfo*>(buffer.data());
  if (dlinfo(cudnn_graph, RTLD_DI_SERINFOSIZE, info) != 0 || dlinfo(cudnn_graph, RTLD_DI_SERINFO, info) != 0) return;
  const auto file = "libnvrtc.so." + std::to_string(cudart_version / 1000);
  for (unsigned i = 0; i < info->dls_cnt; ++i) {
    const std::filesystem::path folder = std::filesystem::path(info->dls_serpath[i].dls_name).lexically_normal();
    const auto system = [](const std::filesystem::path& p) {
      return p == "/lib" || p == "/usr/lib" || p == "/lib64" || p == "/usr/lib64";
    };
    if (system(folder) || system(folder.parent_path())) return;
    std::error_code ec;
    if (!std::filesystem::exists(folder / file, ec)) continue;
    (void)dlopen((folder / file).c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    return;
  }
}

const CudnnLibrary& cudnn() {
  static const CudnnLibrary library = [] {
    CudnnLibrary l;
    void* handle = nullptr;
    std::string tried;
    for (const auto& candidate : library_candidates()) {
      const bool absolute = candidate.find('/') != std::string::npos;
      if (absolute && !std::filesystem::exists(candidate)) {
        tried += "\n  " + candidate + ": no such file";
        continue;
      }
      handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle != nullptr) {
        l.path = candidate;
        break;
      }
      const char* why = dlerror();
      tried += "\n  " + candidate + ": " + (why != nullptr ? why : "not loaded");
    }
    if (handle == nullptr) {
      l.failure = "cuDNN's libcudnn_graph.so.9 could not be loaded; looked for it:" + tried;
      return l;
    }
    auto find = [&](auto& function, const char* name) {
      function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(dlsym(handle, name));
      if (function == nullptr && l.failure.empty()) l.failure = l.path + " has no " + name;
    };
    find(l.get_version, "cudnnGetVersion");
    find(l.error_string, "cudnnGetErrorString");
    find(l.last_error, "cudnnGetLastErrorString");
    find(l.create, "cudnnBackendCreateDescriptor");
    find(l.destroy, "cudnnBackendDestroyDescriptor");
    find(l.set, "cudnnBackendSetAttribute");
    find(l.get, "cudnnBackendGetAttribute");
    find(l.finalize, "cudnnBackendFinalize");
    if (l.failure.empty() && l.get_version() / 10000 != CUDNN_MAJOR) {
      l.failure = l.path + " is cuDNN " + std::to_string(l.get_version()) + ", not the major version " +
                  std::to_string(CUDNN_MAJOR) + " memgate was built with";
    }
    if (const auto cudart_version = reinterpret_cast<decltype(&cudnnGetCudartVersion)>(
            dlsym(handle, "cudnnGetCudartVersion"));
        l.failure.empty() && cudart_version != nullptr) {
      keep_nvrtc_loaded(handle, cudart_version());
    }
    return l;
  }();
  return library;
}

const CudnnLibrary& loaded_cudnn() {
  const auto& l = cudnn();
  if (!l.failure.empty()) {
    throw Error(l.failure + "\nAn estimate for CUDA asks cuDNN (the one the torch wheel ships, nvidia-cudnn-cu13) "
                "which plan each convolution runs and the workspace it takes: install torch's CUDA wheel, or put "
                "cuDNN 9's libraries on the library path.");
  }
  return l;
}

// A backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type) {
    check(cudnn().create(type, &descriptor_), "cudnnBackendCreateDescriptor");
  }
  Descriptor() = default;
  Descriptor(Descriptor&& other) noexcept : descriptor_(std::exchange(other.descriptor_, nullptr)) {}
  Descriptor& operator=(Descriptor&& other) noexcept {
    std::swap(descriptor_, other.descriptor_);
    return *this;
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() {
    if (descriptor_ != nullptr) cudnn().destroy(descriptor_);
  }
  cudnnBackendDescriptor_t get() const { return descriptor_; }
  cudnnBackendDescriptor_t* address() { return &descriptor_; }

  template <typename T>
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const T* values, std::int64_t count,
           const char* what) {
    check(cudnn().set(descriptor_, name, type, count, values), what);
  }
  void set(cudnnBackendAttributeName_t name, const Descriptor& value, const char* what) {
    auto raw = value.get();
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw, 1, what);
  }
  void finalize(const char* what) { check(cudnn().finalize(descriptor_), what); }

  static void check(cudnnStatus_t status, const char* what) {
    if (status == CUDNN_STATUS_SUCCESS) return;
    char last[1024] = {};
    cudnn().last_error(last, sizeof last);
    throw Error(std::string("cuDNN: ") + what + ": " + cudnn().error_string(status) + (last[0] ? std::string(": ") + last : ""));
  }

 private:
  cudnnBackendDescriptor_t descriptor_ = nullptr;
};

cudnnDataType_t cudnn_type(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float: return CUDNN_DATA_FLOAT;
    case c10::ScalarType::Half: return CUDNN_DATA_HALF;
    case c10::ScalarType::BFloat16: return CUDNN_DATA_BFLOAT16;
    case c10::ScalarType::Double: return CUDNN_DATA_DOUBLE;
    default: throw Error(std::string("cuDNN convolutions take no ") + c10::toString(dtype) + " tensors");
  }
}

// ATen's fixSizeOneDimStride (getTensorDescriptorWithTypeVirtual): a size-1 dim gets the stride of the dims inside it,
// walked in the memory format's order (channels last: C, then the spatial dims from the last, then N).
std::vector<std::int64_t> fixed_strides(const std::vector<std::int64_t>& sizes, std::vector<std::int64_t> strides,
                                        bool channels_last) {
  const auto dims = static_cast<int>(sizes.size());
  std::vector<int> order;
  if (channels_last) order.push_back(1);
  for (int d = dims - 1; d > 1; --d) order.push_back(d);
  if (!channels_last) order.push_back(1);
  order.push_back(0);
  std::int64_t inner = 1;
  for (const int d : order) {
    if (sizes[d] == 1) {
      strides[d] = inner;
    } else {
      inner *= sizes[d];
    }
  }
  return strides;
}

Descriptor tensor(std::int64_t id, cudnnDataType_t type, const std::vector<std::int64_t>& sizes,
                  const std::vector<std::int64_t>& strides, const CudnnConvolution& c) {
  Descriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const auto fixed = fixed_strides(sizes, strides, c.channels_last);
  const auto dims = static_cast<std::int64_t>(sizes.size());
  t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &type, 1, "tensor data type");
  t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, sizes.data(), dims, "tensor dimensions");
  t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, fixed.data(), dims, "tensor strides");
  t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &id, 1, "tensor id");
  t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &c.alignment, 1, "tensor alignment");
  t.finalize("tensor descriptor");
  return t;
}

// What build_opgraph gives cuDNN: the x, y and w tensors (ids 'x', 'y', 'w'), a cross-correlation of the input's type
// (fp32 for fp16 and bf16 inputs) with symmetric padding, in one operation of the pass's kind.
struct Graph {
  Descriptor x, y, w, convolution, operation, graph;
};

Graph operation_graph(const CudnnConvolution& c) {
  Graph g;
  const auto type = cudnn_type(c.dtype);
  g.x = tensor('x', type, c.x_sizes, c.x_strides, c);
  g.y = tensor('y', type, c.y_sizes, c.y_strides, c);
  g.w = tensor('w', type, c.w_sizes, c.w_strides, c);
  const auto compute = c.dtype == c10::ScalarType::Half || c.dtype == c10::ScalarType::BFloat16 ? CUDNN_DATA_FLOAT : type;
  const auto mode = CUDNN_CROSS_CORRELATION;
  const auto spatial = static_cast<std::int64_t>(c.stride.size());
  g.convolution = Descriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  g.convolution.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &compute, 1, "convolution compute type");
  g.convolution.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, &mode, 1, "convolution mode");
  g.convolution.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, &spatial, 1, "convolution dims");
  g.convolution.set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, c.padding.data(), spatial, "padding");
  g.convolution.set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, c.padding.data(), spatial, "padding");
  g.convolution.set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, c.stride.data(), spatial, "stride");
  g.convolution.set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, c.dilation.data(), spatial, "dilation");
  g.convolution.finalize("convolution descriptor");

  struct Names {
    cudnnBackendDescriptorType_t type;
    cudnnBackendAttributeName_t alpha, beta, convolution, x, w, y;
  };
  const Names names = c.pass == ConvolutionPass::kForward
      ? Names{CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y}
      : c.pass == ConvolutionPass::kBackwardData
      ? Names{CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY}
      : Names{CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY};
  // cudnn_frontend's OperationBuilder passes alpha and beta as floats for a float compute type, doubles for double.
  g.operation = Descriptor(names.type);
  if (compute == CUDNN_DATA_DOUBLE) {
    const double alpha = 1.0, beta = 0.0;
    g.operation.set(names.alpha, CUDNN_TYPE_DOUBLE, &alpha, 1, "alpha");
    g.operation.set(names.beta, CUDNN_TYPE_DOUBLE, &beta, 1, "beta");
  } else {
    const float alpha = 1.0F, beta = 0.0F;
    g.operation.set(names.alpha, CUDNN_TYPE_FLOAT, &alpha, 1, "alpha");
    g.operation.set(names.beta, CUDNN_TYPE_FLOAT, &beta, 1, "beta");
  }
  g.operation.set(names.convolution, g.convolution, "convolution");
  g.operation.set(names.x, g.x, "x");
  g.operation.set(names.w, g.w, "w");
  g.operation.set(names.y, g.y, "y");
  g.operation.finalize("convolution operation");
  g.graph = Descriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  g.graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, g.operation, "operation graph");
  // No CUDNN_ATTR_OPERATIONGRAPH_HANDLE: a handle needs a GPU; the device properties stand in for it below.
  g.graph.finalize("operation graph");
  return g;
}

// The engine configs of one heuristic mode, in cuDNN's order.
std::vector<Descriptor> engine_configs(const Graph& g, const Descriptor& device, cudnnBackendHeurMode_t mode) {
  Descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heuristics.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g.graph, "heuristics graph");
  heuristics.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode, 1, "heuristics mode");
  // Without the device properties cuDNN's heuristics answer no config at all (every one fails its support checks
  // against zeroed properties).
  heuristics.set(CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, device, "heuristics device properties");
  heuristics.finalize("heuristics");
  std::int64_t count = 0;
  Descriptor::check(cudnn().get(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                &count, nullptr), "heuristics results");
  std::vector<Descriptor> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (std::int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  std::int64_t returned = 0;
  Descriptor::check(cudnn().get(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                &returned, raw.data()), "heuristics results");
  configs.resize(static_cast<std::size_t>(std::min(returned, count)));
  return configs;
}

bool has_note(const std::vector<cudnnBackendNumericalNote_t>& notes, cudnnBackendNumericalNote_t note) {
  return std::find(notes.begin(), notes.end(), note) != notes.end();
}

// ATen's filterEngineConfigs: a config goes if it is nondeterministic where determinism is asked for, if it
// down-converts its inputs (always), or if it uses tensor cores (TF32) for an fp32 convolution with TF32 off.
bool aten_filters_out(const Descriptor& config, const CudnnConvolution& c) {
  Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  std::int64_t count = 0;
  auto raw = engine.get();
  Descriptor::check(cudnn().get(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count,
                                &raw), "engine of a config");
  std::vector<cudnnBackendNumericalNote_t> notes(CUDNN_NUMERICAL_NOTE_TYPE_COUNT);
  Descriptor::check(cudnn().get(engine.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                static_cast<std::int64_t>(notes.size()), &count, notes.data()), "numerical notes");
  notes.resize(static_cast<std::size_t>(count));
  if (c.deterministic && has_note(notes, CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC)) return true;
  if (has_note(notes, CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)) return true;
  return c.dtype == c10::ScalarType::Float && !c.allow_tf32 && has_note(notes, CUDNN_NUMERICAL_NOTE_TENSOR_CORE);
}

// The workspace of the plan built from `config`, or nothing where cuDNN builds none (try_configs goes on).
std::optional<std::int64_t> plan_workspace(const Descriptor& config, const Descriptor& device) {
  Descriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  plan.set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config, "plan's engine config");
  plan.set(CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, device, "plan's device properties");
  if (cudnn().finalize(plan.get()) != CUDNN_STATUS_SUCCESS) return std::nullopt;
  std::int64_t bytes = 0, count = 0;
  Descriptor::check(cudnn().get(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &count,
                                &bytes), "plan workspace size");
  return bytes;
}

std::string describe(const CudnnConvolution& c) {
  std::ostringstream out;
  auto list = [&](const std::vector<std::int64_t>& v) {
    out << '[';
    for (std::size_t i = 0; i < v.size(); ++i) out << (i ? "," : "") << v[i];
    out << ']';
  };
  out << (c.pass == ConvolutionPass::kForward ? "forward" : c.pass == ConvolutionPass::kBackwardData ? "backward data"
                                                                                                       : "backward filter")
      << ' ' << c10::toString(c.dtype) << (c.channels_last ? " channels-last" : "") << " x";
  list(c.x_sizes);
  list(c.x_strides);
  out << " w";
  list(c.w_sizes);
  list(c.w_strides);
  out << " y";
  list(c.y_sizes);
  list(c.y_strides);
  out << " stride";
  list(c.stride);
  out << " padding";
  list(c.padding);
  out << " dilation";
  list(c.dilation);
  out << " align " << c.alignment << " deterministic " << c.deterministic << " tf32 " << c.allow_tf32;
  return out.str();
}

}  // namespace

std::int64_t cudnn_workspace_bytes(const CudnnConvolution& convolution, const std::string& device_json) {
  static std::mutex mutex;
  static std::map<std::string, std::int64_t> cache;
  static std::map<std::string, Descriptor> devices;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = describe(convolution) + '\n' + device_json;
  if (const auto hit = cache.find(key); hit != cache.end()) return hit->second;
  loaded_cudnn();
  auto device = devices.find(device_json);
  if (device == devices.end()) {
    Descriptor properties(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR);
    properties.set(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, device_json.data(),
                   static_cast<std::int64_t>(device_json.size()), "device properties (cudnn_device)");
    properties.finalize("device properties (cudnn_device)");
    device = devices.emplace(device_json, std::move(properties)).first;
  }
  const auto graph = operation_graph(convolution);
  // run_single_conv with benchmarking off: the heuristics' configs, then the fallback list's, each filtered; the
  // first whose plan builds runs.
  for (const auto mode : {CUDNN_HEUR_MODE_INSTANT, CUDNN_HEUR_MODE_FALLBACK}) {
    for (const auto& config : engine_configs(graph, device->second, mode)) {
      if (aten_filters_out(config, convolution)) continue;
      if (const auto bytes = plan_workspace(config, device->second)) {
        cache.emplace(key, *bytes);
        return *bytes;
      }
    }
  }
  throw Error("cuDNN has no plan for the convolution " + describe(convolution) +
              " (PyTorch would fail with \"GET was unable to find an engine to execute this computation\")");
}

std::string cudnn_library_description() {
  const auto& l = cudnn();
  if (!l.failure.empty()) return l.failure;
  return l.path + " (cuDNN " + std::to_string(l.get_version()) + ")";
}

#else  // memgate was built without cuDNN's headers

std::int64_t cudnn_workspace_bytes(const CudnnConvolution&, const std::string&) {
  throw Error("memgate was built without cuDNN's headers (cudnn_graph.h, in the torch wheel's nvidia/cudnn/include), "
              "so its estimates for CUDA cannot size cuDNN's convolution workspaces: rebuild it against torch's CUDA "
              "wheel");
}

std::string cudnn_library_description() { return "memgate was built without cuDNN's headers"; }

#endif

namespace detail {
std::string_view builtin_h200_fixture();  // builtin_h200.cpp, generated from fixtures/gpus/h200_141gb.yaml
}  // namespace detail

std::string estimated_cudnn_device_json() {
  if (const auto& context = estimate_context(); !context.cudnn_device_json.empty()) return context.cudnn_device_json;
  // A user's override for every estimate of the process (docs/design.md): another GPU's properties than the H200's.
  if (const char* json = std::getenv("MEMGATE_ESTIMATE_GPU_CUDNN"); json != nullptr && *json != '\0') {
    // Checked before cuDNN reads it (its own error names no variable and no key), once per value.
    static std::mutex mutex;
    static std::string checked;
    const std::lock_guard<std::mutex> lock(mutex);
    if (checked != json) checked = checked_cudnn_device_json(json, "MEMGATE_ESTIMATE_GPU_CUDNN");
    return checked;
  }
  static const std::string h200 = [] {
    const auto gpu = gpu_from_text(std::string(detail::builtin_h200_fixture()), "h200_141gb.yaml (built in)");
    if (gpu.cudnn_device_json.empty()) throw Error("h200_141gb.yaml (built in) has no cudnn_device");
    return gpu.cudnn_device_json;
  }();
  return h200;
}

}  // namespace memgate
