// tiny_mlp: a C++ model of this project, registered with memgate so that fixtures name it (`arch: tiny_mlp`) and
// memgate's memory suite measures it like a model of its own zoo.
#include "memgate/base/error.h"
#include "memgate/models/model.h"
#include "memgate/models/registry.h"

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>

namespace {

// An MLP classifier: `layers` hidden Linear+ReLU layers of width `hidden`, then a linear head.
class TinyMlp final : public memgate::Model {
 public:
  TinyMlp(std::int64_t in_features, std::int64_t hidden, std::int64_t layers, std::int64_t classes,
          torch::Device device)
      : in_features_(in_features), classes_(classes), device_(device) {
#ifdef DOWNSTREAM_GROW_MODEL
    hidden += hidden / 4;
#endif
    auto blocks = root_->register_module("blocks", torch::nn::ModuleList());
    std::int64_t width = in_features;
    for (std::int64_t i = 0; i < layers; ++i) {
      blocks->push_back(torch::nn::Linear(width, hidden));
      width = hidden;
    }
    blocks_ = blocks;
    head_ = root_->register_module("head", torch::nn::Linear(width, classes));
    root_->to(device);
  }

  torch::nn::Module& module() override { return *root_; }

  memgate::Batch make_batch(std::int64_t batch_size) override {
    const auto opts = torch::TensorOptions().device(device_);
    return {{torch::randn({batch_size, in_features_}, opts)},
            torch::randint(classes_, {batch_size}, opts.dtype(torch::kLong))};
  }

  torch::Tensor forward(const memgate::Batch& batch) override {
    auto x = batch.inputs.front();
    for (const auto& layer : *blocks_) x = torch::relu(layer->as<torch::nn::Linear>()->forward(x));
    return head_->forward(x);
  }

  torch::Tensor loss(const memgate::Batch& batch) override {
    return torch::nn::functional::cross_entropy(forward(batch), batch.target);
  }

  std::vector<std::string> block_prefixes() const override {
    std::vector<std::string> out;
    for (std::size_t i = 0; i < blocks_->size(); ++i) out.push_back("blocks." + std::to_string(i) + ".");
    return out;
  }
  std::vector<std::string> head_prefixes() const override { return {"head."}; }

 private:
  std::shared_ptr<torch::nn::Module> root_ = std::make_shared<torch::nn::Module>();
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::Linear head_{nullptr};
  std::int64_t in_features_, classes_;
  torch::Device device_;
};

// Registered at start-up; memgate's suite loads its fixtures after every static initialiser has run.
const bool kRegistered = memgate::register_architecture({
    .name = "tiny_mlp",
    .options = {{"in_features", 64}, {"hidden", 128}, {"layers", 2}, {"num_classes", 10}},
    .factory =
        [](const nlohmann::json& o, memgate::nn::ParamOptions param) -> std::unique_ptr<memgate::Model> {
      return std::make_unique<TinyMlp>(o.at("in_features").get<std::int64_t>(), o.at("hidden").get<std::int64_t>(),
                                       o.at("layers").get<std::int64_t>(), o.at("num_classes").get<std::int64_t>(),
                                       param.device);
    },
    .validate =
        [](const nlohmann::json& o) {
          for (const char* key : {"in_features", "hidden", "layers", "num_classes"}) {
            if (o.at(key).get<std::int64_t>() < 1) {
              throw memgate::Error(std::string(key) + ": expected an integer >= 1, got " + o.at(key).dump());
            }
          }
        },
});

}  // namespace
