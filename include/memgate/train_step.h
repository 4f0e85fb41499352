// One training step of a fixture, as the probe protocol runs it: the step the benchmarks time.
#pragma once

#include "memgate/fixture.h"
#include "memgate/model.h"

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>

namespace memgate {

/// Throws memgate::Error, naming the fixture's file, for a batch size below 1.
void require_batch_size(const Fixture& fixture, std::int64_t batch_size);

/// The loss one micro-batch back-propagates: the task's loss under the fixture's autocast, divided by the
/// accumulation steps when there are several. The probe and TrainingStep both call it.
[[nodiscard]] torch::Tensor micro_batch_loss(Model& model, const Batch& batch, const TrainingSpec& training,
                                             torch::DeviceType device_type);

/// A fixture's model, trainable parameters, optimizer and one batch on a device, ready to train.
///
///   memgate::TrainingStep step(fixture, 8, torch::kCPU);
///   step.run();  // warm-up: optimizer state, workspaces
///   step.run();  // a steady-state step
class TrainingStep {
 public:
  /// Builds the model on `device` (seeded like a probe), turns gradient checkpointing on where the fixture asks,
  /// freezes what does not train, makes one batch of `batch_size` and the fixture's optimizer. Throws
  /// memgate::Error for a batch size below 1.
  TrainingStep(const Fixture& fixture, std::int64_t batch_size, c10::Device device, std::uint64_t seed = 0);
  ~TrainingStep();
  TrainingStep(const TrainingStep&) = delete;
  TrainingStep& operator=(const TrainingStep&) = delete;

  /// One whole step, from no gradients to no gradients: each accumulation micro-batch forward (under autocast)
  /// and backward, the optimizer step, then zero_grad(set_to_none). Queued device work is not waited for.
  void run();

  [[nodiscard]] Model& model() { return *model_; }
  [[nodiscard]] torch::optim::Optimizer& optimizer() { return *optimizer_; }
  [[nodiscard]] const Batch& batch() const { return batch_; }
  /// Samples one step trains on: batch size x accumulation steps.
  [[nodiscard]] std::int64_t samples_per_step() const { return batch_size_ * training_.accumulation_steps; }

 private:
  TrainingSpec training_;
  std::int64_t batch_size_;
  c10::Device device_;
  std::unique_ptr<Model> model_;
  Batch batch_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

}  // namespace memgate
