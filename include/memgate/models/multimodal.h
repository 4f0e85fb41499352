// A LISA-style reasoning-segmentation model: a frozen decoder LLM and a frozen ViT image encoder (in a low
// precision dtype) feeding a trainable SAM-like fp32 mask decoder.
#pragma once

#include "memgate/models/checkpoint.h"

#include "memgate/models/autocast.h"
#include "memgate/models/gpt.h"
#include "memgate/models/nn.h"
#include "memgate/models/vit.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include <string>
#include <utility>
#include <vector>

namespace memgate {

/// A frozen decoder LLM + a ViT image encoder + a trainable mask decoder (LISA-style).
struct MultimodalOptions {
  GptOptions llm;                  ///< the language model (frozen in frozen_dtype)
  VitOptions vision;               ///< the image encoder (frozen in frozen_dtype); num_classes is 0
  std::int64_t text_len = 64;      ///< prompt tokens per sample
  std::int64_t decoder_dim = 256;  ///< mask decoder width
  std::int64_t decoder_depth = 2;  ///< mask decoder two-way blocks
  std::int64_t decoder_heads = 8;  ///< mask decoder heads
  Precision frozen_dtype = Precision::kBf16;  ///< fp32 | fp16 | bf16: dtype of the frozen LLM and encoder
};

/// Multi-head attention with separate q/k/v/out projections (SAM's Attention), through fused SDPA.
class MaskAttentionImpl : public torch::nn::Module {
 public:
  MaskAttentionImpl(std::int64_t dim, std::int64_t heads, nn::ParamOptions param);
  torch::Tensor forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v);

  std::int64_t heads;
  nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};
};
TORCH_MODULE(MaskAttention);

/// SAM's two-way block: token self-attention, token -> image cross-attention, MLP (8x) on the tokens,
/// image -> token cross-attention; a post-norm LayerNorm after each.
class TwoWayBlockImpl : public torch::nn::Module {
 public:
  TwoWayBlockImpl(std::int64_t dim, std::int64_t heads, nn::ParamOptions param);
  /// Updated (tokens [B, T, D], image [B, N, D]).
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& tokens, const torch::Tensor& image);

  MaskAttention self_attn{nullptr}, cross_attn_token_to_image{nullptr}, cross_attn_image_to_token{nullptr};
  nn::LayerNorm norm1{nullptr}, norm2{nullptr}, norm3{nullptr}, norm4{nullptr};
  nn::Linear mlp_lin1{nullptr}, mlp_lin2{nullptr};
};
TORCH_MODULE(TwoWayBlock);

/// image_proj (vision width -> D) and text_proj (LLM width -> D, the [SEG] prompt) -> two-way `layers` ->
/// the image tokens up-sampled 4x by two stride-2 transposed convs (D -> D/4 -> D/8) -> dot product with
/// token_proj(prompt) -> mask logits [B, 1, 4 grid, 4 grid].
class MaskDecoderImpl : public torch::nn::Module {
 public:
  MaskDecoderImpl(std::int64_t vision_dim, std::int64_t text_dim, std::int64_t dim, std::int64_t depth,
                  std::int64_t heads, nn::ParamOptions param);
  /// Mask logits of image tokens [B, grid x grid, vision_dim] and prompt states [B, text_dim] (fp32).
  torch::Tensor forward(const torch::Tensor& image_tokens, const torch::Tensor& prompt, std::int64_t grid);

  nn::Linear image_proj{nullptr}, text_proj{nullptr}, token_proj{nullptr};
  torch::nn::ModuleList layers;
  nn::Conv2d upscale1{nullptr}, upscale2{nullptr};
  nn::LayerNorm upscale_norm{nullptr};
};
TORCH_MODULE(MaskDecoder);

/// `llm` (GptImpl) and `vision` (VisionTransformerImpl, headless) in `frozen` dtype, `mask_decoder` in fp32.
class MultimodalImpl : public torch::nn::Module {
 public:
  MultimodalImpl(const MultimodalOptions& spec, nn::ParamOptions frozen, nn::ParamOptions trainable);
  /// Mask logits [B, 1, 4 grid, 4 grid] of images [B, C, H, W] (any float dtype) and tokens [B, text_len].
  /// The LLM and the encoder run without autograd when none of their parameters requires grad.
  torch::Tensor forward(const torch::Tensor& images, const torch::Tensor& tokens,
                        const CheckpointSelection& checkpoint_blocks = {});

  MultimodalOptions spec;
  torch::Dtype frozen_dtype;
  Gpt llm{nullptr};
  VisionTransformer vision{nullptr};
  MaskDecoder mask_decoder{nullptr};
};
TORCH_MODULE(Multimodal);

}  // namespace memgate
