// Layers whose parameters are created directly on the target device and dtype (no CPU staging), as
// LibTorch's own modules are built: an options struct, `XImpl : torch::nn::Cloneable<XImpl>`, TORCH_MODULE.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace memgate {

/// Low-rank adapters on named linear layers: each adds rank x in + out x rank parameters.
struct LoraOptions {
  std::int64_t rank = 0;              ///< 0: no adapters
  double alpha = 0.0;                 ///< scale is alpha / rank
  std::vector<std::string> targets;   ///< linear layers that get one: qkv, proj, fc1, fc2
  [[nodiscard]] bool enabled() const { return rank > 0; }
};

}  // namespace memgate

namespace memgate::nn {

/// Where and in which dtype a layer's parameters live.
struct ParamOptions {
  /// Target device of the parameters.
  torch::Device device{torch::kCPU};
  /// Dtype of the parameters (fp32 unless a fixture freezes part of a model in bf16/fp16).
  torch::Dtype dtype{torch::kFloat32};
  [[nodiscard]] torch::TensorOptions tensor() const { return torch::TensorOptions().device(device).dtype(dtype); }
};

/// y = x W^T + b, with an optional low-rank adapter: + (x A^T B^T) * alpha / rank.
struct LinearOptions {
  LinearOptions(std::int64_t in, std::int64_t out) : in_features(in), out_features(out) {}
  /// Input width.
  std::int64_t in_features;
  /// Output width.
  std::int64_t out_features;
  /// Whether the layer has a bias.
  bool bias = true;
  /// Device and dtype of the parameters.
  ParamOptions param;
};

class LinearImpl : public torch::nn::Cloneable<LinearImpl> {
 public:
  explicit LinearImpl(LinearOptions options);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);
  /// Adds a LoRA adapter (parameters `lora_a` [rank, in], `lora_b` [out, rank], B zero-initialised).
  void add_lora(std::int64_t rank, double alpha);
  [[nodiscard]] bool has_lora() const { return lora_a.defined(); }

  LinearOptions options;
  torch::Tensor weight, bias, lora_a, lora_b;
  double lora_scale = 0.0;
};
TORCH_MODULE(Linear);

/// A 2-D convolution (square kernel) or, with `transposed`, a transposed convolution.
struct Conv2dOptions {
  Conv2dOptions(std::int64_t in, std::int64_t out, std::int64_t k) : in_channels(in), out_channels(out), kernel(k) {}
  /// Input channels.
  std::int64_t in_channels;
  /// Output channels.
  std::int64_t out_channels;
  /// Kernel height and width.
  std::int64_t kernel;
  /// Stride.
  std::int64_t stride = 1;
  /// Zero padding on each side.
  std::int64_t padding = 0;
  /// Channel groups (in_channels for depthwise).
  std::int64_t groups = 1;
  /// Whether the layer has a bias.
  bool bias = true;
  /// A transposed convolution (up-sampling by `stride`).
  bool transposed = false;
  /// Device and dtype of the parameters.
  ParamOptions param;
};

class Conv2dImpl : public torch::nn::Cloneable<Conv2dImpl> {
 public:
  explicit Conv2dImpl(Conv2dOptions options);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);

  Conv2dOptions options;
  torch::Tensor weight, bias;
};
TORCH_MODULE(Conv2d);

/// Layer normalisation over the last dimension, or over channels of an NCHW tensor with `channels_first`.
struct LayerNormOptions {
  explicit LayerNormOptions(std::int64_t width) : dim(width) {}
  /// Normalised width.
  std::int64_t dim;
  /// Epsilon added to the variance.
  double eps = 1e-6;
  /// Normalise dimension 1 of an NCHW tensor (ConvNeXt's LayerNorm2d).
  bool channels_first = false;
  /// RMSNorm: no mean subtraction, no bias.
  bool rms = false;
  /// Device and dtype of the parameters.
  ParamOptions param;
};

class LayerNormImpl : public torch::nn::Cloneable<LayerNormImpl> {
 public:
  explicit LayerNormImpl(LayerNormOptions options);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);

  LayerNormOptions options;
  torch::Tensor weight, bias;
};
TORCH_MODULE(LayerNorm);

/// Batch normalisation of NCHW tensors, with torchvision's buffers (running mean/var, batches tracked).
struct BatchNorm2dOptions {
  explicit BatchNorm2dOptions(std::int64_t num_channels) : channels(num_channels) {}
  /// Channels.
  std::int64_t channels;
  /// Device and dtype of the parameters.
  ParamOptions param;
};

class BatchNorm2dImpl : public torch::nn::Cloneable<BatchNorm2dImpl> {
 public:
  explicit BatchNorm2dImpl(BatchNorm2dOptions options);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);

  BatchNorm2dOptions options;
  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;
};
TORCH_MODULE(BatchNorm2d);

/// A lookup table of `count` vectors of width `dim`.
struct EmbeddingOptions {
  EmbeddingOptions(std::int64_t num_embeddings, std::int64_t width) : count(num_embeddings), dim(width) {}
  /// Rows.
  std::int64_t count;
  /// Width.
  std::int64_t dim;
  /// Device and dtype of the parameters.
  ParamOptions param;
};

class EmbeddingImpl : public torch::nn::Cloneable<EmbeddingImpl> {
 public:
  explicit EmbeddingImpl(EmbeddingOptions options);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& indices);

  EmbeddingOptions options;
  torch::Tensor weight;
};
TORCH_MODULE(Embedding);

/// Attention over [B, H, N, hd] queries, keys and values: `at::scaled_dot_product_attention`, or the unfused
/// softmax(q k^T / sqrt(hd)) v that older code runs (`math`).
[[nodiscard]] torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                      bool fused, bool causal = false);

/// A Linear layer of `in` -> `out` with its parameters per `param`.
[[nodiscard]] Linear make_linear(std::int64_t in, std::int64_t out, ParamOptions param, bool bias = true);

/// A LayerNorm over `dim` (over channels of an NCHW tensor with `channels_first`) with its parameters per `param`.
[[nodiscard]] LayerNorm make_layer_norm(std::int64_t dim, ParamOptions param, bool channels_first = false);

}  // namespace memgate::nn
