// A conv encoder-decoder for segmentation: a ConvNeXt/EdgeNeXt-style backbone and a feature-pyramid decoder
// with optional deep supervision and a dense mixture of expert heads.
#pragma once

#include "memgate/models/checkpoint.h"

#include "memgate/models/nn.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include <string>
#include <vector>

namespace memgate {

/// A conv encoder-decoder for segmentation: ConvNeXt-style stages, feature-pyramid decoder.
struct SegNetOptions {
  std::int64_t img_size = 384;                    ///< input height and width
  std::int64_t in_chans = 3;                      ///< input channels
  std::int64_t num_classes = 1;                   ///< mask channels
  std::vector<std::int64_t> dims{48, 96, 160, 304};  ///< channels of each stage
  std::vector<std::int64_t> depths{3, 3, 9, 3};      ///< blocks of each stage
  std::int64_t decoder_dim = 128;                 ///< feature-pyramid width
  bool deep_supervision = false;                  ///< a mask head on every pyramid level, each in the loss
  std::int64_t num_experts = 0;                   ///< >0: a gated mixture of expert decoders
};

/// ConvNeXt block: dwconv 7x7 -> NHWC -> LayerNorm -> pwconv1 (4x) -> GELU -> pwconv2 -> x gamma -> residual.
class ConvNeXtBlockImpl : public torch::nn::Module {
 public:
  ConvNeXtBlockImpl(std::int64_t dim, nn::ParamOptions param);
  torch::Tensor forward(const torch::Tensor& x);

  nn::Conv2d dwconv{nullptr};
  nn::LayerNorm norm{nullptr};
  nn::Linear pwconv1{nullptr}, pwconv2{nullptr};
  torch::Tensor gamma;
};
TORCH_MODULE(ConvNeXtBlock);

/// One backbone stage: `downsample` (LayerNorm2d + 2x2 stride-2 conv; absent in stage 0) then `blocks`.
class SegNetStageImpl : public torch::nn::Module {
 public:
  SegNetStageImpl(std::int64_t in_dim, std::int64_t dim, std::int64_t depth, bool downsample, nn::ParamOptions param);

  nn::LayerNorm down_norm{nullptr};
  nn::Conv2d down_conv{nullptr};
  torch::nn::ModuleList blocks;
};
TORCH_MODULE(SegNetStage);

/// A fuse conv (1x1 over the concatenated pyramid, + ReLU) and a 1x1 mask head: the decoder's output path, or
/// one expert of the mixture.
class SegNetFuseHeadImpl : public torch::nn::Module {
 public:
  SegNetFuseHeadImpl(std::int64_t in, std::int64_t dim, std::int64_t classes, nn::ParamOptions param);
  /// Mask logits at stride 4 of the concatenated pyramid features.
  torch::Tensor forward(const torch::Tensor& x);

  nn::Conv2d fuse{nullptr}, head{nullptr};
};
TORCH_MODULE(SegNetFuseHead);

/// The feature-pyramid decoder: `lateral.i` (1x1 to decoder_dim), top-down nearest up-sampling and sum,
/// `smooth.i` (3x3), then all levels up-sampled to stride 4, concatenated and fused into mask logits, by one
/// `output` head or by `experts.e` mixed with `gate` (softmax over a linear layer on the pooled deepest feature).
/// With deep supervision, `aux_heads.i` predict a mask from each pyramid level.
class SegNetDecoderImpl : public torch::nn::Module {
 public:
  SegNetDecoderImpl(const SegNetOptions& spec, nn::ParamOptions param);
  /// Mask logits at full size first, then (deep supervision) one per pyramid level, all [B, classes, H, W].
  std::vector<torch::Tensor> forward(const std::vector<torch::Tensor>& features, std::int64_t img_size);

  SegNetOptions spec;
  torch::nn::ModuleList lateral, smooth;
  torch::nn::ModuleList aux_heads{nullptr}, experts{nullptr};  ///< empty without deep supervision / experts
  SegNetFuseHead output{nullptr};
  nn::Linear gate{nullptr};
};
TORCH_MODULE(SegNetDecoder);

/// stem (4x4 stride-4 conv + LayerNorm2d) -> stages.0..S-1 -> decoder.
class SegNetImpl : public torch::nn::Module {
 public:
  SegNetImpl(const SegNetOptions& spec, nn::ParamOptions param);
  /// The output of each stage (strides 4, 8, 16, ...).
  std::vector<torch::Tensor> forward_features(const torch::Tensor& images,
                                              const CheckpointSelection& checkpoint_blocks = {});
  /// Mask logits (see SegNetDecoderImpl::forward).
  std::vector<torch::Tensor> forward(const torch::Tensor& images,
                                     const CheckpointSelection& checkpoint_blocks = {});
  /// Backbone prefixes, input to output: "stem.", then per stage its "stages.i.downsample." (i > 0, a block of
  /// its own, so last_blocks:N may unfreeze it) and "stages.i.blocks.j.".
  [[nodiscard]] std::vector<std::string> block_prefixes() const;

  SegNetOptions spec;
  nn::Conv2d stem_conv{nullptr};
  nn::LayerNorm stem_norm{nullptr};
  std::vector<SegNetStage> stages;
  SegNetDecoder decoder{nullptr};
};
TORCH_MODULE(SegNet);

}  // namespace memgate
