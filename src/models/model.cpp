// Trainable-parameter selection and parameter accounting.
#include "memgate/models/model.h"

#include "memgate/base/error.h"
#include "factories.h"

#include <torch/torch.h>

namespace memgate {
namespace {

bool starts_with_any(const std::string& name, const std::vector<std::string>& prefixes) {
  for (const auto& p : prefixes) {
    if (name.rfind(p, 0) == 0) return true;
  }
  return false;
}

}  // namespace

std::string TrainableSpec::str() const {
  switch (kind) {
    case Kind::kAll: return "all";
    case Kind::kLora: return "lora";
    case Kind::kHead: return "head";
    case Kind::kLastBlocks: return "last_blocks:" + std::to_string(last_blocks);
  }
  return "all";
}

std::vector<torch::Tensor> select_trainable(Model& model, const TrainableSpec& trainable) {
  using Kind = TrainableSpec::Kind;
  const auto heads = model.head_prefixes();
  auto blocks = model.block_prefixes();
  if (trainable.kind == Kind::kLastBlocks) {
    if (trainable.last_blocks > static_cast<std::int64_t>(blocks.size())) {
      throw Error("training.trainable: last_blocks:" + std::to_string(trainable.last_blocks) +
                  " asks for more blocks than the model has (" + std::to_string(blocks.size()) + ")");
    }
    blocks.erase(blocks.begin(), blocks.end() - trainable.last_blocks);
  }
  std::vector<torch::Tensor> out;
  for (auto& item : model.module().named_parameters(/*recurse=*/true)) {
    const auto& name = item.key();
    bool train = false;
    switch (trainable.kind) {
      case Kind::kAll: train = true; break;
      case Kind::kHead: train = starts_with_any(name, heads); break;
      case Kind::kLora:
        train = starts_with_any(name, heads) || name.find("lora_") != std::string::npos;
        break;
      case Kind::kLastBlocks: train = starts_with_any(name, heads) || starts_with_any(name, blocks); break;
    }
    item.value().set_requires_grad(train);
    if (train) out.push_back(item.value());
  }
  return out;
}

Batch dense_mask_batch(std::int64_t batch_size, std::int64_t in_chans, std::int64_t classes, std::int64_t size,
                       torch::Device device) {
  const auto opts = torch::TensorOptions().device(device);
  auto images = torch::randn({batch_size, in_chans, size, size}, opts);
  auto mask = torch::randint(2, {batch_size, classes, size, size}, opts);
  return {{images}, mask};
}

ParamCounts count_parameters(const torch::nn::Module& module) {
  ParamCounts counts;
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    counts.total += p.numel();
    (p.requires_grad() ? counts.trainable : counts.frozen) += p.numel();
  }
  return counts;
}

std::int64_t parameter_and_buffer_bytes(const torch::nn::Module& module) {
  std::int64_t bytes = 0;
  for (const auto& p : module.parameters(/*recurse=*/true)) bytes += p.numel() * p.element_size();
  for (const auto& b : module.buffers(/*recurse=*/true)) bytes += b.numel() * b.element_size();
  return bytes;
}

}  // namespace memgate
