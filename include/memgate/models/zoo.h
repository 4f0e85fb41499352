// The model zoo: every architecture memgate builds, the options of each, and one factory for them all.
#pragma once

#include "memgate/base/enum_names.h"
#include "memgate/models/gpt.h"
#include "memgate/models/model.h"
#include "memgate/models/multimodal.h"
#include "memgate/models/python.h"
#include "memgate/models/resnet.h"
#include "memgate/models/segnet.h"
#include "memgate/models/torchscript.h"
#include "memgate/models/unet.h"
#include "memgate/models/vit.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <variant>

namespace memgate {

/// The architectures of the zoo, a TorchScript module, a Python module (models/python.h), or one registered by the
/// program (models/registry.h).
enum class Arch { kVit, kResNet, kUNet, kGpt, kSegNet, kMultimodal, kTorchScript, kPython, kRegistered };

/// The words of Arch, as fixtures' `model.arch` spells them (a registered architecture goes by its own name).
inline constexpr EnumNames<Arch, 8> kArchNames{{{Arch::kVit, "vit"},
                                                {Arch::kResNet, "resnet"},
                                                {Arch::kUNet, "unet"},
                                                {Arch::kGpt, "gpt"},
                                                {Arch::kSegNet, "segnet"},
                                                {Arch::kMultimodal, "multimodal"},
                                                {Arch::kTorchScript, "torchscript"},
                                                {Arch::kPython, "python"}}};

/// A registered architecture's name and its options (defaults filled in).
struct RegisteredOptions {
  std::string name;
  nlohmann::json options;
};

/// One architecture and its options.
struct ModelSpec {
  Arch arch = Arch::kVit;
  std::variant<VitOptions, ResNetOptions, UNetOptions, GptOptions, SegNetOptions, MultimodalOptions,
               TorchScriptOptions, PythonOptions, RegisteredOptions>
      options;
};

/// Builds the model with its parameters materialised on `device` (seeded, so bytes and values repeat). A Python model
/// (arch: python) is built through `python`, what memgate's Python extension lends (models/python.h).
[[nodiscard]] std::unique_ptr<Model> build_model(const ModelSpec& spec, torch::Device device,
                                                 std::uint64_t seed = 0, const PythonRuntime* python = nullptr);

}  // namespace memgate
