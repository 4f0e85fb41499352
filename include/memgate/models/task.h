// A model of the user's own as memgate trains it: a batch made from the fixture's `inputs`, and the loss of its
// `task` (classify, regress, sum) computed from the tensors its forward returned. TorchScript and Python models share
// them.
#pragma once

#include "memgate/models/model.h"
#include "memgate/models/torchscript.h"

#include <functional>
#include <string>
#include <vector>

namespace memgate {

/// One input's tensor (B replaced by `batch_size`), filled as the input says: ones, zeros, uniform in [low, high),
/// or drawn (floating: normal; integer: uniform in [0, high); bool: 0/1).
[[nodiscard]] torch::Tensor make_input(const TorchScriptInput& input, torch::Device device, std::int64_t batch_size);

/// One (seeded) batch: a tensor per input (B replaced by `batch_size`; floating inputs normal, integer ones uniform
/// in [0, high), bool ones 0/1) and the task's target (classify: integer labels; regress: a normal tensor of the
/// output's shape, found by `forward` without autograd; sum: none). `names` holds each input's kwarg where one has one.
[[nodiscard]] Batch make_task_batch(const std::vector<TorchScriptInput>& inputs, TorchScriptOptions::Task task,
                                    std::int64_t num_classes, torch::Device device, std::int64_t batch_size,
                                    const std::function<torch::Tensor(const Batch&)>& forward);

/// The task's loss from the tensors forward() returned (`outputs`, in order): classify, cross-entropy of the first
/// against the labels (it must be [B, num_classes]); regress, MSE of the first against the target; sum, the sum of
/// every floating one. Errors name `who` (the model's file or entry).
[[nodiscard]] torch::Tensor task_loss(TorchScriptOptions::Task task, std::int64_t num_classes,
                                      const std::vector<torch::Tensor>& outputs, const Batch& batch,
                                      const std::string& who);

}  // namespace memgate
