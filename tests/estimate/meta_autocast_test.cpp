// Autocast on the Meta device: the same ops autocast as torch's own kernels on the target device, each to the dtype
// those kernels give, and an fp32 weight is cast once per autocast region.
#include "memgate/backend/meta_allocator.h"
#include "memgate/estimate/estimate_context.h"
#include "memgate/estimate/meta_kernels.h"
#include "memgate/models/autocast.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <iterator>
#include <set>
#include <string>
#include <vector>

namespace memgate {
namespace {

// The ops torch autocasts on a device: those with a kernel of their own at its autocast key.
std::set<std::string> ops_with_kernel_at(c10::DispatchKey key) {
  std::set<std::string> out;
  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    const auto op = c10::Dispatcher::singleton().findOp(name);
    if (op && op->hasKernelForDispatchKey(key)) {
      out.insert(name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name));
    }
  }
  return out;
}

std::set<std::string> existing(const std::vector<std::string>& ops) {
  std::set<std::string> out;
  for (const auto& op : ops) {
    const auto dot = op.find('.');
    const auto name = "aten::" + op.substr(0, dot);
    const auto overload = dot == std::string::npos ? "" : op.substr(dot + 1);
    if (c10::Dispatcher::singleton().findOp({name, overload})) out.insert(op);
  }
  return out;
}

std::vector<std::string> minus(const std::set<std::string>& a, const std::set<std::string>& b) {
  std::vector<std::string> out;
  std::ranges::set_difference(a, b, std::back_inserter(out));
  return out;
}

TEST(MetaAutocastTest, AutocastsTheOpsTorchAutocastsOnTheTarget) {
  for (const auto& [target, key] : {std::pair{EstimateTarget::kCpu, c10::DispatchKey::AutocastCPU},
                                    std::pair{EstimateTarget::kCuda, c10::DispatchKey::AutocastCUDA}}) {
    const auto ours = existing(meta_autocast_ops(target));
    const auto torchs = ops_with_kernel_at(key);
    EXPECT_THAT(minus(torchs, ours), ::testing::IsEmpty()) << "autocast by torch, not on Meta, at " << key;
    EXPECT_THAT(minus(ours, torchs), ::testing::IsEmpty()) << "autocast on Meta, not by torch, at " << key;
  }
}

struct OpCase {
  const char* name;
  std::function<torch::Tensor(const torch::TensorOptions&)> run;
};

// Each op's output dtype under the CPU's own autocast (on CPU tensors) and under the Meta autocast for the CPU.
TEST(MetaAutocastTest, GivesTheDtypesOfTheCpusAutocast) {
  register_meta_kernels();  // for the CPU: no estimate context is set
  const std::vector<OpCase> cases = {
      {"linear", [](const auto& o) { return torch::linear(torch::ones({2, 8}, o), torch::ones({4, 8}, o)); }},
      {"conv2d", [](const auto& o) { return torch::conv2d(torch::ones({1, 3, 8, 8}, o), torch::ones({4, 3, 3, 3}, o)); }},
      {"matmul", [](const auto& o) { return torch::matmul(torch::ones({2, 8}, o), torch::ones({8, 3}, o)); }},
      {"mse_loss", [](const auto& o) {
         return torch::mse_loss(torch::ones({4}, o).to(torch::kBFloat16), torch::ones({4}, o));
       }},
      {"softmax of bf16", [](const auto& o) { return torch::softmax(torch::ones({4}, o).to(torch::kBFloat16), 0); }},
      {"cat of mixed", [](const auto& o) {
         return torch::cat({torch::ones({2}, o), torch::ones({2}, o).to(torch::kBFloat16)});
       }},
      {"relu (not autocast)", [](const auto& o) { return torch::relu(torch::ones({4}, o)); }},
  };
  for (const auto precision : {Precision::kBf16, Precision::kFp16}) {
    for (const auto& c : cases) {
      torch::Dtype on_cpu, on_meta;
      {
        const AutocastScope scope(torch::kCPU, precision);
        on_cpu = c.run(torch::TensorOptions().device(torch::kCPU)).scalar_type();
      }
      {
        const AutocastScope scope(torch::kMeta, precision);
        on_meta = c.run(torch::TensorOptions().device(torch::kMeta)).scalar_type();
      }
      EXPECT_EQ(on_meta, on_cpu) << c.name << " in " << name_of(kPrecisionNames, precision);
    }
  }
  // Outside a scope nothing is cast.
  EXPECT_EQ(torch::linear(torch::ones({2, 8}, torch::kMeta), torch::ones({4, 8}, torch::kMeta)).scalar_type(),
            torch::kFloat32);
}

TEST(MetaAutocastTest, CastsAWeightOncePerRegionAndDropsItAtTheEnd) {
  register_meta_autocast();
  const EstimateContextGuard for_cuda({.target = EstimateTarget::kCuda});
  auto& meta = CountingMetaAllocator::install();
  meta.set_granularity(0);
  const auto weight = torch::ones({64, 64}, torch::kMeta).requires_grad_(true);
  const auto x = torch::ones({2, 64}, torch::kMeta);
  const auto before = meta.current_bytes();
  std::int64_t inside = 0;
  {
    const AutocastScope scope(torch::kMeta, Precision::kFp16);
    torch::NoGradGuard no_grad;  // nothing saved for backward: what stays is the cache's
    (void)torch::linear(x, weight);
    const auto once = meta.current_bytes() - before;
    (void)torch::linear(x, weight);
    inside = meta.current_bytes() - before;
    EXPECT_EQ(inside, once) << "the second linear reuses the cached fp16 weight";
    EXPECT_EQ(inside, 64 * 64 * 2) << "the fp16 copy of the weight";
  }
  EXPECT_EQ(meta.current_bytes(), before) << "the cache is dropped when the region ends";
}

}  // namespace
}  // namespace memgate
