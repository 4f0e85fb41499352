// A user's nn.Module trained by memgate's C++ step, in a Python process that imported memgate._core.
#pragma once

#include "memgate/backend/meta_allocator.h"
#include "memgate/models/python.h"

#include <torch/csrc/utils/pybind.h>

#include <string>
#include <vector>

namespace memgate::python {

/// "Type: message", the last line of a Python error's traceback.
[[nodiscard]] std::string describe_python_error(const pybind11::error_already_set& e);

/// The model a Python fixture's callable builds, its parameters mirrored (the same tensors) in module(), its forward
/// called with the batch's inputs as positional arguments, its blocks (`blocks:`) run through run_block's
/// checkpointing and BlockHook. Errors of the user's code are memgate::Error with the Python error's last line.
class PythonModel final : public Model {
 public:
  PythonModel(const PythonOptions& spec, torch::Device device, std::uint64_t seed);
  ~PythonModel() override;
  PythonModel(const PythonModel&) = delete;
  PythonModel& operator=(const PythonModel&) = delete;

  torch::nn::Module& module() override { return *built_.root; }
  Batch make_batch(std::int64_t batch_size) override;
  torch::Tensor loss(const Batch& batch) override;
  torch::Tensor forward(const Batch& batch) override;
  // The task's loss of forward's first tensor (classify, regress), where no `loss:` function takes the whole output.
  bool splits_loss() const override;
  torch::Tensor loss_of_output(const Batch& batch, const torch::Tensor& output) override;
  [[nodiscard]] std::vector<std::string> block_prefixes() const override;
  [[nodiscard]] std::vector<std::string> head_prefixes() const override { return {}; }
  /// `training.optimizer: {class: ...}` or a callable: the Python optimizer, stepped in Python; else nullptr.
  [[nodiscard]] std::unique_ptr<OwnOptimizer> make_own_optimizer(const std::vector<torch::Tensor>& trainable) override;
  /// training.ema: copy.deepcopy(module).eval(), as timm's ModelEmaV3 makes its copy (every tensor the module holds,
  /// its parameters and buffers and any other), updated over the two state_dict()s' values.
  [[nodiscard]] std::unique_ptr<ModelEma> make_ema(double decay) override;

  /// PythonRuntime::reuse_builds (models/python.h): a build on the Meta device is kept for the next probe while reuse
  /// is on.
  static void reuse_builds(bool on);
  static void drop_reused_build();
  /// A build kept between probes (park): its Built, as a whole.
  struct Parked;

 private:
  struct Block {
    std::string name;
    pybind11::object module;
    torch::nn::Module* mirror = nullptr;
  };
  /// The build: the user's callables imported, the module built, mirrored and its blocks wrapped.
  void build();
  /// Takes the kept build of this model, if there is one: its record replayed, its flags as the build left them.
  bool take_parked();
  /// Keeps this build for the next probe, where it is as the build left it (no hook added, no gradient, every tensor
  /// it left alive and nothing more of its own): its blocks counted as freed.
  bool park();
  void find_blocks();
  void wrap_blocks();
  pybind11::object call(const Batch& batch);
  /// What compute_loss and the loss callable get as the batch: the `batch:` callable's value, else a namespace of
  /// the inputs (inputs: the positional ones, kwargs: the named ones, target: the target or None).
  pybind11::object python_batch(const Batch& batch) const;
  /// compute_loss(model, batch), checked: a one-element tensor, and no backward of its own.
  torch::Tensor run_compute_loss(const Batch& batch);
  /// The Python error as the probe reports it; on the Meta device, an op without a Meta kernel is named with the
  /// module whose forward called it (the innermost on the error's traceback: memgate._meta.module_of_error).
  [[noreturn]] void rethrow(pybind11::error_already_set& e) const;

  /// What a build made, all of which a kept build keeps: moved as one into Parked (park) and back (take_parked).
  struct Built {
    std::shared_ptr<torch::nn::Module> root;
    pybind11::object module;
    pybind11::object forward;  ///< the module, or torch.compile of it
    pybind11::object loss;
    pybind11::object batch_fn;         ///< model.batch, or None
    pybind11::object compute_loss_fn;  ///< model.compute_loss, or None
    pybind11::object optimizer_fn;     ///< training.optimizer's class or callable, or None
    std::vector<Block> blocks;
    /// functools.partial(create_selective_checkpoint_contexts, policy) under a selective policy
    /// (PythonOptions::checkpoint_save, checkpoint_policy), else None: the context_fn of each checkpointed block.
    pybind11::object checkpoint_context;
    /// The model whose checkpoint_selection() its wrapped blocks read, each when it runs (a kept build's blocks then
    /// read the next probe's model, whose selection may differ).
    std::shared_ptr<const Model*> selection_of;
    /// With reuse on: the build's record, and its flags and hooks as it left them (memgate._reuse).
    std::shared_ptr<CountingMetaAllocator::BuildRecord> record;
    pybind11::object flags;
    pybind11::object hooks;
  };

  PythonOptions spec_;
  torch::Device device_;
  Built built_;
  /// memgate._modules.Tracking over built_.module (CPU, not compiled): names the module that runs for the
  /// per-module breakdown; removed with the model.
  pybind11::object module_tracking_;
  std::uint64_t seed_ = 0;
};

}  // namespace memgate::python
