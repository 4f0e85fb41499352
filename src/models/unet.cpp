// The UNet (milesial/Pytorch-UNet's parameters) and its task: multi-label masks with BCE on logits.
#include "memgate/models/unet.h"

#include "memgate/models/checkpoint.h"
#include "factories.h"

#include <torch/torch.h>

namespace memgate {
DoubleConvImpl::DoubleConvImpl(std::int64_t in, std::int64_t out, std::int64_t mid, nn::ParamOptions param) {
  auto seq = register_module("double_conv", std::make_shared<torch::nn::Module>());
  nn::Conv2dOptions c1(in, mid, 3), c2(mid, out, 3);
  c1.padding = c2.padding = 1;
  c1.bias = c2.bias = false;
  c1.param = c2.param = param;
  nn::BatchNorm2dOptions b1(mid), b2(out);
  b1.param = b2.param = param;
  conv1 = seq->register_module("0", nn::Conv2d(c1));
  bn1 = seq->register_module("1", nn::BatchNorm2d(b1));
  conv2 = seq->register_module("3", nn::Conv2d(c2));
  bn2 = seq->register_module("4", nn::BatchNorm2d(b2));
}

torch::Tensor DoubleConvImpl::forward(const torch::Tensor& x) {
  auto y = torch::relu(bn1->forward(conv1->forward(x)));
  return torch::relu(bn2->forward(conv2->forward(y)));
}

UNetDownImpl::UNetDownImpl(std::int64_t in, std::int64_t out, nn::ParamOptions param) {
  auto seq = register_module("maxpool_conv", std::make_shared<torch::nn::Module>());
  conv = seq->register_module("1", DoubleConv(in, out, out, param));
}

torch::Tensor UNetDownImpl::forward(const torch::Tensor& x) { return conv->forward(torch::max_pool2d(x, {2, 2})); }

UNetUpImpl::UNetUpImpl(std::int64_t in, std::int64_t out, bool bilinear_, nn::ParamOptions param)
    : bilinear(bilinear_) {
  if (bilinear) {
    conv = register_module("conv", DoubleConv(in, out, in / 2, param));
  } else {
    nn::Conv2dOptions up_options(in, in / 2, 2);
    up_options.stride = 2;
    up_options.transposed = true;
    up_options.param = param;
    up = register_module("up", nn::Conv2d(up_options));
    conv = register_module("conv", DoubleConv(in, out, out, param));
  }
}

torch::Tensor UNetUpImpl::upsample_concat(const torch::Tensor& x, const torch::Tensor& skip) {
  auto y = bilinear ? torch::upsample_bilinear2d(x, {skip.size(2), skip.size(3)}, /*align_corners=*/true)
                    : up->forward(x);
  return torch::cat({skip, y}, 1);
}

torch::Tensor UNetUpImpl::forward(const torch::Tensor& x, const torch::Tensor& skip) {
  return conv->forward(upsample_concat(x, skip));
}

UNetImpl::UNetImpl(const UNetOptions& spec_, nn::ParamOptions param) : spec(spec_) {
  const auto levels = spec.levels;
  const std::int64_t factor = spec.bilinear ? 2 : 1;
  auto channels = [&](std::int64_t level) { return spec.base_channels << level; };
  inc = register_module("inc", DoubleConv(spec.in_chans, channels(0), channels(0), param));
  for (std::int64_t i = 1; i <= levels; ++i) {
    const auto out = i == levels ? channels(i) / factor : channels(i);
    downs.push_back(register_module("down" + std::to_string(i), UNetDown(channels(i - 1), out, param)));
  }
  for (std::int64_t j = 1; j <= levels; ++j) {
    const auto in = channels(levels - j + 1);
    const auto out = j == levels ? channels(0) : channels(levels - j) / factor;
    ups.push_back(register_module("up" + std::to_string(j), UNetUp(in, out, spec.bilinear, param)));
  }
  nn::Conv2dOptions out_options(channels(0), spec.num_classes, 1);
  out_options.param = param;
  // The reference wraps the 1x1 conv in OutConv as `outc.conv`.
  auto outc_module = register_module("outc", std::make_shared<torch::nn::Module>());
  outc = outc_module->register_module("conv", nn::Conv2d(out_options));
}

torch::Tensor UNetImpl::forward(const torch::Tensor& images, const CheckpointSelection& checkpoint_blocks) {
  // Checkpointing wraps each DoubleConv (one input): the max-pools, transposed convs and concatenations outside
  // them keep their (small or anyway saved) outputs.
  std::vector<torch::Tensor> skips;
  auto x = run_block(inc, images, checkpoint_blocks.covers("inc."));
  std::int64_t level = 1;
  for (auto& down : downs) {
    skips.push_back(x);
    const auto name = "down" + std::to_string(level++) + ".maxpool_conv.1.";
    x = run_block(down->conv, torch::max_pool2d(x, {2, 2}), checkpoint_blocks.covers(name));
  }
  level = 1;
  for (auto& up : ups) {
    auto skip = skips.back();
    skips.pop_back();
    const auto name = "up" + std::to_string(level++) + ".conv.";
    x = run_block(up->conv, up->upsample_concat(x, skip), checkpoint_blocks.covers(name));
  }
  return outc->forward(x);
}

namespace {

// Segmentation: images [B, C, H, W] -> mask logits; a random {0, 1} float mask; BCE with logits.
class UNetModel final : public Model {
 public:
  UNetModel(const UNetOptions& spec, nn::ParamOptions param) : net_(spec, param), param_(param) {}
  torch::nn::Module& module() override { return *net_; }
  Batch make_batch(std::int64_t batch_size) override {
    const auto& s = net_->spec;
    return dense_mask_batch(batch_size, s.in_chans, s.num_classes, s.img_size, param_.device);
  }
  torch::Tensor forward(const Batch& batch) override { return net_->forward(batch.inputs[0], selection_); }
  torch::Tensor loss(const Batch& batch) override { return loss_of_output(batch, forward(batch)); }
  bool splits_loss() const override { return true; }
  torch::Tensor loss_of_output(const Batch& batch, const torch::Tensor& output) override {
    return torch::binary_cross_entropy_with_logits(output.to(torch::kFloat32), batch.target);
  }
  std::vector<std::string> block_prefixes() const override {
    std::vector<std::string> out{"inc."};
    for (std::int64_t i = 1; i <= net_->spec.levels; ++i) out.push_back("down" + std::to_string(i) + ".");
    for (std::int64_t i = 1; i <= net_->spec.levels; ++i) out.push_back("up" + std::to_string(i) + ".");
    return out;
  }
  // The DoubleConvs run_block runs: inc and each level's conv (a level's pooling and transposed conv, the root's).
  std::vector<std::string> unit_prefixes() const override {
    std::vector<std::string> out{"inc."};
    for (std::int64_t i = 1; i <= net_->spec.levels; ++i) out.push_back("down" + std::to_string(i) + ".maxpool_conv.1.");
    for (std::int64_t i = 1; i <= net_->spec.levels; ++i) out.push_back("up" + std::to_string(i) + ".conv.");
    return out;
  }
  std::vector<std::string> head_prefixes() const override { return {"outc."}; }

 private:
  UNet net_;
  nn::ParamOptions param_;
};

}  // namespace

std::unique_ptr<Model> make_unet_model(const UNetOptions& spec, nn::ParamOptions param) {
  return std::make_unique<UNetModel>(spec, param);
}

}  // namespace memgate
