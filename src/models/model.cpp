// Trainable-parameter selection and parameter accounting.
#include "memgate/models/model.h"

#include "memgate/base/error.h"
#include "factories.h"

#include <torch/torch.h>

#include <fnmatch.h>

#include <algorithm>

#include <unordered_set>

namespace memgate {
namespace {

bool starts_with_any(const std::string& name, const std::vector<std::string>& prefixes) {
  for (const auto& p : prefixes) {
    if (name.rfind(p, 0) == 0) return true;
  }
  return false;
}

// Up to a dozen names, spread over the model (first, last and between), for an error message.
std::string some_parameter_names(torch::nn::Module& module) {
  const auto names = module.named_parameters(/*recurse=*/true).keys();
  if (names.empty()) return "(none: the model has no parameters)";
  const std::size_t shown = std::min<std::size_t>(names.size(), 12);
  std::string out;
  for (std::size_t i = 0; i < shown; ++i) {
    const std::size_t at = shown == 1 ? 0 : i * (names.size() - 1) / (shown - 1);
    out += (i ? ", " : "") + names[at];
  }
  if (shown < names.size()) out += " (" + std::to_string(names.size()) + " in all)";
  return out;
}

}  // namespace

torch::Tensor Model::loss_of_output(const Batch& /*batch*/, const torch::Tensor& /*output*/) {
  throw Error("loss_of_output: this model's loss is not a function of its forward's one output (splits_loss())");
}

void Model::set_checkpointed_blocks(const std::vector<std::string>& names, const std::string& source) {
  const auto valid = checkpoint_prefixes();
  std::vector<std::string> prefixes;
  for (const auto& name : names) {
    const auto prefix = name + ".";
    if (std::find(valid.begin(), valid.end(), prefix) == valid.end()) {
      std::string some;
      for (std::size_t i = 0; i < valid.size() && i < 6; ++i) {
        some += (i ? ", " : "") + valid[i].substr(0, valid[i].size() - 1);
      }
      if (valid.size() > 6) some += ", ... (" + std::to_string(valid.size()) + " in all)";
      throw Error((source.empty() ? std::string() : source + ": ") + "training.gradient_checkpointing.blocks: '" +
                  name + "' is no block of the model that checkpointing can recompute; expected one of " +
                  (valid.empty() ? std::string("none (this model runs no block by block)") : some));
    }
    if (std::find(prefixes.begin(), prefixes.end(), prefix) == prefixes.end()) prefixes.push_back(prefix);
  }
  checkpointing_ = !prefixes.empty();
  selection_ = CheckpointSelection(std::move(prefixes));
}

std::string TrainableSpec::str() const {
  switch (kind) {
    case Kind::kAll: return "all";
    case Kind::kLora: return "lora";
    case Kind::kHead: return "head";
    case Kind::kLastBlocks: return "last_blocks:" + std::to_string(last_blocks);
    case Kind::kPatterns: {
      std::string out = "train:[";
      for (std::size_t i = 0; i < patterns.size(); ++i) out += (i ? "," : "") + patterns[i];
      return out + "]";
    }
  }
  return "all";
}

std::vector<torch::Tensor> select_trainable(Model& model, const TrainableSpec& trainable, const std::string& source) {
  using Kind = TrainableSpec::Kind;
  const std::string where = source.empty() ? std::string() : source + ": ";
  const auto heads = model.head_prefixes();
  auto blocks = model.block_prefixes();
  if (trainable.kind == Kind::kLastBlocks) {
    if (trainable.last_blocks > static_cast<std::int64_t>(blocks.size())) {
      throw Error(where + "training.trainable: last_blocks:" + std::to_string(trainable.last_blocks) +
                  " asks for more blocks than the model has (" + std::to_string(blocks.size()) + ")");
    }
    blocks.erase(blocks.begin(), blocks.end() - trainable.last_blocks);
  }
  std::vector<torch::Tensor> out;
  std::vector<bool> pattern_used(trainable.patterns.size(), false);
  for (auto& item : model.module().named_parameters(/*recurse=*/true)) {
    const auto& name = item.key();
    bool train = false;
    switch (trainable.kind) {
      case Kind::kAll: train = true; break;
      case Kind::kHead: train = starts_with_any(name, heads); break;
      case Kind::kLora:
        train = starts_with_any(name, heads) || name.find("lora_") != std::string::npos;
        break;
      case Kind::kLastBlocks: train = starts_with_any(name, heads) || starts_with_any(name, blocks); break;
      case Kind::kPatterns:
        for (std::size_t i = 0; i < trainable.patterns.size(); ++i) {
          if (fnmatch(trainable.patterns[i].c_str(), name.c_str(), 0) == 0) train = pattern_used[i] = true;
        }
        break;
    }
    item.value().set_requires_grad(train);
    if (train) out.push_back(item.value());
  }
  for (std::size_t i = 0; i < pattern_used.size(); ++i) {
    if (!pattern_used[i]) {
      throw Error(where + "training.trainable: the pattern '" + trainable.patterns[i] +
                  "' matches no parameter of the model; its parameters are named like " +
                  some_parameter_names(model.module()));
    }
  }
  // Nothing to train: the step's backward would stop at autograd's "element 0 of tensors does not require grad".
  if (out.empty()) {
    throw Error(where + "training.trainable: expected at least one trainable parameter, got none: '" +
                trainable.str() + "' selects none of the model's parameters (" + some_parameter_names(model.module()) +
                "); name some with {train: [patterns]}, or train all");
  }
  return out;
}

Batch dense_mask_batch(std::int64_t batch_size, std::int64_t in_chans, std::int64_t classes, std::int64_t size,
                       torch::Device device) {
  const auto opts = torch::TensorOptions().device(device);
  auto images = torch::randn({batch_size, in_chans, size, size}, opts);
  auto mask = torch::randint(2, {batch_size, classes, size, size}, opts);
  return {{images}, mask};
}

ParamCounts count_parameters(const torch::nn::Module& module) {
  ParamCounts counts;
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    counts.total += p.numel();
    (p.requires_grad() ? counts.trainable : counts.frozen) += p.numel();
  }
  return counts;
}

