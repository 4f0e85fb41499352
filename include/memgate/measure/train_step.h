// One training step of a workload (a model and how it trains), the one the probe measures and the benchmarks
// time: the same model, batch, autocast, micro-batches and optimizer calls, with hooks between its parts.
#pragma once

#include "memgate/distributed/data_parallel.h"
#include "memgate/distributed/fully_shard.h"
#include "memgate/distributed/process_group.h"
#include "memgate/backend/memory_backend.h"
#include "memgate/measure/activation_offload.h"
#include "memgate/measure/training.h"
#include "memgate/models/zoo.h"

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace memgate {

/// What is trained and how, under a name for reports and errors. A fixture is one (gate/fixture.h).
struct Workload {
  std::string name;    ///< names it in reports and errors
  std::string source;  ///< where it came from (a fixture file), named by errors
  ModelSpec model;     ///< the architecture and its options
  TrainingSpec training;  ///< optimizer, what trains, precision, checkpointing, accumulation
};

/// Throws memgate::Error, naming the workload's source, for a batch size below 1.
void require_batch_size(const Workload& workload, std::int64_t batch_size);

/// Called between the parts of a TrainingStep: the probe reads the allocator there. Each hook does nothing
/// unless overridden.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  /// What the device's allocator held before the model was built (PreparedStep reads it; probe.h).
  virtual void base_read(const MemorySnapshot& base) {}
  /// The model's parameters and buffers are on the device; nothing else of the step is allocated yet.
  virtual void model_built() {}
  /// Before and after eval forward `pass` of a warm-up (0, then 1).
  virtual void eval_begin(int pass) {}
  virtual void eval_end(int pass) {}
  /// Before the train-mode forward of accumulation micro-batch `index`.
  virtual void forward_begin(std::int64_t index) {}
  /// After that forward and its loss, before its backward.
  virtual void forward_end(std::int64_t index) {}
  /// After the backward of every micro-batch, before the optimizer step.
  virtual void backward_done() {}
  /// Before and after the EMA copy (training.ema) is made, once, after the optimizer.
  virtual void ema_begin() {}
  virtual void ema_end() {}
  /// After the optimizer step (and the EMA update), before zero_grad.
  virtual void optimizer_done() {}
  /// After zero_grad: the step is over, and what it allocated for itself is freed.
  virtual void step_done() {}
};

/// A workload's model, trainable parameters, optimizer and one batch on a device, ready to train.
///
///   memgate::TrainingStep step(fixture, 8, torch::kCPU);
///   step.warm_up(1);  // the probe's warm-up: eval forwards, then one whole step
///   step.run();       // a steady-state step
class TrainingStep {
 public:
  /// Builds the model on `device` (seeded), turns gradient checkpointing on where the training asks, freezes
  /// what does not train, makes one batch of `batch_size` (seed + 1) and the optimizer. Calls
  /// `observer->model_built()` right after the model is built. Throws memgate::Error for a batch size below 1.
  /// With `group` (one rank of a distributed workload), the model trains as DistributedDataParallel over the group
  /// (built after the trainable parameters are chosen, before the optimizer, as a training script does); every
  /// micro-batch but the last runs inside no_sync(), as gradient accumulation with DDP does. With strategy fsdp it
  /// trains as FSDP2's fully_shard (FullyShard): `observer->model_built()` then comes after sharding, and the
  /// optimizer steps the shards.
  TrainingStep(const Workload& workload, std::int64_t batch_size, c10::Device device, std::uint64_t seed = 0,
               StepObserver* observer = nullptr, const RankGroup* group = nullptr,
               const PythonRuntime* python = nullptr);
  ~TrainingStep();
  TrainingStep(const TrainingStep&) = delete;
  TrainingStep& operator=(const TrainingStep&) = delete;

  /// The protocol's warm-up before a measured step: two eval-mode, no-grad forwards under the training's
  /// autocast (the first creates workspaces and lazy handles), then `steps` whole steps, so that optimizer state,
  /// workspaces and caches exist; under fp16, more (at most 24) while the GradScaler skips the optimizer step.
  /// `observer`, if any, sees the eval forwards and every warm-up step.
  void warm_up(int steps, StepObserver* observer = nullptr);

  /// One whole step, from no gradients to no gradients: each accumulation micro-batch forward (under autocast)
  /// and backward, the optimizer step, then zero_grad(set_to_none). Under fp16 a GradScaler scales the loss,
  /// unscales the gradients before the step and updates its scale after. Queued device work is not waited for.
  void run(StepObserver* observer = nullptr);

  [[nodiscard]] Model& model() { return *model_; }
  [[nodiscard]] TrainingOptimizer& optimizer() { return *optimizer_; }
  [[nodiscard]] const Batch& batch() const { return batch_; }
  /// The DistributedDataParallel wrapper of a rank's step; null on one device.
  [[nodiscard]] const DataParallel* data_parallel() const { return ddp_.get(); }
  /// The fully_shard wrapper of a rank's step; null unless the strategy is fsdp.
  [[nodiscard]] const FullyShard* fully_shard() const { return fsdp_.get(); }
  /// FSDP2's CPUOffloadPolicy in an estimate for CUDA: the host memory of the shards, their gradients and the
  /// optimizer's state (the component host_state); null elsewhere.
  [[nodiscard]] EstimatedHostMemory* fsdp_host_memory() { return fsdp_host_.get(); }
  /// The offload of what the forward saves for backward (training.activation_offload); null where none.
  [[nodiscard]] ActivationOffloader* activation_offloader() { return offload_.get(); }
  /// Samples one step trains on: batch size x accumulation steps.
  [[nodiscard]] std::int64_t samples_per_step() const { return batch_size_ * training_.accumulation_steps; }

 private:
  /// The precision autocast runs in: the training's, fp32 under FSDP's mixed precision.
  [[nodiscard]] Precision autocast_precision() const;

  TrainingSpec training_;
  std::string source_;  // the fixture file, named by errors
  std::string loss_;    // what makes the loss (model.compute_loss ..., model.loss ..., the task's), named by errors
  std::int64_t batch_size_;
  c10::Device device_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<DataParallel> ddp_;
  std::unique_ptr<EstimatedHostMemory> fsdp_host_;  ///< fsdp_host_memory()
  std::unique_ptr<FullyShard> fsdp_;
  Batch batch_;
  std::unique_ptr<TrainingOptimizer> optimizer_;
  std::optional<GradScaler> scaler_;  ///< fp16 only, as fp16 training runs
  std::unique_ptr<ModelEma> ema_;     ///< training.ema only
  std::unique_ptr<ActivationOffloader> offload_;  ///< training.activation_offload only
};

}  // namespace memgate
