// torchvision's ResNet and its tasks: image classification and prototypical few-shot episodes.
#include "memgate/models/resnet.h"

#include "memgate/base/error.h"
#include "memgate/models/checkpoint.h"
#include "factories.h"

#include <torch/torch.h>

namespace memgate {
namespace {

nn::Conv2d make_conv(std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t stride, std::int64_t padding,
                     nn::ParamOptions param) {
  nn::Conv2dOptions o(in, out, k);
  o.stride = stride;
  o.padding = padding;
  o.bias = false;  // torchvision's convolutions have no bias: BatchNorm follows each
  o.param = param;
  return nn::Conv2d(o);
}

nn::BatchNorm2d make_bn(std::int64_t channels, nn::ParamOptions param) {
  nn::BatchNorm2dOptions o(channels);
  o.param = param;
  return nn::BatchNorm2d(o);
}

}  // namespace

std::vector<std::int64_t> resnet_stage_blocks(std::int64_t depth) {
  switch (depth) {
    case 18: return {2, 2, 2, 2};
    case 34: return {3, 4, 6, 3};
    case 50: return {3, 4, 6, 3};
    case 101: return {3, 4, 23, 3};
    case 152: return {3, 8, 36, 3};
    default: break;
  }
  throw Error("model.depth: expected one of 18, 34, 50, 101, 152, got " + std::to_string(depth));
}

ResNetBlockImpl::ResNetBlockImpl(std::int64_t inplanes, std::int64_t planes, std::int64_t stride,
                                 bool bottleneck_, nn::ParamOptions param)
    : bottleneck(bottleneck_) {
  const std::int64_t expansion = bottleneck ? 4 : 1;
  if (bottleneck) {
    // torchvision's Bottleneck (v1.5): the stride sits on the 3x3 convolution.
    conv1 = register_module("conv1", make_conv(inplanes, planes, 1, 1, 0, param));
    bn1 = register_module("bn1", make_bn(planes, param));
    conv2 = register_module("conv2", make_conv(planes, planes, 3, stride, 1, param));
    bn2 = register_module("bn2", make_bn(planes, param));
    conv3 = register_module("conv3", make_conv(planes, planes * expansion, 1, 1, 0, param));
    bn3 = register_module("bn3", make_bn(planes * expansion, param));
  } else {
    conv1 = register_module("conv1", make_conv(inplanes, planes, 3, stride, 1, param));
    bn1 = register_module("bn1", make_bn(planes, param));
    conv2 = register_module("conv2", make_conv(planes, planes, 3, 1, 1, param));
    bn2 = register_module("bn2", make_bn(planes, param));
  }
  if (stride != 1 || inplanes != planes * expansion) {
    // A child named `downsample` holding `0` (conv) and `1` (BN) keeps torchvision's Sequential names.
    auto downsample = register_module("downsample", std::make_shared<torch::nn::Module>());
    downsample_conv = downsample->register_module("0", make_conv(inplanes, planes * expansion, 1, stride, 0, param));
    downsample_bn = downsample->register_module("1", make_bn(planes * expansion, param));
  }
}

// torchvision's BasicBlock and Bottleneck, step by step as they run: each result replaces the one before (as Python
// rebinds `out`, freeing it), and the ReLUs and the residual add are in place. So what is alive at each moment, and
// the memory, is torchvision's. (Nested calls would keep every intermediate of the expression alive to its end: an
// H200 measured an eval forward of ResNet-18 at 28% above torchvision's with them.)
torch::Tensor ResNetBlockImpl::forward(const torch::Tensor& x) {
  auto out = conv1->forward(x);
  out = bn1->forward(out);
  out.relu_();
  out = conv2->forward(out);
  out = bn2->forward(out);
  if (bottleneck) {
    out.relu_();
    out = conv3->forward(out);
    out = bn3->forward(out);
  }
  if (downsample_conv) {
    out += downsample_bn->forward(downsample_conv->forward(x));
  } else {
    out += x;
  }
  return out.relu_();
}

ResNetImpl::ResNetImpl(const ResNetOptions& spec_, bool with_fc, nn::ParamOptions param) : spec(spec_) {
  const bool bottleneck = spec.depth >= 50;
  const std::int64_t expansion = bottleneck ? 4 : 1;
  conv1 = register_module("conv1", make_conv(spec.in_chans, spec.width, 7, 2, 3, param));
  bn1 = register_module("bn1", make_bn(spec.width, param));
  const auto stage_blocks = resnet_stage_blocks(spec.depth);
  std::int64_t inplanes = spec.width;
  for (std::size_t stage = 0; stage < stage_blocks.size(); ++stage) {
    const std::int64_t planes = spec.width << stage;
    auto layer = register_module("layer" + std::to_string(stage + 1), torch::nn::ModuleList());
    for (std::int64_t i = 0; i < stage_blocks[stage]; ++i) {
      const std::int64_t stride = (stage > 0 && i == 0) ? 2 : 1;
      layer->push_back(ResNetBlock(inplanes, planes, stride, bottleneck, param));
      inplanes = planes * expansion;
    }
    layers.push_back(layer);
  }
  if (with_fc) {
    nn::LinearOptions fc_options(inplanes, spec.num_classes);
    fc_options.param = param;
    fc = register_module("fc", nn::Linear(fc_options));
  }
}

torch::Tensor ResNetImpl::forward_features(const torch::Tensor& images,
                                           const CheckpointSelection& checkpoint_blocks) {
  auto x = conv1->forward(images);
  x = bn1->forward(x);
  x.relu_();
  x = torch::max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
  for (std::size_t stage = 0; stage < layers.size(); ++stage) {
    std::int64_t i = 0;
    for (const auto& module : *layers[stage]) {
      auto block = std::dynamic_pointer_cast<ResNetBlockImpl>(module);
      const auto name = "layer" + std::to_string(stage + 1) + "." + std::to_string(i++) + ".";
      x = run_block(block, x, checkpoint_blocks.covers(name));
    }
  }
  return torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
}

torch::Tensor ResNetImpl::forward(const torch::Tensor& images, const CheckpointSelection& checkpoint_blocks) {
  auto features = forward_features(images, checkpoint_blocks);
  return fc ? fc->forward(features) : features;
}

std::vector<std::string> ResNetImpl::block_prefixes() const {
  std::vector<std::string> out;
  const auto stage_blocks = resnet_stage_blocks(spec.depth);
  for (std::size_t stage = 0; stage < stage_blocks.size(); ++stage) {
    for (std::int64_t i = 0; i < stage_blocks[stage]; ++i) {
      out.push_back("layer" + std::to_string(stage + 1) + "." + std::to_string(i) + ".");
    }
  }
  return out;
}

namespace {

// classify: images -> fc logits, cross-entropy. protonet: each sample of the batch is one few-shot episode of
// ways x (shots + queries) images (support first, class-major); the headless ResNet embeds them, prototypes are
// the mean support embedding per class, and the queries are classified by negative squared euclidean distance.
class ResNetModel final : public Model {
 public:
  ResNetModel(const ResNetOptions& spec, nn::ParamOptions param)
      : net_(spec, /*with_fc=*/spec.task != ResNetOptions::Task::kProtonet, param), param_(param) {}
  torch::nn::Module& module() override { return *net_; }