ModelEma::ModelEma(std::vector<torch::Tensor> model, std::vector<torch::Tensor> ema, double decay,
                   std::shared_ptr<void> keep_alive)
    : decay_(decay), keep_alive_(std::move(keep_alive)) {
  if (model.size() != ema.size()) {
    throw Error("training.ema: the copy has " + std::to_string(ema.size()) + " parameters and buffers, the model " +
                std::to_string(model.size()));
  }
  for (std::size_t i = 0; i < model.size(); ++i) {
    const bool lerped = ema[i].is_floating_point();
    (lerped ? model_float_ : model_other_).push_back(model[i]);
    (lerped ? ema_float_ : ema_other_).push_back(ema[i]);
  }
}

void ModelEma::update() {
  const torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < ema_other_.size(); ++i) ema_other_[i].copy_(model_other_[i]);
  if (!ema_float_.empty()) torch::_foreach_lerp_(ema_float_, model_float_, 1.0 - decay_);
}

std::unique_ptr<ModelEma> Model::make_ema(double decay) {
  const torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> model, ema;
  std::unordered_set<const c10::TensorImpl*> seen;
  const auto add = [&](const torch::Tensor& t) {
    if (!t.defined()) return;
    const auto* impl = t.unsafeGetTensorImpl();
    if (!seen.insert(impl).second) return;
    model.push_back(t.detach());
    ema.push_back(t.detach().clone(at::MemoryFormat::Preserve));
  };
  for (const auto& p : module().parameters()) add(p);
  for (const auto& b : module().buffers()) add(b);
  return std::make_unique<ModelEma>(std::move(model), std::move(ema), decay);
}

std::int64_t parameter_and_buffer_bytes(const torch::nn::Module& module) {
  std::int64_t bytes = 0;
  for (const auto& p : module.parameters(/*recurse=*/true)) bytes += p.numel() * p.element_size();
  for (const auto& b : module.buffers(/*recurse=*/true)) bytes += b.numel() * b.element_size();
  return bytes;
}

}  // namespace memgate
