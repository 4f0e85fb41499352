// A GPT-style decoder language model: GPT-2's geometry and names, or LLaMA-like (SwiGLU, RMSNorm, no bias).
#pragma once

#include "memgate/models/checkpoint.h"

#include "memgate/base/enum_names.h"
#include "memgate/models/nn.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include <string>
#include <vector>

namespace memgate {

/// A GPT-style decoder language model (GPT-2 geometry by default; LLaMA-like with swiglu/rmsnorm).
struct GptOptions {
  /// The MLP of each block.
  enum class Mlp { kGelu, kSwiglu };
  /// The normalisation layers.
  enum class Norm { kLayerNorm, kRmsNorm };
  /// Where token positions come from.
  enum class Position {
    kLearned,  ///< a learned position table (GPT-2)
    kNone,     ///< none kept as parameters (rotary-style models)
  };
  std::int64_t vocab_size = 50257;  ///< token vocabulary
  std::int64_t seq_len = 1024;      ///< tokens per sequence (and learned positions)
  std::int64_t n_layer = 12;        ///< blocks
  std::int64_t n_embd = 768;        ///< width
  std::int64_t n_head = 12;         ///< heads; must divide n_embd
  std::int64_t mlp_hidden = 0;      ///< MLP hidden width; 0: 4 x n_embd
  Mlp mlp = Mlp::kGelu;             ///< gelu | swiglu
  Norm norm = Norm::kLayerNorm;     ///< layernorm | rmsnorm
  Position position = Position::kLearned;  ///< learned | none
  bool bias = true;                 ///< biases on linear layers
  bool tied_embeddings = true;      ///< the LM head shares the token embedding
  LoraOptions lora;                 ///< optional adapters (targets: qkv, proj, fc1, fc2)
};

/// The words of GptOptions' enumerations.
inline constexpr EnumNames<GptOptions::Mlp, 2> kGptMlpNames{
    {{GptOptions::Mlp::kGelu, "gelu"}, {GptOptions::Mlp::kSwiglu, "swiglu"}}};
inline constexpr EnumNames<GptOptions::Norm, 2> kGptNormNames{
    {{GptOptions::Norm::kLayerNorm, "layernorm"}, {GptOptions::Norm::kRmsNorm, "rmsnorm"}}};
inline constexpr EnumNames<GptOptions::Position, 2> kGptPositionNames{
    {{GptOptions::Position::kLearned, "learned"}, {GptOptions::Position::kNone, "none"}}};

/// LayerNorm (with a bias only when `bias`) or RMSNorm over the last dimension.
class GptNormImpl : public torch::nn::Module {
 public:
  GptNormImpl(std::int64_t dim, bool rms, bool bias, nn::ParamOptions param);
  torch::Tensor forward(const torch::Tensor& x);

  std::int64_t dim;
  bool rms;
  torch::Tensor weight, bias;
};
TORCH_MODULE(GptNorm);

/// Causal multi-head self-attention: fused `c_attn` (n_embd -> 3 n_embd) and `c_proj`.
class GptAttentionImpl : public torch::nn::Module {
 public:
  GptAttentionImpl(const GptOptions& spec, nn::ParamOptions param);
  torch::Tensor forward(const torch::Tensor& x);

  std::int64_t heads;
  nn::Linear c_attn{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(GptAttention);

/// The MLP: GELU (`c_fc`, `c_proj`) or SwiGLU (`gate`, `up`, `down`: down(silu(gate(x)) * up(x))).
class GptMlpImpl : public torch::nn::Module {
 public:
  GptMlpImpl(const GptOptions& spec, nn::ParamOptions param);
  torch::Tensor forward(const torch::Tensor& x);

  bool swiglu;
  nn::Linear c_fc{nullptr}, c_proj{nullptr}, gate{nullptr}, up{nullptr}, down{nullptr};
};
TORCH_MODULE(GptMlp);

/// A pre-norm block: x + attn(ln_1(x)), then x + mlp(ln_2(x)).
class GptBlockImpl : public torch::nn::Module {
 public:
  GptBlockImpl(const GptOptions& spec, nn::ParamOptions param);
  torch::Tensor forward(const torch::Tensor& x);

  GptNorm ln_1{nullptr}, ln_2{nullptr};
  GptAttention attn{nullptr};
  GptMlp mlp{nullptr};
};
TORCH_MODULE(GptBlock);

/// wte (+ wpe) -> h.0..h.N-1 -> ln_f -> lm_head (tied to wte: no parameter of its own).
/// Parameter names follow Hugging Face's GPT-2 without the `transformer.` prefix.
class GptImpl : public torch::nn::Module {
 public:
  GptImpl(const GptOptions& spec, nn::ParamOptions param);
  /// Final hidden states [B, T, n_embd] (after ln_f) of tokens [B, T].
  torch::Tensor forward_hidden(const torch::Tensor& tokens, const CheckpointSelection& checkpoint_blocks = {});
  /// Final hidden states of input embeddings [B, T, n_embd] (learned positions are added here).
  /// (By value: the embeddings are let go once the positions are added, as `x = x + wpe(...)` lets them go.)
  torch::Tensor forward_embeddings(torch::Tensor embeddings, const CheckpointSelection& checkpoint_blocks = {});
  /// Vocabulary logits [B, T, vocab] of final hidden states, in their dtype.
  torch::Tensor logits(const torch::Tensor& hidden);
  /// Vocabulary logits of tokens [B, T].
  torch::Tensor forward(const torch::Tensor& tokens, const CheckpointSelection& checkpoint_blocks = {});

  GptOptions spec;
  nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList h;
  GptNorm ln_f{nullptr};
  nn::Linear lm_head{nullptr};
};
TORCH_MODULE(Gpt);

/// The MLP hidden width of `spec` (mlp_hidden, or 4 x n_embd when 0).
[[nodiscard]] std::int64_t gpt_mlp_hidden(const GptOptions& spec);

}  // namespace memgate
