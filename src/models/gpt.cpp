// The GPT-style decoder (GPT-2 / LLaMA-like geometries, LoRA) and its task: next-token cross-entropy.
#include "memgate/models/gpt.h"

#include "memgate/models/checkpoint.h"
#include "factories.h"

#include <torch/torch.h>

namespace memgate {
namespace {

bool targets(const LoraOptions& lora, const std::string& name) {
  if (!lora.enabled()) return false;
  for (const auto& t : lora.targets) {
    if (t == name) return true;
  }
  return false;
}

}  // namespace

std::int64_t gpt_mlp_hidden(const GptOptions& spec) { return spec.mlp_hidden > 0 ? spec.mlp_hidden : 4 * spec.n_embd; }

GptNormImpl::GptNormImpl(std::int64_t dim_, bool rms_, bool bias_, nn::ParamOptions param) : dim(dim_), rms(rms_) {
  weight = register_parameter("weight", torch::ones({dim}, param.tensor()));
  if (!rms && bias_) bias = register_parameter("bias", torch::zeros({dim}, param.tensor()));
}

torch::Tensor GptNormImpl::forward(const torch::Tensor& x) {
  if (rms) return torch::rms_norm(x, {dim}, weight, 1e-6);
  return torch::layer_norm(x, {dim}, weight, bias, 1e-5);
}

GptAttentionImpl::GptAttentionImpl(const GptOptions& spec, nn::ParamOptions param) : heads(spec.n_head) {
  c_attn = register_module("c_attn", nn::make_linear(spec.n_embd, 3 * spec.n_embd, param, spec.bias));
  c_proj = register_module("c_proj", nn::make_linear(spec.n_embd, spec.n_embd, param, spec.bias));
  if (targets(spec.lora, "qkv")) c_attn->add_lora(spec.lora.rank, spec.lora.alpha);
  if (targets(spec.lora, "proj")) c_proj->add_lora(spec.lora.rank, spec.lora.alpha);
}

torch::Tensor GptAttentionImpl::forward(const torch::Tensor& x) {
  const auto b = x.size(0), n = x.size(1), c = x.size(2);
  auto qkv = c_attn->forward(x).reshape({b, n, 3, heads, c / heads}).permute({2, 0, 3, 1, 4});
  auto y = nn::attention(qkv[0], qkv[1], qkv[2], /*fused=*/true, /*causal=*/true);
  // Statement by statement, as the Python it stands for frees: a C++ temporary lives to the end of its whole
  // expression, a Python one when its last reference goes (in eval, with nothing saved for backward, that is earlier).
  y = y.transpose(1, 2).reshape({b, n, c});
  return c_proj->forward(y);
}

GptMlpImpl::GptMlpImpl(const GptOptions& spec, nn::ParamOptions param) : swiglu(spec.mlp == GptOptions::Mlp::kSwiglu) {
  const auto hidden = gpt_mlp_hidden(spec);
  const auto rank = spec.lora.rank;
  const auto alpha = spec.lora.alpha;
  if (swiglu) {
    gate = register_module("gate", nn::make_linear(spec.n_embd, hidden, param, spec.bias));
    up = register_module("up", nn::make_linear(spec.n_embd, hidden, param, spec.bias));
    down = register_module("down", nn::make_linear(hidden, spec.n_embd, param, spec.bias));
    if (targets(spec.lora, "fc1")) {
      gate->add_lora(rank, alpha);
      up->add_lora(rank, alpha);
    }
    if (targets(spec.lora, "fc2")) down->add_lora(rank, alpha);
  } else {
    c_fc = register_module("c_fc", nn::make_linear(spec.n_embd, hidden, param, spec.bias));
    c_proj = register_module("c_proj", nn::make_linear(hidden, spec.n_embd, param, spec.bias));
    if (targets(spec.lora, "fc1")) c_fc->add_lora(rank, alpha);
    if (targets(spec.lora, "fc2")) c_proj->add_lora(rank, alpha);
  }
}

torch::Tensor GptMlpImpl::forward(const torch::Tensor& x) {
  // As transformers writes them: c_fc's output (the gate's) is gone before c_proj (down) runs.
  if (swiglu) {
    auto h = torch::silu(gate->forward(x));
    h = h * up->forward(x);
    return down->forward(h);
  }
  // GPT-2's gelu_new is the tanh approximation.
  auto h = c_fc->forward(x);
  h = torch::gelu(h, "tanh");
  return c_proj->forward(h);
}

GptBlockImpl::GptBlockImpl(const GptOptions& spec, nn::ParamOptions param) {
  const bool rms = spec.norm == GptOptions::Norm::kRmsNorm;
  ln_1 = register_module("ln_1", GptNorm(spec.n_embd, rms, spec.bias, param));
  attn = register_module("attn", GptAttention(spec, param));
  ln_2 = register_module("ln_2", GptNorm(spec.n_embd, rms, spec.bias, param));
  mlp = register_module("mlp", GptMlp(spec, param));
}

torch::Tensor GptBlockImpl::forward(const torch::Tensor& x) {
  // ln_1's (ln_2's) output is gone once attn (mlp) returns, the branch's once the residual is added.
  auto y = attn->forward(ln_1->forward(x));
  y = x + y;
  auto z = mlp->forward(ln_2->forward(y));
  return y + z;
}

GptImpl::GptImpl(const GptOptions& spec_, nn::ParamOptions param) : spec(spec_) {
  nn::EmbeddingOptions wte_options(spec.vocab_size, spec.n_embd);
  wte_options.param = param;
  wte = register_module("wte", nn::Embedding(wte_options));
  if (spec.position == GptOptions::Position::kLearned) {
    nn::EmbeddingOptions wpe_options(spec.seq_len, spec.n_embd);
    wpe_options.param = param;
    wpe = register_module("wpe", nn::Embedding(wpe_options));
  }
  h = register_module("h", torch::nn::ModuleList());
  for (std::int64_t i = 0; i < spec.n_layer; ++i) h->push_back(GptBlock(spec, param));
  ln_f = register_module("ln_f", GptNorm(spec.n_embd, spec.norm == GptOptions::Norm::kRmsNorm, spec.bias, param));
  if (!spec.tied_embeddings) {
    lm_head = register_module("lm_head", nn::make_linear(spec.n_embd, spec.vocab_size, param, /*bias=*/false));
  }
}

torch::Tensor GptImpl::forward_embeddings(torch::Tensor embeddings,
                                          const CheckpointSelection& checkpoint_blocks) {
  auto x = std::move(embeddings);
  // The positions are a local of the body's forward (transformers' position_ids, nanoGPT's pos): they live until it
  // returns, through the blocks (in eval, or with wpe frozen, nothing else holds them).
  torch::Tensor positions;
  if (wpe) {
    positions = torch::arange(x.size(1), torch::TensorOptions().device(x.device()).dtype(torch::kLong));
    x = x + wpe->forward(positions).to(x.dtype());
  }
  std::int64_t i = 0;
  for (const auto& module : *h) {
    auto block = std::dynamic_pointer_cast<GptBlockImpl>(module);
    x = run_block(block, x, checkpoint_blocks.covers("h." + std::to_string(i++) + "."));
  }
  return ln_f->forward(x);
}

torch::Tensor GptImpl::forward_hidden(const torch::Tensor& tokens, const CheckpointSelection& checkpoint_blocks) {
  return forward_embeddings(wte->forward(tokens), checkpoint_blocks);
}

torch::Tensor GptImpl::logits(const torch::Tensor& hidden) {
  if (lm_head) return lm_head->forward(hidden);
  return torch::linear(hidden, wte->weight);
}

torch::Tensor GptImpl::forward(const torch::Tensor& tokens, const CheckpointSelection& checkpoint_blocks) {
  return logits(forward_hidden(tokens, checkpoint_blocks));
}

namespace {

// Language modeling: random tokens [B, seq_len] and random targets; cross-entropy over the vocabulary, with the
// logits computed in the model's (autocast) dtype and cast to fp32 for the loss.
class GptModel final : public Model {
 public:
  GptModel(const GptOptions& spec, nn::ParamOptions param) : net_(spec, param), param_(param) {}
  torch::nn::Module& module() override { return *net_; }
  Batch make_batch(std::int64_t batch_size) override {
    const auto& s = net_->spec;
    auto opts = torch::TensorOptions().device(param_.device).dtype(torch::kLong);
    auto tokens = torch::randint(s.vocab_size, {batch_size, s.seq_len}, opts);
    auto targets = torch::randint(s.vocab_size, {batch_size, s.seq_len}, opts);
    return {{tokens}, targets};
  }
  torch::Tensor forward(const Batch& batch) override { return net_->forward(batch.inputs[0], selection_); }
  torch::Tensor loss(const Batch& batch) override { return loss_of_output(batch, forward(batch)); }
  bool splits_loss() const override { return true; }
  torch::Tensor loss_of_output(const Batch& batch, const torch::Tensor& output) override {
    auto logits = output.to(torch::kFloat32);
    return torch::cross_entropy_loss(logits.flatten(0, 1), batch.target.flatten());
  }
  std::vector<std::string> block_prefixes() const override {
    std::vector<std::string> out;
    for (std::int64_t i = 0; i < net_->spec.n_layer; ++i) out.push_back("h." + std::to_string(i) + ".");
    return out;
  }
  std::vector<std::string> head_prefixes() const override {
    if (net_->spec.tied_embeddings) return {"ln_f."};
    return {"ln_f.", "lm_head."};
  }

 private:
  Gpt net_;
  nn::ParamOptions param_;
};

}  // namespace

std::unique_ptr<Model> make_gpt_model(const GptOptions& spec, nn::ParamOptions param) {
  return std::make_unique<GptModel>(spec, param);
}

}  // namespace memgate
