// One training step of a workload, with the hooks the probe reads the allocator at.
#include "memgate/measure/train_step.h"

#include "memgate/base/error.h"
#include "memgate/base/heartbeat.h"
#include "memgate/estimate/estimate_context.h"
#include "memgate/measure/activation_offload.h"
#include "memgate/models/autocast.h"
#include "memgate/models/python.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <optional>

namespace memgate {
namespace {

// The loss one micro-batch back-propagates: the task's loss under autocast in `autocast_in`, divided by the
// accumulation steps when there are several.
torch::Tensor micro_batch_loss(Model& model, const Batch& batch, const TrainingSpec& training, Precision autocast_in,
                               torch::DeviceType device_type) {
  torch::Tensor loss;
  {
    AutocastScope autocast(device_type, autocast_in);
    loss = model.loss(batch);
  }
  if (training.accumulation_steps > 1) loss = loss / static_cast<double>(training.accumulation_steps);
  return loss;
}

}  // namespace

void require_batch_size(const Workload& workload, std::int64_t batch_size) {
  if (batch_size < 1) {
    throw Error(workload.source + ": batch size " + std::to_string(batch_size) + ": expected an integer >= 1");
  }
}

TrainingStep::TrainingStep(const Workload& workload, std::int64_t batch_size, c10::Device device,
                           std::uint64_t seed, StepObserver* observer, const RankGroup* group,
                           const PythonRuntime* python)
    : training_(workload.training), source_(workload.source), batch_size_(batch_size), device_(device) {
  require_batch_size(workload, batch_size);
  loss_ = "the task's loss";
  if (const auto* py = std::get_if<PythonOptions>(&workload.model.options)) {
    if (!py->compute_loss.empty()) loss_ = "model.compute_loss " + py->compute_loss.text;
    else if (!py->loss.empty()) loss_ = "model.loss " + py->loss;
  }
  model_ = build_model(workload.model, device, seed, python);
  model_->set_gradient_checkpointing(training_.gradient_checkpointing);
  if (!training_.checkpoint_blocks.empty()) model_->set_checkpointed_blocks(training_.checkpoint_blocks, workload.source);
  const bool sharded = group != nullptr && training_.distributed.strategy == DistributedStrategy::kFsdp;
  // A rank of FSDP keeps its shards, not the model it was built from: its parameters are read once sharded.
  if (observer != nullptr && !sharded) observer->model_built();
  auto trainable = select_trainable(*model_, training_.trainable, workload.source);
  if (group != nullptr) {
    switch (training_.distributed.strategy) {
      case DistributedStrategy::kDdp:
        ddp_ = std::make_unique<DataParallel>(model_->module(), trainable, training_.distributed, *group);
        break;
      case DistributedStrategy::kFsdp: {
        // CPUOffloadPolicy in an estimate for CUDA: the shards are host memory, counted apart from the device's.
        std::optional<FullyShard::HostAllocators> host;
        if (training_.distributed.offload_policy != FsdpOffload::kNone && device.is_meta() &&
            estimate_context().target == EstimateTarget::kCuda) {
          fsdp_host_ = std::make_unique<EstimatedHostMemory>(training_.distributed.offload_policy ==
                                                             FsdpOffload::kCpuPinned);
          host = FullyShard::HostAllocators{.shards = fsdp_host_->allocator(), .pageable = fsdp_host_->pageable()};
        }
        fsdp_ = std::make_unique<FullyShard>(*model_, training_.distributed, training_.precision, *group, host);
        trainable = fsdp_->trainable_shards();
        if (observer != nullptr) observer->model_built();
        break;
      }
      default: throw Error(workload.source + ": training.distributed names no strategy to train over ranks with");
    }
  }
  torch::manual_seed(seed + 1);
  batch_ = model_->make_batch(batch_size);
  model_->module().train();
  // The optimizer allocates its state on the first step, not here (as torch.optim does). A Python fixture's own
  // optimizer (training.optimizer: {class: ...} or a callable) is made by its code, over the same parameters.
  if (auto own = model_->make_own_optimizer(trainable)) {
    optimizer_ = wrap_own_optimizer(std::move(own), std::move(trainable));
  } else {
    if (training_.own_optimizer) {
      throw Error(workload.source + ": training.optimizer names a Python optimizer, which only a Python model "
                  "(arch: python) makes");
    }
    // FSDP2's CPUOffloadPolicy in an estimate for CUDA: the shards are host tensors, which torch.optim steps as the
    // CPU's (its default there: the for-loop), its state on the host (the step below, in the host memory's scope).
    const bool host_shards = fsdp_host_ != nullptr;
    optimizer_ = make_optimizer(training_, std::move(trainable), host_shards ? c10::Device(c10::kCPU) : device);
  }
  // The EMA copy, made after the optimizer as timm's training script makes its ModelEmaV3.
  if (training_.ema_decay > 0.0) {
    if (observer != nullptr) observer->ema_begin();
    ema_ = model_->make_ema(training_.ema_decay);
    if (observer != nullptr) observer->ema_end();
  }
  if (training_.precision == Precision::kFp16) scaler_.emplace(device);
  if (training_.activation_offload != ActivationOffload::kNone) {
    if (device.is_meta() && python != nullptr) {
      throw Error(workload.source + ": training.activation_offload: an estimate of a Python model (arch: python) "
                  "does not model activation offload yet; expected a measurement: memgate profile --device cpu");
    }
    offload_ = std::make_unique<ActivationOffloader>(training_.activation_offload, workload.source, python);
  }
}

TrainingStep::~TrainingStep() = default;

// FSDP's mixed precision is its own policy (param_dtype), in place of autocast, as torchtitan trains.
Precision TrainingStep::autocast_precision() const { return fsdp_ ? Precision::kFp32 : training_.precision; }

void TrainingStep::warm_up(int steps, StepObserver* observer) {
  model_->module().eval();
  for (int pass = 0; pass < 2; ++pass) {
    torch::NoGradGuard no_grad;
    AutocastScope autocast(device_.type(), autocast_precision());
    if (observer != nullptr) observer->eval_begin(pass);
    if (ddp_) ddp_->pre_forward(/*sync=*/true);
    if (fsdp_) {
      const auto inputs = fsdp_->cast_forward_inputs(batch_);
      FullyShard::ForwardScope root(*fsdp_);
      (void)root.finish(model_->forward(inputs));
    } else {
      (void)model_->forward(batch_);
    }
    if (ddp_) ddp_->post_forward(/*sync=*/true);
    if (observer != nullptr) observer->eval_end(pass);
  }
  model_->module().train();
  for (int i = 0; i < steps; ++i) run(observer);
  // Under fp16 the scaler skips the optimizer while the scaled gradients overflow, halving its scale each time (fp16
  // gradients, as FSDP's fp16 param_dtype makes them, do at 65536): the warm-up goes on until a step is taken, so
  // that the optimizer's state exists, as it does a few steps into training. At most 24 more (the scale 2^-8).
  for (int extra = 0; scaler_ && scaler_->skipped_last_step() && extra < 24; ++extra) run(observer);
}

void TrainingStep::run(StepObserver* observer) {
  for (std::int64_t i = 0; i < training_.accumulation_steps; ++i) {
    if (observer != nullptr) observer->forward_begin(i);
    // DDP reduces gradients in the last micro-batch's backward only (the others run inside no_sync()).
    const bool sync = i + 1 == training_.accumulation_steps;
    if (ddp_) ddp_->pre_forward(sync);
    torch::Tensor loss;
    // save_on_cpu around the forward and the loss: what they save for backward is packed into host memory.
    std::optional<ActivationOffloader::Scope> offload;
    if (offload_) offload.emplace(*offload_);
    if (fsdp_) {
      // FSDP2 reduce-scatters every micro-batch's gradients (no set_requires_gradient_sync(False)).
      // The root's inputs cast before its pre-forward; they live as long as the forward (and the graph) keeps them.
      const auto inputs = fsdp_->cast_forward_inputs(batch_);
      FullyShard::ForwardScope root(*fsdp_);
      if (model_->splits_loss()) {
        // FSDP2's root post-forward runs when the root module's forward returns, before the loss: the last block's
        // all-gather buffer (and, resharding after forward, the root's unsharded parameters) are gone by then. The
        // output lives through the loss, as the training loop's `pred` does.
        const AutocastScope autocast(device_.type(), autocast_precision());
        const auto output = root.finish(model_->forward(inputs));
        loss = model_->loss_of_output(inputs, output);
        if (training_.accumulation_steps > 1) loss = loss / static_cast<double>(training_.accumulation_steps);
      } else {
        loss = root.finish(micro_batch_loss(*model_, inputs, training_, autocast_precision(), device_.type()));
      }
    } else {
      loss = micro_batch_loss(*model_, batch_, training_, autocast_precision(), device_.type());
    }
    offload.reset();
    if (ddp_) ddp_->post_forward(sync);
    if (observer != nullptr) observer->forward_end(i);
    if (!loss.requires_grad()) {  // trainable parameters, none of which the loss depends on
      throw Error(source_ + ": training.trainable: expected at least one trainable parameter that the loss depends "
                  "on, got none: '" + training_.trainable.str() + "' selects parameters the forward does not use" +
                  (loss_.starts_with("model.") ? ", or " + loss_ + " returned a loss detached from the model" : ""));
    }
    if (scaler_) loss = scaler_->scale(loss);
    {
      // DDP's Reducer all-reduces the gradients from backward's hooks and waits for them at its end: a rank stuck
      // there waits on a peer (launch/children.h names the peer).
      std::optional<ProgressSection> in_collective;
      if (ddp_ && sync) in_collective.emplace("in a collective: DDP's gradient all-reduces, in backward");
      loss.backward();
    }
    if (fsdp_) fsdp_->finish_backward();
  }
  // A loss that requires grad yet is not computed from the parameters (loss.detach().requires_grad_()) leaves every
  // trainable parameter without a gradient: that step trains nothing, and its gradients would be measured as 0 bytes.
  const auto& trainable = optimizer_->params();
  if (!trainable.empty() && std::none_of(trainable.begin(), trainable.end(),
                                         [](const torch::Tensor& p) { return p.grad().defined(); })) {
    throw Error(fmt::format("{} at batch {}: {} returned a loss that none of the {} trainable parameters' gradients "
                            "flow from: backward gave none of them a gradient; expected a loss computed from the "
                            "model's output (not detached from it)", source_, batch_size_, loss_, trainable.size()));
  }
  if (observer != nullptr) observer->backward_done();
  // Offloaded shards (an estimate for CUDA): what clipping and the optimizer allocate is host memory.
  std::optional<EstimatedHostMemory::Scope> on_host;
  if (fsdp_host_) on_host.emplace(*fsdp_host_);
  // Clipping, as a training loop calls clip_grad_norm_ (after scaler.unscale_ under fp16) before the optimizer step.
  if (training_.max_grad_norm > 0.0) {
    if (scaler_) scaler_->unscale(*optimizer_);
    clip_grad_norm(optimizer_->params(), training_.max_grad_norm);
  }
  if (scaler_) {
    scaler_->step(*optimizer_);
    scaler_->update();
  } else {
    optimizer_->step();
  }
  on_host.reset();
  // timm's loop: model_ema.update(model) after each optimizer step (a step the fp16 scaler skipped included).
  if (ema_) ema_->update();
  if (observer != nullptr) observer->optimizer_done();
  optimizer_->zero_grad();
  if (observer != nullptr) observer->step_done();
}

}  // namespace memgate
