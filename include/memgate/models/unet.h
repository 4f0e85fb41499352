// A classic UNet (milesial/Pytorch-UNet): DoubleConv blocks, max-pool down, transposed-conv or bilinear up.
#pragma once

#include "memgate/models/checkpoint.h"

#include "memgate/models/nn.h"

#include <torch/nn/module.h>

#include <string>
#include <vector>

namespace memgate {

/// A UNet for dense segmentation masks.
struct UNetOptions {
  std::int64_t img_size = 1024;      ///< input height and width
  std::int64_t in_chans = 3;         ///< input channels
  std::int64_t num_classes = 1;      ///< mask channels
  std::int64_t base_channels = 64;   ///< channels of the first level, doubled at each level down
  std::int64_t levels = 4;           ///< down-sampling steps
  bool bilinear = false;             ///< bilinear up-sampling instead of transposed convolutions
};

/// (3x3 conv without bias -> BN -> ReLU) x 2, named double_conv.0, .1, .3, .4 as the reference's Sequential.
class DoubleConvImpl : public torch::nn::Module {
 public:
  DoubleConvImpl(std::int64_t in, std::int64_t out, std::int64_t mid, nn::ParamOptions param);
  torch::Tensor forward(const torch::Tensor& x);

  nn::Conv2d conv1{nullptr}, conv2{nullptr};
  nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
};
TORCH_MODULE(DoubleConv);

/// 2x2 max-pool then a DoubleConv (`maxpool_conv.1`).
class UNetDownImpl : public torch::nn::Module {
 public:
  UNetDownImpl(std::int64_t in, std::int64_t out, nn::ParamOptions param);
  torch::Tensor forward(const torch::Tensor& x);

  DoubleConv conv{nullptr};
};
TORCH_MODULE(UNetDown);

/// Up-sampling by 2 (`up`: a stride-2 transposed conv, or bilinear with no parameters), concatenation with the
/// skip connection, then a DoubleConv (`conv`).
class UNetUpImpl : public torch::nn::Module {
 public:
  UNetUpImpl(std::int64_t in, std::int64_t out, bool bilinear, nn::ParamOptions param);
  /// The up-sampled `x` concatenated after `skip`: the DoubleConv's input.
  torch::Tensor upsample_concat(const torch::Tensor& x, const torch::Tensor& skip);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& skip);

  bool bilinear;
  nn::Conv2d up{nullptr};
  DoubleConv conv{nullptr};
};
TORCH_MODULE(UNetUp);

/// inc -> down1..downL -> up1..upL (with skips) -> outc (1x1 conv to num_classes). Level i has
/// base_channels x 2^i channels; with `bilinear` the deepest level and the up path halve, as in the reference.
class UNetImpl : public torch::nn::Module {
 public:
  UNetImpl(const UNetOptions& spec, nn::ParamOptions param);
  /// Mask logits [B, num_classes, H, W]. Each DoubleConv `checkpoint_blocks` covers ("inc.",
  /// "down1.maxpool_conv.1.", "up1.conv.") is recomputed in backward.
  torch::Tensor forward(const torch::Tensor& images, const CheckpointSelection& checkpoint_blocks = {});

  UNetOptions spec;
  DoubleConv inc{nullptr};
  std::vector<UNetDown> downs;
  std::vector<UNetUp> ups;
  nn::Conv2d outc{nullptr};
};
TORCH_MODULE(UNet);

}  // namespace memgate
