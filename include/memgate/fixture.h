// Model fixtures: a YAML file naming an architecture, a training setup and the batch sizes to probe.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace memgate {

/// Low-rank adapters on named linear layers: each adds rank x in + out x rank parameters.
struct LoraSpec {
  std::int64_t rank = 0;              ///< 0: no adapters
  double alpha = 0.0;                 ///< scale is alpha / rank
  std::vector<std::string> targets;   ///< linear layers that get one: qkv, proj, fc1, fc2
  [[nodiscard]] bool enabled() const { return rank > 0; }
};

/// A Vision Transformer with a class token, with timm's VisionTransformer parameters.
struct VitSpec {
  std::int64_t img_size = 224;    ///< input height and width
  std::int64_t patch_size = 16;   ///< patch height and width
  std::int64_t in_chans = 3;      ///< input channels
  std::int64_t embed_dim = 768;   ///< width
  std::int64_t depth = 12;        ///< number of blocks
  std::int64_t num_heads = 12;    ///< attention heads; must divide embed_dim
  double mlp_ratio = 4.0;         ///< MLP hidden width / embed_dim
  std::int64_t num_classes = 1000;///< head outputs; 0 for no head
  bool qkv_bias = true;           ///< bias on the fused qkv projection
  std::string attention = "sdpa"; ///< sdpa (at::scaled_dot_product_attention) | math (unfused)
  LoraSpec lora;                  ///< optional adapters
};

/// torchvision's ResNet (18, 34, 50, 101, 152), as a classifier or a few-shot (prototypical) learner.
struct ResNetSpec {
  std::int64_t depth = 50;         ///< 18 | 34 | 50 | 101 | 152
  std::int64_t img_size = 224;     ///< input height and width
  std::int64_t in_chans = 3;       ///< input channels
  std::int64_t width = 64;         ///< channels of the stem and the first stage, doubled per stage (torchvision: 64)
  std::int64_t num_classes = 1000; ///< classifier outputs (classify task)
  std::string task = "classify";   ///< classify | protonet (few-shot episodes; batch size = episodes per step)
  std::int64_t ways = 5;           ///< protonet: classes per episode
  std::int64_t shots = 5;          ///< protonet: support images per class
  std::int64_t queries = 16;       ///< protonet: query images per class
};

/// A UNet for dense segmentation masks.
struct UNetSpec {
  std::int64_t img_size = 1024;      ///< input height and width
  std::int64_t in_chans = 3;         ///< input channels
  std::int64_t num_classes = 1;      ///< mask channels
  std::int64_t base_channels = 64;   ///< channels of the first level, doubled at each level down
  std::int64_t levels = 4;           ///< down-sampling steps
  bool bilinear = false;             ///< bilinear up-sampling instead of transposed convolutions
};

/// A GPT-style decoder language model (GPT-2 geometry by default; LLaMA-like with swiglu/rmsnorm).
struct GptSpec {
  std::int64_t vocab_size = 50257;  ///< token vocabulary
  std::int64_t seq_len = 1024;      ///< tokens per sequence (and learned positions)
  std::int64_t n_layer = 12;        ///< blocks
  std::int64_t n_embd = 768;        ///< width
  std::int64_t n_head = 12;         ///< heads; must divide n_embd
  std::int64_t mlp_hidden = 0;      ///< MLP hidden width; 0: 4 x n_embd
  std::string mlp = "gelu";         ///< gelu | swiglu
  std::string norm = "layernorm";   ///< layernorm | rmsnorm
  std::string position = "learned"; ///< learned | none (rotary-style models keep no position table)
  bool bias = true;                 ///< biases on linear layers
  bool tied_embeddings = true;      ///< the LM head shares the token embedding
  LoraSpec lora;                    ///< optional adapters (targets: qkv, proj, fc1, fc2)
};

