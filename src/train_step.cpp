// One training step of a fixture: the same micro-batches, autocast and optimizer calls as the probe's.
#include "memgate/train_step.h"

#include "memgate/error.h"
#include "memgate/training.h"

#include <torch/torch.h>

namespace memgate {

void require_batch_size(const Fixture& fixture, std::int64_t batch_size) {
  if (batch_size < 1) {
    throw Error(fixture.path + ": batch size " + std::to_string(batch_size) + ": expected an integer >= 1");
  }
}

torch::Tensor micro_batch_loss(Model& model, const Batch& batch, const TrainingSpec& training,
                               torch::DeviceType device_type) {
  torch::Tensor loss;
  {
    AutocastScope autocast(device_type, training.precision);
    loss = model.loss(batch);
  }
  if (training.accumulation_steps > 1) loss = loss / static_cast<double>(training.accumulation_steps);
  return loss;
}

TrainingStep::TrainingStep(const Fixture& fixture, std::int64_t batch_size, c10::Device device,
                           std::uint64_t seed)
    : training_(fixture.training), batch_size_(batch_size), device_(device) {
  require_batch_size(fixture, batch_size);
  // The probe's order: model (seed), trainable parameters, batch (seed + 1), optimizer.
  model_ = build_model(fixture.model, device, seed);
  model_->set_gradient_checkpointing(training_.gradient_checkpointing);
  auto trainable = select_trainable(*model_, training_.trainable);
  torch::manual_seed(seed + 1);
  batch_ = model_->make_batch(batch_size);
  model_->module().train();
  optimizer_ = make_optimizer(training_, std::move(trainable));
}

TrainingStep::~TrainingStep() = default;

void TrainingStep::run() {
  for (std::int64_t i = 0; i < training_.accumulation_steps; ++i) {
    micro_batch_loss(*model_, batch_, training_, device_.type()).backward();
  }
  optimizer_->step();
  optimizer_->zero_grad(/*set_to_none=*/true);
}

}  // namespace memgate
