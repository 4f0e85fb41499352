// build_model's dispatch by architecture, trainable-parameter selection and parameter accounting.
#include "memgate/model.h"

#include "memgate/error.h"
#include "models.h"

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

std::unique_ptr<Model> build_model(const ModelSpec& spec, torch::Device device, std::uint64_t seed) {
  torch::manual_seed(seed);
  nn::ParamOptions param{device, torch::kFloat32};
  if (const auto* vit = std::get_if<VitSpec>(&spec.spec)) return make_vit_model(*vit, param);
  if (const auto* resnet = std::get_if<ResNetSpec>(&spec.spec)) return make_resnet_model(*resnet, param);
  if (const auto* unet = std::get_if<UNetSpec>(&spec.spec)) return make_unet_model(*unet, param);
  if (const auto* gpt = std::get_if<GptSpec>(&spec.spec)) return make_gpt_model(*gpt, param);
  if (const auto* segnet = std::get_if<SegNetSpec>(&spec.spec)) return make_segnet_model(*segnet, param);
  if (const auto* mm = std::get_if<MultimodalSpec>(&spec.spec)) return make_multimodal_model(*mm, param);
  throw Error("model.arch: '" + spec.arch + "' is not built by this version of memgate");
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