/// A conv encoder-decoder for segmentation: ConvNeXt-style stages, feature-pyramid decoder.
struct SegNetSpec {
  std::int64_t img_size = 384;                    ///< input height and width
  std::int64_t in_chans = 3;                      ///< input channels
  std::int64_t num_classes = 1;                   ///< mask channels
  std::vector<std::int64_t> dims{48, 96, 160, 304};  ///< channels of each stage
  std::vector<std::int64_t> depths{3, 3, 9, 3};      ///< blocks of each stage
  std::int64_t decoder_dim = 128;                 ///< feature-pyramid width
  bool deep_supervision = false;                  ///< a mask head on every pyramid level, each in the loss
  std::int64_t num_experts = 0;                   ///< >0: a gated mixture of expert decoders
};

/// A frozen decoder LLM + a ViT image encoder + a trainable mask decoder (LISA-style).
struct MultimodalSpec {
  GptSpec llm;                     ///< the language model (frozen in frozen_dtype)
  VitSpec vision;                  ///< the image encoder (frozen in frozen_dtype); num_classes is 0
  std::int64_t text_len = 64;      ///< prompt tokens per sample
  std::int64_t decoder_dim = 256;  ///< mask decoder width
  std::int64_t decoder_depth = 2;  ///< mask decoder two-way blocks
  std::int64_t decoder_heads = 8;  ///< mask decoder heads
  std::string frozen_dtype = "bf16";  ///< fp32 | fp16 | bf16: dtype of the frozen LLM and encoder
};

/// The architecture section of a fixture.
struct ModelSpec {
  std::string arch;  ///< vit | resnet | unet | gpt | segnet | multimodal
  std::variant<VitSpec, ResNetSpec, UNetSpec, GptSpec, SegNetSpec, MultimodalSpec> spec;
};

/// Which parameters train.
struct TrainableSpec {
  enum class Kind { kAll, kLora, kHead, kLastBlocks };
  Kind kind = Kind::kAll;
  std::int64_t last_blocks = 0;  ///< for kLastBlocks
  [[nodiscard]] std::string str() const;
};

enum class Precision { kFp32, kFp16, kBf16 };
[[nodiscard]] std::string to_string(Precision p);

/// The training section of a fixture.
struct TrainingSpec {
  std::string optimizer = "adamw";  ///< adamw | sgd
  double lr = 1e-4;                 ///< learning rate
  double weight_decay = 0.0;        ///< decoupled (AdamW) or L2 (SGD)
  double momentum = 0.0;            ///< SGD momentum; > 0 keeps one buffer per parameter
  TrainableSpec trainable;          ///< all | lora | head | last_blocks:N
  Precision precision = Precision::kFp32;  ///< autocast dtype
  bool gradient_checkpointing = false;     ///< recompute each block in backward
  std::int64_t accumulation_steps = 1;     ///< micro-batches per optimizer step
  std::string allocator;            ///< CUDA allocator settings, e.g. expandable_segments:True
};

/// The gate's tolerance: a measurement fails when it exceeds baseline + max(relative x baseline, absolute).
struct Tolerance {
  double relative = 0.01;                    ///< allocated components (exact allocators): 1%
  std::int64_t absolute = 64 * 1024;         ///< and at least 64 KiB
  double reserved_relative = 0.05;           ///< step_peak_reserved (caching allocator segments): 5%
  std::int64_t reserved_absolute = 32 << 20; ///< and at least 32 MiB
};

/// One model fixture, loaded from fixtures/models/<name>.yaml.
struct Fixture {
  std::string name;  ///< `name:` or the file's stem
  std::string path;  ///< the file it came from
  ModelSpec model;
  TrainingSpec training;
  std::vector<std::int64_t> batch_sizes;
  Tolerance tolerance;
  /// The model and training sections as read (defaults filled in), keys sorted.
  nlohmann::json canonical;
  /// Content hash of `canonical` ("fnv1a64:<16 hex>"): baselines recorded for another hash are stale.
  std::string hash;
};

/// Loads and validates a fixture. Throws memgate::Error naming the file, the key, the line and what was
/// expected for an unknown key, a missing required key, a wrong type or a value out of range.
[[nodiscard]] Fixture load_fixture(const std::string& path);

/// 64-bit FNV-1a of `text`, as "fnv1a64:<16 hex digits>".
[[nodiscard]] std::string content_hash(const std::string& text);

}  // namespace memgate
