// A model of the user's own, exported from Python with torch.jit.script or torch.jit.trace, trained through
// LibTorch's TorchScript interpreter.
#pragma once

#include "memgate/base/enum_names.h"
#include "memgate/models/model.h"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace memgate {

/// One argument of the module's forward(): a tensor of `shape`, where -1 (B in fixtures) is the batch size.
struct TorchScriptInput {
  std::vector<std::int64_t> shape;
  c10::ScalarType dtype = c10::ScalarType::Float;
  /// Integer inputs (token ids, indices) are drawn from [0, high); floating ones from a standard normal.
  std::int64_t high = 2;
  /// How the tensor is filled: drawn (as above, or uniformly from [low, high_value) for floats with `values:`), or
  /// all ones or zeros (`ones` / `zeros`: an attention mask, say).
  enum class Fill { kRandom, kUniform, kOnes, kZeros };
  Fill fill = Fill::kRandom;
  double low_value = 0.0, high_value = 1.0;  ///< kUniform's [low, high)
  /// A Python fixture's input passed to forward() as this keyword argument (`kwarg: labels`); "" positional.
  std::string kwarg;
};

/// The words of the input dtypes a fixture may name.
inline constexpr EnumNames<c10::ScalarType, 6> kInputDtypeNames{{{c10::ScalarType::Float, "float32"},
                                                                 {c10::ScalarType::Half, "float16"},
                                                                 {c10::ScalarType::BFloat16, "bfloat16"},
                                                                 {c10::ScalarType::Long, "int64"},
                                                                 {c10::ScalarType::Int, "int32"},
                                                                 {c10::ScalarType::Bool, "bool"}}};

struct TorchScriptOptions {
  /// How the output becomes a loss.
  enum class Task {
    kClassify,  ///< cross-entropy of a [B, num_classes] output against integer labels
    kRegress,   ///< MSE against a normal target of the output's shape
    kSum,       ///< the sum of every output tensor (anything else)
  };
  std::string path;  ///< the saved module, resolved against the fixture's folder
  std::vector<TorchScriptInput> inputs;
  Task task = Task::kSum;
  std::int64_t num_classes = 0;  ///< classify only
};

/// The words of TorchScriptOptions::Task.
inline constexpr EnumNames<TorchScriptOptions::Task, 3> kTorchScriptTaskNames{
    {{TorchScriptOptions::Task::kClassify, "classify"},
     {TorchScriptOptions::Task::kRegress, "regress"},
     {TorchScriptOptions::Task::kSum, "sum"}}};

/// Loads the module with torch::jit::load straight onto `device` (no CPU staging; without its debug records) and wraps it as a Model whose
/// module() holds the very parameter and buffer tensors of the TorchScript module under their own names.
/// The graph executor's optimizations are turned off, so each op runs and saves for backward what it does in
/// eager PyTorch (the profiling executor would otherwise fuse and differentiate subgraphs after two runs).
/// Throws memgate::Error naming the file when it cannot be loaded.
[[nodiscard]] std::unique_ptr<Model> make_torchscript_model(const TorchScriptOptions& spec, torch::Device device);

}  // namespace memgate
