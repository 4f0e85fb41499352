// A Vision Transformer with a class token, parameter for parameter timm's VisionTransformer, with optional LoRA.
#pragma once

#include "memgate/models/checkpoint.h"

#include "memgate/base/enum_names.h"
#include "memgate/models/nn.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

namespace memgate {

/// A Vision Transformer with a class token, with timm's VisionTransformer parameters.
struct VitOptions {
  /// How attention is computed.
  enum class Attention {
    kSdpa,  ///< at::scaled_dot_product_attention, as timm and PyTorch's own layers
    kMath,  ///< unfused softmax(QK^T)V, as older code
  };
  std::int64_t img_size = 224;     ///< input height and width
  std::int64_t patch_size = 16;    ///< patch height and width
  std::int64_t in_chans = 3;       ///< input channels
  std::int64_t embed_dim = 768;    ///< width
  std::int64_t depth = 12;         ///< number of blocks
  std::int64_t num_heads = 12;     ///< attention heads; must divide embed_dim
  double mlp_ratio = 4.0;          ///< MLP hidden width / embed_dim
  std::int64_t num_classes = 1000; ///< head outputs; 0 for no head
  bool qkv_bias = true;            ///< bias on the fused qkv projection
  Attention attention = Attention::kSdpa;  ///< sdpa | math
  /// Dropout after each block's attention projection (timm's Attention `proj_drop`), in training only; 0: none.
  /// In training it keeps one mask per block for backward.
  double proj_drop = 0.0;
  LoraOptions lora;                ///< optional adapters
};

/// The words of VitOptions::Attention.
inline constexpr EnumNames<VitOptions::Attention, 2> kAttentionNames{
    {{VitOptions::Attention::kSdpa, "sdpa"}, {VitOptions::Attention::kMath, "math"}}};

/// Multi-head self-attention with a fused qkv projection (timm's Attention).
class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(std::int64_t dim, std::int64_t heads, bool qkv_bias, bool fused, nn::ParamOptions param,
                bool causal = false);
  torch::Tensor forward(const torch::Tensor& x);

  nn::Linear qkv{nullptr}, proj{nullptr};
  std::int64_t heads;
  bool fused;
  bool causal;
};
TORCH_MODULE(Attention);

/// A pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x)) with a GELU MLP.
class VitBlockImpl : public torch::nn::Module {
 public:
  VitBlockImpl(const VitOptions& spec, nn::ParamOptions param);
  torch::Tensor forward(const torch::Tensor& x);

  nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  Attention attn{nullptr};
  nn::Linear fc1{nullptr}, fc2{nullptr};
  double proj_drop = 0.0;

 private:
  torch::Tensor attention_branch(const torch::Tensor& x);
};
TORCH_MODULE(VitBlock);

/// patch_embed (conv) -> [cls] + pos_embed -> blocks -> norm -> head(cls token).
/// Parameter names follow timm: patch_embed.proj, cls_token, pos_embed, blocks.N.attn.qkv, ..., norm, head.
class VisionTransformerImpl : public torch::nn::Module {
 public:
  VisionTransformerImpl(const VitOptions& spec, nn::ParamOptions param);
  /// Token features after the final norm, [B, 1 + patches, D].
  torch::Tensor forward_features(const torch::Tensor& images, const CheckpointSelection& checkpoint_blocks = {});
  /// Class logits [B, num_classes].
  torch::Tensor forward(const torch::Tensor& images, const CheckpointSelection& checkpoint_blocks = {});

  VitOptions spec;
  nn::Conv2d patch_embed{nullptr};
  torch::Tensor cls_token, pos_embed;
  torch::nn::ModuleList blocks;
  nn::LayerNorm norm{nullptr};
  nn::Linear head{nullptr};
};
TORCH_MODULE(VisionTransformer);

}  // namespace memgate
