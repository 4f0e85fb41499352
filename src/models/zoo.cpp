// build_model: the zoo's one factory, dispatching on the architecture's options.
#include "memgate/models/zoo.h"

#include "factories.h"
#include "memgate/base/error.h"
#include "memgate/models/registry.h"

#include <torch/torch.h>

namespace memgate {

std::unique_ptr<Model> build_model(const ModelSpec& spec, torch::Device device, std::uint64_t seed,
                                   const PythonRuntime* python) {
  torch::manual_seed(seed);
  const nn::ParamOptions param{device, torch::kFloat32};
  return std::visit(
      [&](const auto& options) -> std::unique_ptr<Model> {
        using T = std::decay_t<decltype(options)>;
        if constexpr (std::is_same_v<T, VitOptions>) return make_vit_model(options, param);
        else if constexpr (std::is_same_v<T, ResNetOptions>) return make_resnet_model(options, param);
        else if constexpr (std::is_same_v<T, UNetOptions>) return make_unet_model(options, param);
        else if constexpr (std::is_same_v<T, GptOptions>) return make_gpt_model(options, param);
        else if constexpr (std::is_same_v<T, SegNetOptions>) return make_segnet_model(options, param);
        else if constexpr (std::is_same_v<T, MultimodalOptions>) return make_multimodal_model(options, param);
        else if constexpr (std::is_same_v<T, TorchScriptOptions>) return make_torchscript_model(options, device);
        else if constexpr (std::is_same_v<T, PythonOptions>) return make_python_model(options, device, seed, python);
        else {
          const auto* arch = find_architecture(options.name);
          if (arch == nullptr) throw Error("model.arch: '" + options.name + "' is not registered in this program");
          auto model = arch->factory(options.options, param);
          if (!model) throw Error("model.arch: the factory of '" + options.name + "' returned no model");
          return model;
        }
      },
      spec.options);
}

}  // namespace memgate
