// Optimizers as a training setup names them.
#include "memgate/measure/training.h"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

namespace memgate {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainingSpec& training,
                                                        std::vector<torch::Tensor> params) {
  if (training.optimizer == Optimizer::kSgd) {
    return std::make_unique<torch::optim::SGD>(
        std::move(params),
        torch::optim::SGDOptions(training.lr).momentum(training.momentum).weight_decay(training.weight_decay));
  }
  return std::make_unique<torch::optim::AdamW>(
      std::move(params), torch::optim::AdamWOptions(training.lr).weight_decay(training.weight_decay));
}

}  // namespace memgate
