// cuDNN's convolution workspaces without a GPU (cudnn_workspace.h): what cuDNN 9.19, given the H200's device
// properties from its GPU fixture, answers for ResNet-18's convolutions, and the estimate's Meta convolutions taking
// those workspaces for CUDA only.
#include "memgate/estimate/cudnn_workspace.h"

#include "memgate/backend/meta_allocator.h"
#include "memgate/base/error.h"
#include "memgate/estimate/estimate_context.h"
#include "memgate/estimate/meta_kernels.h"
#include "memgate/spec/gpus.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace memgate {
namespace {

std::vector<std::int64_t> nchw_strides(const std::vector<std::int64_t>& s) {
  return {s[1] * s[2] * s[3], s[2] * s[3], s[3], 1};
}

// A 2-D convolution of fp32 NCHW tensors with square kernels, as ATen describes it to cuDNN for `pass`.
CudnnConvolution resnet_convolution(ConvolutionPass pass, std::int64_t batch, std::int64_t in_channels,
                                    std::int64_t size, std::int64_t out_channels, std::int64_t kernel,
                                    std::int64_t stride, std::int64_t padding) {
  const auto out_size = (size + 2 * padding - kernel) / stride + 1;
  CudnnConvolution c;
  c.pass = pass;
  c.x_sizes = {batch, in_channels, size, size};
  c.w_sizes = {out_channels, in_channels, kernel, kernel};
  c.y_sizes = {batch, out_channels, out_size, out_size};
  c.x_strides = nchw_strides(c.x_sizes);
  c.w_strides = nchw_strides(c.w_sizes);
  c.y_strides = nchw_strides(c.y_sizes);
  c.stride = {stride, stride};
  c.padding = {padding, padding};
  c.dilation = {1, 1};
  return c;
}

std::string h200() {
  return load_gpu(testing::source_dir() + "/fixtures/gpus/h200_141gb.yaml").cudnn_device_json;
}

TEST(CudnnWorkspaceTest, TheGpuFixturesHoldCudnnsDeviceProperties) {
  for (const auto* id : {"h200_141gb", "h100_80gb"}) {
    const auto gpu = load_gpu(testing::source_dir() + "/fixtures/gpus/" + id + ".yaml");
    EXPECT_NE(gpu.cudnn_device_json.find("\"deviceVer\":900"), std::string::npos) << id;
    EXPECT_NE(gpu.cudnn_device_json.find("\"multiProcessorCount\":132"), std::string::npos) << id;
    EXPECT_NE(gpu.cudnn_device_json.find("\"maxGridSize\":[2147483647,65535,65535]"), std::string::npos) << id;
    EXPECT_FALSE(gpu.cudnn_device_sources.empty()) << id;
  }
  EXPECT_TRUE(load_gpu(testing::source_dir() + "/fixtures/gpus/t4_16gb.yaml").cudnn_device_json.empty());
}

// These are cuDNN's answers (cuDNN 9.19's heuristics and plans, device-less, for the H200's properties), not
// constants fitted to any measurement: the same values a stand-alone probe of the backend API printed for ResNet-18 at
// batch 8, 224 px, fp32 NCHW, with ATen's defaults (TF32 on, nondeterministic algorithms allowed).
TEST(CudnnWorkspaceTest, AnswersResNet18sConvolutionsOnAnH200) {
  const auto device = h200();
  ASSERT_FALSE(device.empty());
  std::cout << "[ CUDNN    ] " << cudnn_library_description() << "\n";
  // conv1, 7x7 stride 2, 3 -> 64: its forward and its weight's gradient (its input needs none).
  EXPECT_EQ(cudnn_workspace_bytes(resnet_convolution(ConvolutionPass::kForward, 8, 3, 224, 64, 7, 2, 3), device),
            30544656);
  EXPECT_EQ(cudnn_workspace_bytes(resnet_convolution(ConvolutionPass::kBackwardFilter, 8, 3, 224, 64, 7, 2, 3), device),
            34872464);
  // layer1's 3x3 64 -> 64 at 56 px: all three passes.
  EXPECT_EQ(cudnn_workspace_bytes(resnet_convolution(ConvolutionPass::kForward, 8, 64, 56, 64, 3, 1, 1), device),
            6570000);
  EXPECT_EQ(cudnn_workspace_bytes(resnet_convolution(ConvolutionPass::kBackwardData, 8, 64, 56, 64, 3, 1, 1), device),
            12992528);
  EXPECT_EQ(cudnn_workspace_bytes(resnet_convolution(ConvolutionPass::kBackwardFilter, 8, 64, 56, 64, 3, 1, 1), device),
            13287635);
  // layer2.0's 1x1 stride-2 downsampling runs without a workspace forward.
  EXPECT_EQ(cudnn_workspace_bytes(resnet_convolution(ConvolutionPass::kForward, 8, 64, 56, 128, 1, 2, 0), device), 0);
  // The H100's properties (its clocks, L2 and memory differ) give the same plans here.
  const auto h100 = load_gpu(testing::source_dir() + "/fixtures/gpus/h100_80gb.yaml").cudnn_device_json;
  EXPECT_EQ(cudnn_workspace_bytes(resnet_convolution(ConvolutionPass::kBackwardFilter, 8, 3, 224, 64, 7, 2, 3), h100),
            34872464);
  EXPECT_EQ(cudnn_workspace_bytes(resnet_convolution(ConvolutionPass::kBackwardData, 8, 64, 56, 64, 3, 1, 1), h100),
            12992528);
  // Cached: asked again, the same answer.
  EXPECT_EQ(cudnn_workspace_bytes(resnet_convolution(ConvolutionPass::kBackwardFilter, 8, 3, 224, 64, 7, 2, 3), device),
            34872464);
}

// The device properties an estimate gives cuDNN: MEMGATE_ESTIMATE_GPU_CUDNN's where set, else the H200 fixture's, built
// into memgate.
TEST(CudnnWorkspaceTest, AnEstimateSpeaksForAnH200UnlessToldOtherwise) {
  // Built in: the same wherever it runs (a team's repository has no fixtures/gpus of memgate's).
  const char* project = std::getenv("MEMGATE_PROJECT_DIR");
  const std::string project_before = project != nullptr ? project : "";
  const auto empty = std::filesystem::temp_directory_path() / "memgate_cudnn_no_fixtures";
  std::filesystem::create_directories(empty);
  ::setenv("MEMGATE_PROJECT_DIR", empty.c_str(), 1);
  EXPECT_EQ(estimated_cudnn_device_json(), h200());
  const auto h100 = load_gpu(testing::source_dir() + "/fixtures/gpus/h100_80gb.yaml").cudnn_device_json;
  ::setenv("MEMGATE_ESTIMATE_GPU_CUDNN", h100.c_str(), 1);
  EXPECT_EQ(estimated_cudnn_device_json(), h100);
  ::unsetenv("MEMGATE_ESTIMATE_GPU_CUDNN");
  if (project != nullptr) {
    ::setenv("MEMGATE_PROJECT_DIR", project_before.c_str(), 1);
  } else {
    ::unsetenv("MEMGATE_PROJECT_DIR");
  }
  std::filesystem::remove_all(empty);
}

// MEMGATE_ESTIMATE_GPU_CUDNN is checked before cuDNN reads it (cuDNN says only "CUDNN_STATUS_BAD_PARAM:
// !json_object.IsObject()"): a value that is not JSON, a path, a JSON other than an object, an object without one of
// the 23 keys or with one of another type is an error naming the variable, what it expects and the key.
TEST(CudnnWorkspaceTest, ABadMemgateEstimateGpuCudnnNamesTheVariableAndTheKey) {
  const auto h200_json = nlohmann::json::parse(h200());
  const auto without = [&](const char* key) {
    auto j = h200_json;
    j.erase(key);
    return j.dump();
  };
  const auto with = [&](const char* key, nlohmann::json value) {
    auto j = h200_json;
    j[key] = std::move(value);
    return j.dump();
  };
  const auto fixture = testing::source_dir() + "/fixtures/gpus/h200_141gb.yaml";
  struct Case {
    std::string value;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases{
      {"h200", {"its value is not JSON ('h200':"}},
      {fixture, {"its value is not JSON", "it names a file: give its JSON text instead",
                 "MEMGATE_ESTIMATE_GPU_CUDNN=\"$(cat " + fixture + ")\""}},
      {"{\"deviceVer\": 900", {"its value is not JSON"}},
      {"[900, 132]", {"its value is array ('[900, 132]'), not an object"}},
      {"{}", {"key \"deviceVer\" is missing"}},
      {without("warpSize"), {"key \"warpSize\" is missing"}},
      {without("deviceName"), {"key \"deviceName\" is missing"}},
      {with("multiProcessorCount", "132"), {"key \"multiProcessorCount\" is \"132\", expected a non-negative integer"}},
      {with("l2CacheSize", -1), {"key \"l2CacheSize\" is -1, expected a non-negative integer"}},
      {with("maxGridSize", {65535, 65535}), {"key \"maxGridSize\" is [65535,65535], expected a list of 3 positive"}},
      {with("deviceName", 200), {"key \"deviceName\" is 200, expected a string"}},
  };
  for (const auto& c : cases) {
    ::setenv("MEMGATE_ESTIMATE_GPU_CUDNN", c.value.c_str(), 1);
    try {
      (void)estimated_cudnn_device_json();
      ADD_FAILURE() << c.value << ": accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("MEMGATE_ESTIMATE_GPU_CUDNN: expected the JSON object of cuDNN's device properties", 0), 0)
          << what;
      EXPECT_NE(what.find("23 keys: deviceVer, multiProcessorCount,"), std::string::npos) << what;
      for (const auto& s : c.says) EXPECT_NE(what.find(s), std::string::npos) << "'" << s << "' not in: " << what;
    }
  }
  // Extra keys are cuDNN's to judge; the order of the keys is free.
  ::setenv("MEMGATE_ESTIMATE_GPU_CUDNN", with("note", "mine").c_str(), 1);
  EXPECT_EQ(estimated_cudnn_device_json(), with("note", "mine"));
  ::unsetenv("MEMGATE_ESTIMATE_GPU_CUDNN");
}

// Malformed device properties are cuDNN's error, named.
TEST(CudnnWorkspaceTest, DevicePropertiesCudnnRejectsAreAnError) {
  try {
    (void)cudnn_workspace_bytes(resnet_convolution(ConvolutionPass::kForward, 1, 3, 32, 8, 3, 1, 1), "{}");
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("device properties"), std::string::npos) << e.what();
  }
}

// The estimate's Meta convolution takes the forward's workspace after its output and frees it before it returns, for
// CUDA: conv1 at batch 8 (fp32, channels first) peaks 30,544,656 bytes above its output. The CPU's portable kernel
// (Slow2d) takes its im2col columns instead, and no cuDNN workspace: 8 images x 3 x 7 x 7 x 112 x 112 fp32.
TEST(CudnnWorkspaceTest, MetaConvolutionsTakeTheWorkspaceForCudaOnly) {
  auto& meta = CountingMetaAllocator::install();
  meta.set_granularity(0);
  meta.model_caching_allocator(false);
  const auto options = torch::TensorOptions().device(torch::kMeta);
  const auto input = torch::empty({8, 3, 224, 224}, options);
  const auto weight = torch::empty({64, 3, 7, 7}, options);
  const std::int64_t output_bytes = 8LL * 64 * 112 * 112 * 4;
  const auto above_output = [&] {
    const auto before = meta.current_bytes();
    meta.reset_peak();
    const auto out = at::convolution(input, weight, std::nullopt, {2, 2}, {3, 3}, {1, 1}, false, {0, 0}, 1);
    EXPECT_EQ(out.sizes(), (std::vector<std::int64_t>{8, 64, 112, 112}));
    EXPECT_EQ(meta.current_bytes() - before, output_bytes) << "the output alone stays";
    return meta.peak_bytes() - before - output_bytes;
  };
  register_meta_kernels();
  {
    const EstimateContextGuard for_cuda({.target = EstimateTarget::kCuda});
    EXPECT_EQ(above_output(), 30544656);
  }
  EXPECT_EQ(above_output(), 8LL * 3 * 7 * 7 * 112 * 112 * 4) << "the CPU's, where no context is set";
}

// What an estimate is for belongs to the thread that set it (EstimateContextGuard), as PyTorch's modes do: while one
// thread estimates for CUDA, another's convolution takes the CPU's columns; after the guard, this thread's does too.
TEST(CudnnWorkspaceTest, TheTargetIsTheThreadsOwn) {
  auto& meta = CountingMetaAllocator::install();
  meta.set_granularity(0);
  meta.model_caching_allocator(false);
  register_meta_kernels();
  const auto cpu_columns = [&] {
    // The CPU's Slow2d takes its im2col columns above the output: 1 image x 3 x 7 x 7 x 112 x 112 fp32 (conv1 of a
    // ResNet, as above); for CUDA, cuDNN's workspace instead.
    const auto input = torch::empty({1, 3, 224, 224}, torch::kMeta);
    const auto weight = torch::empty({64, 3, 7, 7}, torch::kMeta);
    const auto before = meta.current_bytes();
    meta.reset_peak();
    const auto out = at::convolution(input, weight, std::nullopt, {2, 2}, {3, 3}, {1, 1}, false, {0, 0}, 1);
    return meta.peak_bytes() - before - static_cast<std::int64_t>(out.nbytes());
  };
  const std::int64_t columns = 1LL * 3 * 7 * 7 * 112 * 112 * 4;
  EXPECT_EQ(cpu_columns(), columns);
  {
    const EstimateContextGuard for_cuda({.target = EstimateTarget::kCuda});
    EXPECT_NE(cpu_columns(), columns) << "for CUDA: cuDNN's workspace, not the CPU's columns";
    std::int64_t other_thread = -1;
    std::thread([&] { other_thread = cpu_columns(); }).join();
    EXPECT_EQ(other_thread, columns) << "another thread estimates for the CPU";
    EXPECT_EQ(estimate_context().target, EstimateTarget::kCuda);
  }
  EXPECT_EQ(cpu_columns(), columns);
  EXPECT_EQ(estimate_context(), EstimateContext{});
}

}  // namespace
}  // namespace memgate
