// Architectures a program registers (memgate/models/registry.h): named in fixtures like the zoo's, their options
// read as strictly, their models measured by the same probe.
#include "memgate/base/error.h"
#include "memgate/gate/fixture.h"
#include "memgate/measure/probe.h"
#include "memgate/models/registry.h"
#include "memgate/launch/run.h"
#include "fixture_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace memgate {
namespace {

using ::testing::HasSubstr;

// Linear(width -> width) x depth, then a 3-way head.
class StackModel final : public Model {
 public:
  StackModel(std::int64_t width, std::int64_t depth, torch::Device device) : width_(width), device_(device) {
    for (std::int64_t i = 0; i < depth; ++i) {
      layers_.push_back(root_->register_module("layer" + std::to_string(i), torch::nn::Linear(width, width)));
    }
    head_ = root_->register_module("head", torch::nn::Linear(width, 3));
    root_->to(device);
  }
  torch::nn::Module& module() override { return *root_; }
  Batch make_batch(std::int64_t batch_size) override {
    return {{torch::randn({batch_size, width_}, torch::TensorOptions().device(device_))},
            torch::randint(3, {batch_size}, torch::TensorOptions().device(device_).dtype(torch::kLong))};
  }
  torch::Tensor forward(const Batch& batch) override {
    auto x = batch.inputs.front();
    for (auto& layer : layers_) x = torch::relu(layer->forward(x));
    return head_->forward(x);
  }
  torch::Tensor loss(const Batch& batch) override {
    return torch::nn::functional::cross_entropy(forward(batch), batch.target);
  }
  std::vector<std::string> block_prefixes() const override {
    std::vector<std::string> out;
    for (std::size_t i = 0; i < layers_.size(); ++i) out.push_back("layer" + std::to_string(i) + ".");
    return out;
  }
  std::vector<std::string> head_prefixes() const override { return {"head."}; }

 private:
  std::shared_ptr<torch::nn::Module> root_ = std::make_shared<torch::nn::Module>();
  std::vector<torch::nn::Linear> layers_;
  torch::nn::Linear head_{nullptr};
  std::int64_t width_;
  torch::Device device_;
};

const bool kRegistered = register_architecture({
    .name = "test_stack",
    .options = {{"width", 16}, {"depth", 2}, {"note", "x"}, {"scale", 1.5}, {"biased", true}},
    .factory = [](const nlohmann::json& o, nn::ParamOptions param) -> std::unique_ptr<Model> {
      return std::make_unique<StackModel>(o.at("width").get<std::int64_t>(), o.at("depth").get<std::int64_t>(),
                                          param.device);
    },
    .validate =
        [](const nlohmann::json& o) {
          if (o.at("depth").get<std::int64_t>() < 1) throw Error("depth: expected >= 1");
        },
});

std::string stack_yaml(const std::string& model_extra, const std::string& training = "  trainable: all\n") {
  return "model:\n  arch: test_stack\n" + model_extra + "training:\n  optimizer: adamw\n" + training +
         "batch_sizes: [4]\n";
}

std::string registry_load_error(const std::string& yaml) {
  try {
    (void)testing::fixture_from(yaml, "stack");
  } catch (const Error& e) {
    return e.what();
  }
  return "(loaded)";
}

TEST(RegistryTest, ARegisteredArchitectureLoadsWithDefaultsAndTrains) {
  ASSERT_TRUE(kRegistered);
  EXPECT_NE(find_architecture("test_stack"), nullptr);
  const auto f = testing::fixture_from(stack_yaml("  width: 32\n"));
  ASSERT_EQ(f.model.arch, Arch::kRegistered);
  const auto& options = std::get<RegisteredOptions>(f.model.options).options;
  EXPECT_EQ(options.at("width"), 32);
  EXPECT_EQ(options.at("depth"), 2) << "defaults filled in";
  const std::int64_t params = 2 * (32 * 32 + 32) + (32 * 3 + 3);
  EXPECT_EQ(workload_param_counts(f).total, params);
  const auto r = run_probe(f, 4, c10::Device(c10::DeviceType::CPU));
  ASSERT_FALSE(r.oom) << r.error;
  EXPECT_EQ(r.components.params, params * 4);
  EXPECT_EQ(r.components.gradients, params * 4);
  EXPECT_GT(r.components.activations, 0);
}

TEST(RegistryTest, HeadAndLastBlocksUseTheModelsPrefixes) {
  const auto head = testing::fixture_from(stack_yaml("", "  trainable: head\n"));
  EXPECT_EQ(workload_param_counts(head).trainable, 16 * 3 + 3);
  const auto last = testing::fixture_from(stack_yaml("", "  trainable: last_blocks:1\n"));
  EXPECT_EQ(workload_param_counts(last).trainable, (16 * 16 + 16) + (16 * 3 + 3));
}

TEST(RegistryTest, OptionsAreReadAsStrictlyAsTheZoos) {
  EXPECT_THAT(registry_load_error(stack_yaml("  widht: 32\n")), HasSubstr("widht"));
  EXPECT_THAT(registry_load_error(stack_yaml("  width: wide\n")), HasSubstr("model.width: expected an integer"));
  EXPECT_THAT(registry_load_error(stack_yaml("  biased: maybe\n")), HasSubstr("model.biased"));
  EXPECT_THAT(registry_load_error(stack_yaml("  depth: 0\n")), HasSubstr("model (test_stack): depth: expected >= 1"));
  EXPECT_THAT(registry_load_error(stack_yaml("  depth: 0\n")), HasSubstr("stack.yaml"));
  EXPECT_THAT(registry_load_error("model:\n  arch: no_such_net\nbatch_sizes: [1]\n"),
              HasSubstr("model.arch: expected one of vit, resnet, unet, gpt, segnet, multimodal, torchscript, "));
  EXPECT_THAT(registry_load_error("model:\n  arch: no_such_net\nbatch_sizes: [1]\n"), HasSubstr("test_stack"));
}

TEST(RegistryTest, OptionsArePartOfTheHash) {
  EXPECT_NE(testing::fixture_from(stack_yaml("  width: 32\n")).hash, testing::fixture_from(stack_yaml("")).hash);
  EXPECT_EQ(testing::fixture_from(stack_yaml("  width: 16\n")).hash, testing::fixture_from(stack_yaml("")).hash)
      << "a default written out is the same model";
}

TEST(RegistryTest, BadRegistrationsAreRefused) {
  auto factory = [](const nlohmann::json&, nn::ParamOptions) -> std::unique_ptr<Model> { return nullptr; };
  EXPECT_THROW(register_architecture({.name = "test_stack", .factory = factory}), Error);
  EXPECT_THROW(register_architecture({.name = "vit", .factory = factory}), Error);
  EXPECT_THROW(register_architecture({.name = "has space", .factory = factory}), Error);
  EXPECT_THROW(register_architecture({.name = "no_factory"}), Error);
  EXPECT_THROW(register_architecture({.name = "bad_options", .options = nlohmann::json::array(), .factory = factory}),
               Error);
  EXPECT_THROW(register_architecture({.name = "arch_option", .options = {{"arch", 1}}, .factory = factory}), Error);
}

}  // namespace
}  // namespace memgate