  Batch make_batch(std::int64_t batch_size) override {
    const auto& s = net_->spec;
    auto opts = torch::TensorOptions().device(param_.device);
    if (!protonet()) {
      return {{torch::randn({batch_size, s.in_chans, s.img_size, s.img_size}, opts)},
              torch::randint(s.num_classes, {batch_size}, opts.dtype(torch::kLong))};
    }
    const auto per_episode = s.ways * (s.shots + s.queries);
    auto images = torch::randn({batch_size, per_episode, s.in_chans, s.img_size, s.img_size}, opts);
    // Query labels: class-major, `queries` per class, the same in every episode.
    auto labels = torch::arange(s.ways, opts.dtype(torch::kLong)).repeat_interleave(s.queries);
    return {{images}, labels.unsqueeze(0).expand({batch_size, -1}).contiguous()};
  }

  torch::Tensor forward(const Batch& batch) override {
    const auto& images = batch.inputs[0];
    if (!protonet()) return net_->forward(images, selection_);
    const auto& s = net_->spec;
    const auto episodes = images.size(0), per_episode = images.size(1);
    auto features = net_->forward(images.flatten(0, 1), selection_).reshape({episodes, per_episode, -1});
    const auto dim = features.size(-1);
    auto support = features.narrow(1, 0, s.ways * s.shots).reshape({episodes, s.ways, s.shots, dim});
    auto queries = features.narrow(1, s.ways * s.shots, s.ways * s.queries);
    auto prototypes = support.mean(2);  // [E, ways, D]
    // Negative squared euclidean distance of each query to each prototype: [E, ways x queries, ways].
    return -(queries.unsqueeze(2) - prototypes.unsqueeze(1)).pow(2).sum(-1);
  }

  torch::Tensor loss(const Batch& batch) override { return loss_of_output(batch, forward(batch)); }
  bool splits_loss() const override { return true; }
  torch::Tensor loss_of_output(const Batch& batch, const torch::Tensor& output) override {
    auto logits = output.to(torch::kFloat32);
    if (!protonet()) return torch::cross_entropy_loss(logits, batch.target);
    return torch::cross_entropy_loss(logits.flatten(0, 1), batch.target.flatten());
  }

  std::vector<std::string> block_prefixes() const override { return net_->block_prefixes(); }
  // protonet has no fc: `trainable: head` would train nothing there.
  std::vector<std::string> head_prefixes() const override {
    return protonet() ? std::vector<std::string>{} : std::vector<std::string>{"fc."};
  }

 private:
  [[nodiscard]] bool protonet() const { return net_->spec.task == ResNetOptions::Task::kProtonet; }
  ResNet net_;
  nn::ParamOptions param_;
};

}  // namespace

std::unique_ptr<Model> make_resnet_model(const ResNetOptions& spec, nn::ParamOptions param) {
  return std::make_unique<ResNetModel>(spec, param);
}

}  // namespace memgate
