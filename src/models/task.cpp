// A user's model's batch and its task's loss (models/task.h), shared by TorchScript and Python models.
#include "memgate/models/task.h"

#include "memgate/base/error.h"

#include <torch/torch.h>

namespace memgate {
namespace {

std::string shape_of(const torch::Tensor& t) {
  std::string out = "[";
  for (std::int64_t i = 0; i < t.dim(); ++i) out += (i ? ", " : "") + std::to_string(t.size(i));
  return out + "]";
}

const torch::Tensor& first(const std::vector<torch::Tensor>& outputs, const std::string& who, const char* what) {
  if (outputs.empty()) throw Error(who + ": " + what + ": forward() returned no tensor");
  return outputs.front();
}

}  // namespace

torch::Tensor make_input(const TorchScriptInput& input, torch::Device device, std::int64_t batch_size) {
  std::vector<std::int64_t> shape = input.shape;
  for (auto& d : shape) d = d < 0 ? batch_size : d;
  const auto opts = torch::TensorOptions().device(device).dtype(input.dtype);
  switch (input.fill) {
    case TorchScriptInput::Fill::kOnes: return torch::ones(shape, opts);
    case TorchScriptInput::Fill::kZeros: return torch::zeros(shape, opts);
    case TorchScriptInput::Fill::kUniform: return torch::empty(shape, opts).uniform_(input.low_value, input.high_value);
    case TorchScriptInput::Fill::kRandom: break;
  }
  if (c10::isFloatingType(input.dtype)) return torch::randn(shape, opts);
  if (input.dtype == c10::ScalarType::Bool) return torch::randint(2, shape, opts.dtype(torch::kLong)).to(torch::kBool);
  return torch::randint(input.high, shape, opts);
}

Batch make_task_batch(const std::vector<TorchScriptInput>& inputs, TorchScriptOptions::Task task,
                      std::int64_t num_classes, torch::Device device, std::int64_t batch_size,
                      const std::function<torch::Tensor(const Batch&)>& forward) {
  Batch batch;
  bool named = false;
  for (const auto& input : inputs) {
    batch.inputs.push_back(make_input(input, device, batch_size));
    batch.names.push_back(input.kwarg);
    named = named || !input.kwarg.empty();
  }
  if (!named) batch.names.clear();
  switch (task) {
    case TorchScriptOptions::Task::kClassify:
      batch.target = torch::randint(num_classes, {batch_size}, torch::TensorOptions().device(device).dtype(torch::kLong));
      break;
    case TorchScriptOptions::Task::kRegress: {
      // The target has the output's shape, found by one forward without autograd (freed before measuring).
      torch::NoGradGuard no_grad;
      const auto out = forward(batch);
      batch.target = torch::randn(out.sizes(), torch::TensorOptions().device(device).dtype(torch::kFloat32));
      break;
    }
    case TorchScriptOptions::Task::kSum: break;
  }
  return batch;
}

torch::Tensor task_loss(TorchScriptOptions::Task task, std::int64_t num_classes,
                        const std::vector<torch::Tensor>& outputs, const Batch& batch, const std::string& who) {
  switch (task) {
    case TorchScriptOptions::Task::kClassify: {
      const auto& logits = first(outputs, who, "classify");
      if (logits.dim() != 2 || logits.size(0) != batch.target.size(0) || logits.size(1) != num_classes) {
        throw Error(who + ": task classify expects an output of shape [B, " + std::to_string(num_classes) +
                    "] (num_classes), got " + shape_of(logits));
      }
      return torch::nn::functional::cross_entropy(logits, batch.target);
    }
    case TorchScriptOptions::Task::kRegress:
      return torch::mse_loss(first(outputs, who, "regress"), batch.target);
    case TorchScriptOptions::Task::kSum: {
      if (outputs.empty()) throw Error(who + ": task sum: forward() returned no tensor");
      torch::Tensor total;
      for (const auto& t : outputs) {
        if (!t.is_floating_point()) continue;
        auto s = t.sum();
        total = total.defined() ? total + s : s;
      }
      if (!total.defined()) throw Error(who + ": task sum: forward() returned no floating-point tensor");
      return total;
    }
  }
  return {};
}

}  // namespace memgate
