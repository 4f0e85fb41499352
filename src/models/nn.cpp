// Device-materialised layers (see nn.h). Initialisation is seeded and in place, on the target device.
#include "memgate/models/nn.h"

#include <ATen/ScalarOps.h>
#include <torch/torch.h>

#include <cmath>

namespace memgate::nn {

LinearImpl::LinearImpl(LinearOptions options_) : options(std::move(options_)) { reset(); }

void LinearImpl::reset() {
  const auto opts = options.param.tensor();
  weight = register_parameter("weight", torch::empty({options.out_features, options.in_features}, opts));
  torch::NoGradGuard no_grad;
  weight.normal_(0.0, 0.02);
  if (options.bias) {
    bias = register_parameter("bias", torch::zeros({options.out_features}, opts));
  }
}

void LinearImpl::add_lora(std::int64_t rank, double alpha) {
  const auto opts = options.param.tensor();
  lora_a = register_parameter("lora_a", torch::empty({rank, options.in_features}, opts));
  lora_b = register_parameter("lora_b", torch::zeros({options.out_features, rank}, opts));
  torch::NoGradGuard no_grad;
  lora_a.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(options.in_features)));
  lora_scale = alpha / static_cast<double>(rank);
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  // aten::linear, as nn.Linear and F.linear call it: autocast casts the input, the weight and the bias to the lower
  // precision and caches a trainable weight's cast for the whole region. LibTorch's functional::linear is
  // `input.matmul(weight.t())` then `output += bias` for 3-D inputs: the transposed view is cast anew on every call
  // and never cached, and the fp32 bias added into a bf16 output made two fp32 temporaries of the output's size.
  auto y = torch::linear(x, weight, bias);
  if (lora_a.defined()) {
    // As PEFT's `result + lora_B(lora_A(x)) * scaling` runs in eager Python: lora_A's output is freed once lora_B has
    // returned, lora_B's once the product exists, the product once the sum does (one C++ expression would keep all
    // three through the sum).
    // PEFT first casts the input to the adapter's dtype (LoraLayer._cast_input_dtype): under autocast a bf16 input
    // (an attention output, a GELU's) becomes an fp32 copy, which autocast casts back for lora_A, and that copy is
    // what lora_A's backward saves.
    const auto input = x.scalar_type() == lora_a.scalar_type() ? x : x.to(lora_a.scalar_type());
    auto update = torch::linear(torch::linear(input, lora_a), lora_b);
    // Python's `* scaling` multiplies by a wrapped number, a 0-dim double on the host that MulBackward0 saves (8
    // bytes a layer on the CPU); LibTorch's mul(Scalar) would save nothing.
    auto scale = c10::scalar_to_tensor(lora_scale);
    scale.unsafeGetTensorImpl()->set_wrapped_number(true);
    update = update * scale;
    y = y + update;
  }
  return y;
}

Conv2dImpl::Conv2dImpl(Conv2dOptions options_) : options(std::move(options_)) { reset(); }

void Conv2dImpl::reset() {
  const auto opts = options.param.tensor();
  const auto k = options.kernel;
  // Transposed convolutions keep weights as [in, out / groups, k, k], as torch.nn.ConvTranspose2d does.
  std::vector<std::int64_t> shape = options.transposed
      ? std::vector<std::int64_t>{options.in_channels, options.out_channels / options.groups, k, k}
      : std::vector<std::int64_t>{options.out_channels, options.in_channels / options.groups, k, k};
  weight = register_parameter("weight", torch::empty(shape, opts));
  torch::NoGradGuard no_grad;
  const double fan_in = static_cast<double>(shape[1] * k * k);
  weight.normal_(0.0, std::sqrt(2.0 / fan_in));
  if (options.bias) bias = register_parameter("bias", torch::zeros({options.out_channels}, opts));
}

torch::Tensor Conv2dImpl::forward(const torch::Tensor& x) {
  if (options.transposed) {
    return torch::conv_transpose2d(x, weight, bias, options.stride, options.padding, /*output_padding=*/0,
                                   options.groups);
  }
  return torch::conv2d(x, weight, bias, options.stride, options.padding, /*dilation=*/1, options.groups);
}

LayerNormImpl::LayerNormImpl(LayerNormOptions options_) : options(std::move(options_)) { reset(); }

void LayerNormImpl::reset() {
  const auto opts = options.param.tensor();
  weight = register_parameter("weight", torch::ones({options.dim}, opts));
  if (!options.rms) bias = register_parameter("bias", torch::zeros({options.dim}, opts));
}

torch::Tensor LayerNormImpl::forward(const torch::Tensor& x) {
  if (options.channels_first) {
    // ConvNeXt's LayerNorm2d: normalise channels of NCHW by moving them last and back.
    auto y = torch::layer_norm(x.permute({0, 2, 3, 1}), {options.dim}, weight, bias, options.eps);
    return y.permute({0, 3, 1, 2});
  }
  if (options.rms) return torch::rms_norm(x, {options.dim}, weight, options.eps);
  return torch::layer_norm(x, {options.dim}, weight, bias, options.eps);
}

BatchNorm2dImpl::BatchNorm2dImpl(BatchNorm2dOptions options_) : options(std::move(options_)) { reset(); }

void BatchNorm2dImpl::reset() {
  const auto opts = options.param.tensor();
  weight = register_parameter("weight", torch::ones({options.channels}, opts));
  bias = register_parameter("bias", torch::zeros({options.channels}, opts));
  running_mean = register_buffer("running_mean", torch::zeros({options.channels}, opts));
  running_var = register_buffer("running_var", torch::ones({options.channels}, opts));
  num_batches_tracked = register_buffer("num_batches_tracked", torch::zeros({}, opts.dtype(torch::kLong)));
}

torch::Tensor BatchNorm2dImpl::forward(const torch::Tensor& x) {
  if (is_training()) {
    torch::NoGradGuard no_grad;
    num_batches_tracked.add_(1);
  }
  return torch::batch_norm(x, weight, bias, running_mean, running_var, is_training(), /*momentum=*/0.1,
                           /*eps=*/1e-5, /*cudnn_enabled=*/true);
}

EmbeddingImpl::EmbeddingImpl(EmbeddingOptions options_) : options(std::move(options_)) { reset(); }

void EmbeddingImpl::reset() {
  weight = register_parameter("weight", torch::empty({options.count, options.dim}, options.param.tensor()));
  torch::NoGradGuard no_grad;
  weight.normal_(0.0, 0.02);
}

torch::Tensor EmbeddingImpl::forward(const torch::Tensor& indices) { return torch::embedding(weight, indices); }

torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool fused,
                        bool causal) {
  if (fused) return at::scaled_dot_product_attention(q, k, v, {}, 0.0, causal);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto scores = torch::matmul(q, k.transpose(-2, -1)) * scale;
  if (causal) {
    const auto n = q.size(-2);
    auto mask = torch::ones({n, n}, q.options().dtype(torch::kBool)).triu(1);
    scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
  }
  return torch::matmul(torch::softmax(scores, -1), v);
}

Linear make_linear(std::int64_t in, std::int64_t out, ParamOptions param, bool bias) {
  LinearOptions o(in, out);
  o.bias = bias;
  o.param = param;
  return Linear(o);
}

LayerNorm make_layer_norm(std::int64_t dim, ParamOptions param, bool channels_first) {
  LayerNormOptions o(dim);
  o.channels_first = channels_first;
  o.param = param;
  return LayerNorm(o);
}

}  // namespace memgate::nn
