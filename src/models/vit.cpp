// The Vision Transformer (timm's parameters, SDPA or unfused attention, LoRA) and its classification task.
#include "memgate/models/vit.h"

#include "memgate/models/checkpoint.h"
#include "factories.h"

#include <torch/torch.h>

namespace memgate {

AttentionImpl::AttentionImpl(std::int64_t dim, std::int64_t heads_, bool qkv_bias, bool fused_,
                             nn::ParamOptions param, bool causal_)
    : heads(heads_), fused(fused_), causal(causal_) {
  nn::LinearOptions qkv_options(dim, 3 * dim);
  qkv_options.bias = qkv_bias;
  qkv_options.param = param;
  qkv = register_module("qkv", nn::Linear(qkv_options));
  nn::LinearOptions proj_options(dim, dim);
  proj_options.param = param;
  proj = register_module("proj", nn::Linear(proj_options));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x) {
  const auto b = x.size(0), n = x.size(1), c = x.size(2);
  auto qkv_out = qkv->forward(x).reshape({b, n, 3, heads, c / heads}).permute({2, 0, 3, 1, 4});
  auto q = qkv_out[0], k = qkv_out[1], v = qkv_out[2];
  auto y = nn::attention(q, k, v, fused, causal);
  return proj->forward(y.transpose(1, 2).reshape({b, n, c}));
}

VitBlockImpl::VitBlockImpl(const VitOptions& spec, nn::ParamOptions param) : proj_drop(spec.proj_drop) {
  nn::LayerNormOptions norm_options(spec.embed_dim);
  norm_options.param = param;
  norm1 = register_module("norm1", nn::LayerNorm(norm_options));
  attn = register_module("attn", Attention(spec.embed_dim, spec.num_heads, spec.qkv_bias,
                                           spec.attention == VitOptions::Attention::kSdpa, param));
  norm2 = register_module("norm2", nn::LayerNorm(norm_options));
  const auto hidden = static_cast<std::int64_t>(static_cast<double>(spec.embed_dim) * spec.mlp_ratio);
  nn::LinearOptions fc1_options(spec.embed_dim, hidden), fc2_options(hidden, spec.embed_dim);
  fc1_options.param = fc2_options.param = param;
  // timm keeps the MLP under `mlp.`; a child module of that name keeps the parameter names identical.
  auto mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
  fc1 = mlp->register_module("fc1", nn::Linear(fc1_options));
  fc2 = mlp->register_module("fc2", nn::Linear(fc2_options));
  for (const auto& target : spec.lora.targets) {
    if (!spec.lora.enabled()) break;
    if (target == "qkv") attn->qkv->add_lora(spec.lora.rank, spec.lora.alpha);
    if (target == "proj") attn->proj->add_lora(spec.lora.rank, spec.lora.alpha);
    if (target == "fc1") fc1->add_lora(spec.lora.rank, spec.lora.alpha);
    if (target == "fc2") fc2->add_lora(spec.lora.rank, spec.lora.alpha);
  }
}

torch::Tensor VitBlockImpl::attention_branch(const torch::Tensor& x) {
  auto a = attn->forward(norm1->forward(x));
  return proj_drop > 0.0 ? torch::dropout(a, proj_drop, is_training()) : a;
}

namespace {

// As timm's Mlp: each layer's output is freed once the next layer has returned (fc1's after the GELU, the GELU's
// after fc2), not held to the end of one C++ expression.
torch::Tensor mlp_branch(VitBlockImpl& block, const torch::Tensor& x) {
  auto h = block.fc1->forward(x);
  h = torch::gelu(h);
  return block.fc2->forward(h);
}

}  // namespace

torch::Tensor VitBlockImpl::forward(const torch::Tensor& x) {
  // As timm's Block, x = x + attn(norm1(x)); x = x + mlp(norm2(x)): a norm's output lives while its branch runs
  // and is freed before the residual sum; the branch's output is freed once the sum exists. One expression,
  // `y + fc2(gelu(fc1(norm2(y))))`, held norm2's, fc1's and the GELU's outputs through fc2 and the sum: in a
  // no-grad forward (eval, or a frozen backbone) the block's peak was two [B, N, C] above timm's.
  auto y = x + attention_branch(x);
  auto m = mlp_branch(*this, norm2->forward(y));
  return y + m;
}

VisionTransformerImpl::VisionTransformerImpl(const VitOptions& spec_, nn::ParamOptions param) : spec(spec_) {
  nn::Conv2dOptions patch_options(spec.in_chans, spec.embed_dim, spec.patch_size);
  patch_options.stride = spec.patch_size;
  patch_options.param = param;
  auto patch = register_module("patch_embed", std::make_shared<torch::nn::Module>());
  patch_embed = patch->register_module("proj", nn::Conv2d(patch_options));
  const auto grid = spec.img_size / spec.patch_size;
  cls_token = register_parameter("cls_token", torch::empty({1, 1, spec.embed_dim}, param.tensor()));
  pos_embed = register_parameter("pos_embed", torch::empty({1, grid * grid + 1, spec.embed_dim}, param.tensor()));
  {
    torch::NoGradGuard no_grad;
    cls_token.normal_(0.0, 1e-6);
    pos_embed.normal_(0.0, 0.02);
  }
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (std::int64_t i = 0; i < spec.depth; ++i) blocks->push_back(VitBlock(spec, param));
  nn::LayerNormOptions norm_options(spec.embed_dim);
  norm_options.param = param;
  norm = register_module("norm", nn::LayerNorm(norm_options));
  if (spec.num_classes > 0) {
    nn::LinearOptions head_options(spec.embed_dim, spec.num_classes);
    head_options.param = param;
    head = register_module("head", nn::Linear(head_options));
  }
}

torch::Tensor VisionTransformerImpl::forward_features(const torch::Tensor& images,
                                                     const CheckpointSelection& checkpoint_blocks) {
  auto x = patch_embed->forward(images).flatten(2).transpose(1, 2);
  // As timm's _pos_embed, `torch.cat([cls_token.expand(...), x], dim=1) + pos_embed`: under autocast the patches
  // (the convolution's lower precision) are promoted to the fp32 class token's dtype by cat, and the token stream
  // stays fp32 through the residual sums. (Casting the class token and positions down instead made the stream bf16:
  // eval_peak 2.3% and activations up to 14% below timm's on generated bf16 ViTs.)
  x = torch::cat({cls_token.expand({x.size(0), -1, -1}), x}, 1) + pos_embed;
  // As timm's `x = self.blocks(x)`: nn.Sequential passes each block's output on in a variable of its own, so the
  // embedded tokens stay alive (forward_features' x) until the last block has returned, then are freed before
  // the final norm. (In a no-grad forward, or with a frozen backbone, nothing else holds them.)
  auto tokens = x;
  std::int64_t i = 0;
  for (const auto& module : *blocks) {
    auto block = std::dynamic_pointer_cast<VitBlockImpl>(module);
    x = run_block(block, x, checkpoint_blocks.covers("blocks." + std::to_string(i++) + "."));
  }
  tokens.reset();
  return norm->forward(x);
}

torch::Tensor VisionTransformerImpl::forward(const torch::Tensor& images,
                                            const CheckpointSelection& checkpoint_blocks) {
  auto features = forward_features(images, checkpoint_blocks);
  return head->forward(features.select(1, 0));
}

namespace {

// Image classification with cross-entropy.
class VitModel final : public Model {
 public:
  VitModel(const VitOptions& spec, nn::ParamOptions param) : net_(spec, param), param_(param) {}
  torch::nn::Module& module() override { return *net_; }
  Batch make_batch(std::int64_t batch_size) override {
    const auto& s = net_->spec;
    auto opts = torch::TensorOptions().device(param_.device);
    return {{torch::randn({batch_size, s.in_chans, s.img_size, s.img_size}, opts)},
            torch::randint(s.num_classes, {batch_size}, opts.dtype(torch::kLong))};
  }
  torch::Tensor forward(const Batch& batch) override { return net_->forward(batch.inputs[0], selection_); }
  torch::Tensor loss(const Batch& batch) override { return loss_of_output(batch, forward(batch)); }
  bool splits_loss() const override { return true; }
  torch::Tensor loss_of_output(const Batch& batch, const torch::Tensor& output) override {
    return torch::cross_entropy_loss(output.to(torch::kFloat32), batch.target);
  }
  std::vector<std::string> block_prefixes() const override {
    std::vector<std::string> out;
    for (std::int64_t i = 0; i < net_->spec.depth; ++i) out.push_back("blocks." + std::to_string(i) + ".");
    return out;
  }
  std::vector<std::string> head_prefixes() const override { return {"head."}; }

 private:
  VisionTransformer net_;
  nn::ParamOptions param_;
};

}  // namespace

std::unique_ptr<Model> make_vit_model(const VitOptions& spec, nn::ParamOptions param) {
  return std::make_unique<VitModel>(spec, param);
}

}  // namespace memgate
