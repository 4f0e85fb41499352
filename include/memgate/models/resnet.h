// torchvision's ResNet (BasicBlock 18/34, Bottleneck 50/101/152), parameter for parameter, with its tasks.
#pragma once

#include "memgate/models/checkpoint.h"

#include "memgate/base/enum_names.h"
#include "memgate/models/nn.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include <string>
#include <vector>

namespace memgate {

/// torchvision's ResNet (18, 34, 50, 101, 152), as a classifier or a few-shot (prototypical) learner.
struct ResNetOptions {
  /// What the network is trained for.
  enum class Task {
    kClassify,  ///< cross-entropy over num_classes
    kProtonet,  ///< few-shot episodes (prototypical networks); batch size = episodes per step
  };
  std::int64_t depth = 50;         ///< 18 | 34 | 50 | 101 | 152
  std::int64_t img_size = 224;     ///< input height and width
  std::int64_t in_chans = 3;       ///< input channels
  std::int64_t width = 64;         ///< channels of the stem and the first stage, doubled per stage (torchvision: 64)
  std::int64_t num_classes = 1000; ///< classifier outputs (classify task)
  Task task = Task::kClassify;     ///< classify | protonet
  std::int64_t ways = 5;           ///< protonet: classes per episode
  std::int64_t shots = 5;          ///< protonet: support images per class
  std::int64_t queries = 16;       ///< protonet: query images per class
};

/// The words of ResNetOptions::Task.
inline constexpr EnumNames<ResNetOptions::Task, 2> kResNetTaskNames{
    {{ResNetOptions::Task::kClassify, "classify"}, {ResNetOptions::Task::kProtonet, "protonet"}}};

/// A residual block: BasicBlock (two 3x3 convs) or Bottleneck (1x1, 3x3, 1x1 with expansion 4), with the
/// optional `downsample` (1x1 conv + BN as `downsample.0`, `downsample.1`) on the shortcut.
class ResNetBlockImpl : public torch::nn::Module {
 public:
  ResNetBlockImpl(std::int64_t inplanes, std::int64_t planes, std::int64_t stride, bool bottleneck,
                  nn::ParamOptions param);
  torch::Tensor forward(const torch::Tensor& x);

  bool bottleneck;
  nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr}, downsample_conv{nullptr};
  nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, bn3{nullptr}, downsample_bn{nullptr};
};
TORCH_MODULE(ResNetBlock);

/// conv1 (7x7 s2) -> bn1 -> relu -> maxpool -> layer1..layer4 -> global average pool -> fc.
/// Parameter names follow torchvision: conv1, bn1, layer1.0.conv1, layer2.0.downsample.0, ..., fc.
/// Without a head (`with_fc` false, the protonet task) `forward` returns the pooled features.
class ResNetImpl : public torch::nn::Module {
 public:
  ResNetImpl(const ResNetOptions& spec, bool with_fc, nn::ParamOptions param);
  /// Pooled features [B, 512 x expansion].
  torch::Tensor forward_features(const torch::Tensor& images, const CheckpointSelection& checkpoint_blocks = {});
  /// Class logits [B, num_classes], or the pooled features without a head.
  torch::Tensor forward(const torch::Tensor& images, const CheckpointSelection& checkpoint_blocks = {});
  /// Name prefixes of the residual blocks, input to output ("layer1.0.", "layer1.1.", ...).
  [[nodiscard]] std::vector<std::string> block_prefixes() const;

  ResNetOptions spec;
  nn::Conv2d conv1{nullptr};
  nn::BatchNorm2d bn1{nullptr};
  std::vector<torch::nn::ModuleList> layers;
  nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet);

/// Blocks per stage of torchvision's resnet`depth` (18, 34, 50, 101, 152).
[[nodiscard]] std::vector<std::int64_t> resnet_stage_blocks(std::int64_t depth);

}  // namespace memgate
