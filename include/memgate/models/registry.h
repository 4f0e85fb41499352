// Architectures registered by the program that links memgate: a downstream project's own C++ models, named in
// fixtures (`arch: my_net`) like the zoo's.
//
//   const bool registered = memgate::register_architecture({
//       .name = "my_net",
//       .options = {{"hidden", 256}, {"layers", 2}, {"num_classes", 10}},  // every key, with its default
//       .factory = [](const nlohmann::json& o, memgate::nn::ParamOptions param) {
//         return std::make_unique<MyNetModel>(o.at("hidden").get<std::int64_t>(), ..., param);
//       }});
#pragma once

#include "memgate/models/model.h"
#include "memgate/models/nn.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace memgate {

/// A registered architecture.
struct Architecture {
  /// The word fixtures name it by (`model.arch`); letters, digits and '_', not a word of the zoo.
  std::string name;
  /// Every key its fixtures may give under `model:` (besides `arch`), with its default. A fixture's value must
  /// have the default's type (integer, number, boolean, string, or a list of integers or of strings); unknown keys
  /// are errors, as for the zoo. The values (defaults filled in) are part of the fixture's hash.
  nlohmann::json options = nlohmann::json::object();
  /// Builds the model with its parameters on `param.device` (seeded by the caller), from the options with the
  /// defaults filled in. Creating them there directly (as the zoo does, memgate/models/nn.h) lets memgate count a
  /// model on the meta device without allocating it; a factory that builds on the CPU and moves the module with
  /// to(device) works too, and is counted on the CPU.
  std::function<std::unique_ptr<Model>(const nlohmann::json& options, nn::ParamOptions param)> factory{};
  /// Optional checks across options; throw memgate::Error with what is wrong (the fixture's file is added).
  std::function<void(const nlohmann::json& options)> validate{};
};

/// Registers `architecture`; returns true, so that a namespace-scope `const bool` can register at start-up.
/// Throws memgate::Error for an empty or invalid name, a name of the zoo, a name registered twice, options that
/// are not a JSON object, or no factory.
bool register_architecture(Architecture architecture);

/// The registered architecture named `name`, or nullptr.
[[nodiscard]] const Architecture* find_architecture(const std::string& name);

/// The names registered, sorted.
[[nodiscard]] std::vector<std::string> registered_architectures();

}  // namespace memgate
