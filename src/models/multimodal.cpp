// The LISA-style model: frozen LLM + frozen ViT encoder in a low precision dtype, trainable fp32 mask decoder.
#include "memgate/models/multimodal.h"

#include "memgate/base/error.h"
#include "factories.h"

#include <torch/torch.h>

#include <optional>

namespace memgate {
namespace {

nn::Conv2d make_up_conv(std::int64_t in, std::int64_t out, nn::ParamOptions param) {
  nn::Conv2dOptions o(in, out, 2);
  o.stride = 2;
  o.transposed = true;
  o.param = param;
  return nn::Conv2d(o);
}

bool any_requires_grad(const torch::nn::Module& module) {
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    if (p.requires_grad()) return true;
  }
  return false;
}

}  // namespace

MaskAttentionImpl::MaskAttentionImpl(std::int64_t dim, std::int64_t heads_, nn::ParamOptions param) : heads(heads_) {
  q_proj = register_module("q_proj", nn::make_linear(dim, dim, param));
  k_proj = register_module("k_proj", nn::make_linear(dim, dim, param));
  v_proj = register_module("v_proj", nn::make_linear(dim, dim, param));
  out_proj = register_module("out_proj", nn::make_linear(dim, dim, param));
}

torch::Tensor MaskAttentionImpl::forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  auto split = [this](const torch::Tensor& x) {
    return x.reshape({x.size(0), x.size(1), heads, x.size(2) / heads}).transpose(1, 2);
  };
  auto y = nn::attention(split(q_proj->forward(q)), split(k_proj->forward(k)), split(v_proj->forward(v)),
                         /*fused=*/true);
  y = y.transpose(1, 2);
  return out_proj->forward(y.reshape({y.size(0), y.size(1), -1}));
}

TwoWayBlockImpl::TwoWayBlockImpl(std::int64_t dim, std::int64_t heads, nn::ParamOptions param) {
  self_attn = register_module("self_attn", MaskAttention(dim, heads, param));
  norm1 = register_module("norm1", nn::make_layer_norm(dim, param));
  cross_attn_token_to_image = register_module("cross_attn_token_to_image", MaskAttention(dim, heads, param));
  norm2 = register_module("norm2", nn::make_layer_norm(dim, param));
  auto mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
  mlp_lin1 = mlp->register_module("lin1", nn::make_linear(dim, 8 * dim, param));
  mlp_lin2 = mlp->register_module("lin2", nn::make_linear(8 * dim, dim, param));
  norm3 = register_module("norm3", nn::make_layer_norm(dim, param));
  cross_attn_image_to_token = register_module("cross_attn_image_to_token", MaskAttention(dim, heads, param));
  norm4 = register_module("norm4", nn::make_layer_norm(dim, param));
}

std::pair<torch::Tensor, torch::Tensor> TwoWayBlockImpl::forward(const torch::Tensor& tokens,
                                                                 const torch::Tensor& image) {
  auto q = norm1->forward(tokens + self_attn->forward(tokens, tokens, tokens));
  q = norm2->forward(q + cross_attn_token_to_image->forward(q, image, image));
  q = norm3->forward(q + mlp_lin2->forward(torch::relu(mlp_lin1->forward(q))));
  auto k = norm4->forward(image + cross_attn_image_to_token->forward(image, q, q));
  return {q, k};
}

MaskDecoderImpl::MaskDecoderImpl(std::int64_t vision_dim, std::int64_t text_dim, std::int64_t dim,
                                 std::int64_t depth, std::int64_t heads, nn::ParamOptions param) {
  const auto c1 = std::max<std::int64_t>(dim / 4, 1), c2 = std::max<std::int64_t>(dim / 8, 1);
  image_proj = register_module("image_proj", nn::make_linear(vision_dim, dim, param));
  text_proj = register_module("text_proj", nn::make_linear(text_dim, dim, param));
  layers = register_module("layers", torch::nn::ModuleList());
  for (std::int64_t i = 0; i < depth; ++i) layers->push_back(TwoWayBlock(dim, heads, param));
  upscale1 = register_module("upscale1", make_up_conv(dim, c1, param));
  upscale_norm = register_module("upscale_norm", nn::make_layer_norm(c1, param, /*channels_first=*/true));
  upscale2 = register_module("upscale2", make_up_conv(c1, c2, param));
  token_proj = register_module("token_proj", nn::make_linear(dim, c2, param));
}

torch::Tensor MaskDecoderImpl::forward(const torch::Tensor& image_tokens, const torch::Tensor& prompt,
                                       std::int64_t grid) {
  auto image = image_proj->forward(image_tokens);               // [B, N, D]
  auto tokens = text_proj->forward(prompt).unsqueeze(1);        // [B, 1, D]: the [SEG] prompt
  for (const auto& module : *layers) {
    std::tie(tokens, image) = module->as<TwoWayBlockImpl>()->forward(tokens, image);
  }
  const auto b = image.size(0);
  auto x = image.transpose(1, 2).reshape({b, image.size(2), grid, grid});
  x = torch::gelu(upscale_norm->forward(upscale1->forward(x)));
  x = torch::gelu(upscale2->forward(x));                        // [B, D/8, 4 grid, 4 grid]
  auto t = token_proj->forward(tokens);                         // [B, 1, D/8]
  auto mask = torch::matmul(t, x.flatten(2).to(t.dtype()));     // [B, 1, 16 grid^2]
  return mask.view({b, 1, x.size(2), x.size(3)});
}

