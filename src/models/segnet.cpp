// The ConvNeXt-style segmentation network (feature-pyramid decoder, deep supervision, mixture of experts).
#include "memgate/models/segnet.h"

#include "memgate/models/checkpoint.h"
#include "factories.h"

#include <torch/torch.h>

namespace memgate {
namespace {

nn::Conv2d seg_conv(std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t stride, std::int64_t padding,
                    nn::ParamOptions param, std::int64_t groups = 1) {
  nn::Conv2dOptions o(in, out, k);
  o.stride = stride;
  o.padding = padding;
  o.groups = groups;
  o.param = param;
  return nn::Conv2d(o);
}

torch::Tensor resize(const torch::Tensor& x, std::int64_t h, std::int64_t w, bool bilinear) {
  if (x.size(2) == h && x.size(3) == w) return x;
  if (bilinear) return torch::upsample_bilinear2d(x, {h, w}, /*align_corners=*/false);
  return torch::upsample_nearest2d(x, {h, w});
}

}  // namespace

ConvNeXtBlockImpl::ConvNeXtBlockImpl(std::int64_t dim, nn::ParamOptions param) {
  dwconv = register_module("dwconv", seg_conv(dim, dim, 7, 1, 3, param, /*groups=*/dim));
  norm = register_module("norm", nn::make_layer_norm(dim, param));
  nn::LinearOptions fc1(dim, 4 * dim), fc2(4 * dim, dim);
  fc1.param = fc2.param = param;
  pwconv1 = register_module("pwconv1", nn::Linear(fc1));
  pwconv2 = register_module("pwconv2", nn::Linear(fc2));
  gamma = register_parameter("gamma", torch::full({dim}, 1e-6, param.tensor()));
}

torch::Tensor ConvNeXtBlockImpl::forward(const torch::Tensor& x) {
  auto y = dwconv->forward(x).permute({0, 2, 3, 1});
  y = pwconv2->forward(torch::gelu(pwconv1->forward(norm->forward(y))));
  return x + (y * gamma).permute({0, 3, 1, 2});
}

SegNetStageImpl::SegNetStageImpl(std::int64_t in_dim, std::int64_t dim, std::int64_t depth, bool downsample,
                                 nn::ParamOptions param) {
  if (downsample) {
    auto down = register_module("downsample", std::make_shared<torch::nn::Module>());
    down_norm = down->register_module("norm", nn::make_layer_norm(in_dim, param, /*channels_first=*/true));
    down_conv = down->register_module("conv", seg_conv(in_dim, dim, 2, 2, 0, param));
  }
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (std::int64_t i = 0; i < depth; ++i) blocks->push_back(ConvNeXtBlock(dim, param));
}

SegNetFuseHeadImpl::SegNetFuseHeadImpl(std::int64_t in, std::int64_t dim, std::int64_t classes,
                                       nn::ParamOptions param) {
  fuse = register_module("fuse", seg_conv(in, dim, 1, 1, 0, param));
  head = register_module("head", seg_conv(dim, classes, 1, 1, 0, param));
}

torch::Tensor SegNetFuseHeadImpl::forward(const torch::Tensor& x) {
  return head->forward(torch::relu(fuse->forward(x)));
}

SegNetDecoderImpl::SegNetDecoderImpl(const SegNetOptions& spec_, nn::ParamOptions param) : spec(spec_) {
  const auto d = spec.decoder_dim;
  const auto levels = static_cast<std::int64_t>(spec.dims.size());
  lateral = register_module("lateral", torch::nn::ModuleList());
  smooth = register_module("smooth", torch::nn::ModuleList());
  for (const auto dim : spec.dims) {
    lateral->push_back(seg_conv(dim, d, 1, 1, 0, param));
    smooth->push_back(seg_conv(d, d, 3, 1, 1, param));
  }
  if (spec.num_experts > 0) {
    experts = register_module("experts", torch::nn::ModuleList());
    for (std::int64_t e = 0; e < spec.num_experts; ++e) {
      experts->push_back(SegNetFuseHead(levels * d, d, spec.num_classes, param));
    }
    nn::LinearOptions gate_options(spec.dims.back(), spec.num_experts);
    gate_options.param = param;
    gate = register_module("gate", nn::Linear(gate_options));
  } else {
    output = register_module("output", SegNetFuseHead(levels * d, d, spec.num_classes, param));
  }
  if (spec.deep_supervision) {
    aux_heads = register_module("aux_heads", torch::nn::ModuleList());
    for (std::int64_t i = 0; i < levels; ++i) aux_heads->push_back(seg_conv(d, spec.num_classes, 1, 1, 0, param));
  }
}

std::vector<torch::Tensor> SegNetDecoderImpl::forward(const std::vector<torch::Tensor>& features,
                                                      std::int64_t img_size) {
  const auto levels = features.size();
  std::vector<torch::Tensor> pyramid(levels);
  for (std::size_t k = levels; k-- > 0;) {
    auto p = lateral[k]->as<nn::Conv2dImpl>()->forward(features[k]);
    if (k + 1 < levels) p = p + resize(pyramid[k + 1], p.size(2), p.size(3), /*bilinear=*/false);
    pyramid[k] = p;
  }
  for (std::size_t k = 0; k < levels; ++k) pyramid[k] = smooth[k]->as<nn::Conv2dImpl>()->forward(pyramid[k]);
  const auto h = pyramid[0].size(2), w = pyramid[0].size(3);
  std::vector<torch::Tensor> upsampled;
  for (const auto& p : pyramid) upsampled.push_back(resize(p, h, w, /*bilinear=*/true));
  const auto fused = torch::cat(upsampled, 1);
  torch::Tensor logits;
  if (experts) {
    // Dense mixture: every expert runs, weighted by the gate's softmax over the pooled deepest feature.
    auto pooled = features.back().mean({2, 3});
    auto weights = torch::softmax(gate->forward(pooled), -1);  // [B, E]
    for (std::size_t e = 0; e < experts->size(); ++e) {
      auto out = experts[e]->as<SegNetFuseHeadImpl>()->forward(fused);
      auto weighted = out * weights.select(1, static_cast<std::int64_t>(e)).view({-1, 1, 1, 1}).to(out.dtype());
      logits = logits.defined() ? logits + weighted : weighted;
    }
  } else {
    logits = output->forward(fused);
  }
  std::vector<torch::Tensor> out{resize(logits, img_size, img_size, /*bilinear=*/true)};
  if (aux_heads) {
    for (std::size_t k = 0; k < levels; ++k) {
      out.push_back(resize(aux_heads[k]->as<nn::Conv2dImpl>()->forward(pyramid[k]), img_size, img_size, true));
    }
  }
  return out;
}

SegNetImpl::SegNetImpl(const SegNetOptions& spec_, nn::ParamOptions param) : spec(spec_) {
  auto stem = register_module("stem", std::make_shared<torch::nn::Module>());
  stem_conv = stem->register_module("conv", seg_conv(spec.in_chans, spec.dims[0], 4, 4, 0, param));
  stem_norm = stem->register_module("norm", nn::make_layer_norm(spec.dims[0], param, /*channels_first=*/true));
  auto stage_list = register_module("stages", std::make_shared<torch::nn::Module>());
  for (std::size_t i = 0; i < spec.dims.size(); ++i) {
    const auto in_dim = i == 0 ? spec.dims[0] : spec.dims[i - 1];
    stages.push_back(stage_list->register_module(
        std::to_string(i), SegNetStage(in_dim, spec.dims[i], spec.depths[i], /*downsample=*/i > 0, param)));
  }
  decoder = register_module("decoder", SegNetDecoder(spec, param));
}

std::vector<torch::Tensor> SegNetImpl::forward_features(const torch::Tensor& images,
                                                        const CheckpointSelection& checkpoint_blocks) {
  auto x = stem_norm->forward(stem_conv->forward(images));
  std::vector<torch::Tensor> features;
  for (std::size_t s = 0; s < stages.size(); ++s) {
    auto& stage = stages[s];
    if (stage->down_conv) x = stage->down_conv->forward(stage->down_norm->forward(x));
    std::int64_t i = 0;
    for (const auto& module : *stage->blocks) {
      auto block = std::dynamic_pointer_cast<ConvNeXtBlockImpl>(module);
      const auto name = "stages." + std::to_string(s) + ".blocks." + std::to_string(i++) + ".";
      x = run_block(block, x, checkpoint_blocks.covers(name));
    }
    features.push_back(x);
  }
  return features;
}

std::vector<torch::Tensor> SegNetImpl::forward(const torch::Tensor& images,
                                               const CheckpointSelection& checkpoint_blocks) {
  return decoder->forward(forward_features(images, checkpoint_blocks), spec.img_size);
}

std::vector<std::string> SegNetImpl::block_prefixes() const {
  std::vector<std::string> out{"stem."};
  for (std::size_t i = 0; i < spec.dims.size(); ++i) {
    const auto stage = "stages." + std::to_string(i) + ".";
    if (i > 0) out.push_back(stage + "downsample.");
    for (std::int64_t j = 0; j < spec.depths[i]; ++j) out.push_back(stage + "blocks." + std::to_string(j) + ".");
  }
  return out;
}

namespace {

// Segmentation: BCE with logits of the full-size mask, plus one term per pyramid level with deep supervision.
// `trainable: head` trains the decoder on a frozen backbone (stage 1 of two-stage training); last_blocks:N
// unfreezes the backbone progressively from its deepest block.
class SegNetModel final : public Model {
 public:
  SegNetModel(const SegNetOptions& spec, nn::ParamOptions param) : net_(spec, param), param_(param) {}
  torch::nn::Module& module() override { return *net_; }
  Batch make_batch(std::int64_t batch_size) override {
    const auto& s = net_->spec;
    return dense_mask_batch(batch_size, s.in_chans, s.num_classes, s.img_size, param_.device);
  }
  torch::Tensor forward(const Batch& batch) override { return net_->forward(batch.inputs[0], selection_)[0]; }
  torch::Tensor loss(const Batch& batch) override {
    torch::Tensor total;
    for (const auto& logits : net_->forward(batch.inputs[0], selection_)) {
      auto term = torch::binary_cross_entropy_with_logits(logits.to(torch::kFloat32), batch.target);
      total = total.defined() ? total + term : term;
    }
    return total;
  }
  std::vector<std::string> block_prefixes() const override { return net_->block_prefixes(); }
  // The ConvNeXt blocks: the stem and the downsampling layers run outside run_block (the root's).
  std::vector<std::string> unit_prefixes() const override {
    std::vector<std::string> out;
    for (auto& prefix : net_->block_prefixes()) {
      if (prefix.find(".blocks.") != std::string::npos) out.push_back(std::move(prefix));
    }
    return out;
  }
  std::vector<std::string> head_prefixes() const override { return {"decoder."}; }

 private:
  SegNet net_;
  nn::ParamOptions param_;
};

}  // namespace

std::unique_ptr<Model> make_segnet_model(const SegNetOptions& spec, nn::ParamOptions param) {
  return std::make_unique<SegNetModel>(spec, param);
}

}  // namespace memgate