MultimodalImpl::MultimodalImpl(const MultimodalOptions& spec_, nn::ParamOptions frozen, nn::ParamOptions trainable)
    : spec(spec_), frozen_dtype(frozen.dtype) {
  llm = register_module("llm", Gpt(spec.llm, frozen));
  auto vision_spec = spec.vision;
  vision_spec.num_classes = 0;  // an encoder: no classification head
  vision = register_module("vision", VisionTransformer(vision_spec, frozen));
  mask_decoder = register_module(
      "mask_decoder", MaskDecoder(spec.vision.embed_dim, spec.llm.n_embd, spec.decoder_dim, spec.decoder_depth,
                                  spec.decoder_heads, trainable));
}

torch::Tensor MultimodalImpl::forward(const torch::Tensor& images, const torch::Tensor& tokens,
                                      const CheckpointSelection& checkpoint_blocks) {
  const auto grid = spec.vision.img_size / spec.vision.patch_size;
  torch::Tensor image_tokens, prompt;
  {
    // Frozen parts keep nothing for backward; with trainable parameters (last_blocks:N) they run with autograd.
    std::optional<torch::NoGradGuard> no_grad;
    if (!any_requires_grad(*vision)) no_grad.emplace();
    auto features = vision->forward_features(images.to(frozen_dtype), checkpoint_blocks.within("vision."));
    image_tokens = features.narrow(1, 1, grid * grid).to(torch::kFloat32);  // drop the class token
  }
  {
    std::optional<torch::NoGradGuard> no_grad;
    if (!any_requires_grad(*llm)) no_grad.emplace();
    // The last token's final hidden state stands for the [SEG] token.
    prompt = llm->forward_hidden(tokens, checkpoint_blocks.within("llm.")).select(1, -1).to(torch::kFloat32);
  }
  return mask_decoder->forward(image_tokens, prompt, grid);
}

namespace {

// Reasoning segmentation: images + prompt tokens -> mask logits at 4x the patch grid; BCE with logits against a
// random {0, 1} mask. block_prefixes are the LLM's blocks, so last_blocks:N unfreezes the top of the LLM.
class MultimodalModel final : public Model {
 public:
  MultimodalModel(const MultimodalOptions& spec, nn::ParamOptions frozen, nn::ParamOptions trainable)
      : net_(spec, frozen, trainable), param_(trainable) {}
  torch::nn::Module& module() override { return *net_; }
  Batch make_batch(std::int64_t batch_size) override {
    const auto& s = net_->spec;
    auto opts = torch::TensorOptions().device(param_.device);
    const auto side = 4 * (s.vision.img_size / s.vision.patch_size);
    auto images = torch::randn({batch_size, s.vision.in_chans, s.vision.img_size, s.vision.img_size}, opts);
    auto tokens = torch::randint(s.llm.vocab_size, {batch_size, s.text_len}, opts.dtype(torch::kLong));
    auto mask = torch::randint(2, {batch_size, 1, side, side}, opts);
    return {{images, tokens}, mask};
  }
  torch::Tensor forward(const Batch& batch) override {
    return net_->forward(batch.inputs[0], batch.inputs[1], selection_);
  }
  torch::Tensor loss(const Batch& batch) override { return loss_of_output(batch, forward(batch)); }
  bool splits_loss() const override { return true; }
  torch::Tensor loss_of_output(const Batch& batch, const torch::Tensor& output) override {
    return torch::binary_cross_entropy_with_logits(output.to(torch::kFloat32), batch.target);
  }
  std::vector<std::string> block_prefixes() const override {
    std::vector<std::string> out;
    for (std::int64_t i = 0; i < net_->spec.llm.n_layer; ++i) out.push_back("llm.h." + std::to_string(i) + ".");
    return out;
  }
  std::vector<std::string> head_prefixes() const override { return {"mask_decoder."}; }
  // Both towers run their blocks through run_block: the vision encoder's and the LLM's.
  std::vector<std::string> checkpoint_prefixes() const override {
    std::vector<std::string> out;
    for (std::int64_t i = 0; i < net_->spec.vision.depth; ++i) {
      out.push_back("vision.blocks." + std::to_string(i) + ".");
    }
    auto llm = block_prefixes();
    out.insert(out.end(), llm.begin(), llm.end());
    return out;
  }

 private:
  Multimodal net_;
  nn::ParamOptions param_;
};

}  // namespace

std::unique_ptr<Model> make_multimodal_model(const MultimodalOptions& spec, nn::ParamOptions param) {
  nn::ParamOptions frozen{param.device, dtype_of(spec.frozen_dtype)};
  return std::make_unique<MultimodalModel>(spec, frozen, param);
}

}  // namespace memgate
