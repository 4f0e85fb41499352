// A model of the user's own in Python: the fixture's keys (the callable that builds their nn.Module, its inputs and
// task) and what memgate's Python extension lends the probes it runs to build it (PythonRuntime). Only a Python process
// that imported memgate's extension (memgate._core) can build one; elsewhere a probe of it runs in such a process
// (launch/).
#pragma once

#include "memgate/models/model.h"
#include "memgate/models/torchscript.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace memgate {

/// A Python callable a fixture names, `<file.py or dotted.module>:<callable>` (as `entry` is).
struct PythonCallable {
  std::string text;      ///< as written
  std::string file;      ///< the resolved file, or empty for a dotted module
  std::string module;    ///< the dotted module, or empty for a file
  std::string callable;  ///< the callable's name in the file or module
  [[nodiscard]] bool empty() const { return text.empty(); }
};

/// A fixture's `model:` for `arch: python` (DESIGN.md).
struct PythonOptions {
  /// `<file.py or dotted.module>:<callable>`: a file is resolved against the fixture's folder (`entry_file` holds
  /// the resolved path), a dotted module is imported from the Python's own path.
  std::string entry;
  std::string entry_file;  ///< the resolved file, or empty for a dotted module
  std::string entry_module;  ///< the dotted module, or empty for a file
  std::string entry_callable;  ///< the callable's name in the file or module
  nlohmann::json args = nlohmann::json::object();  ///< keyword arguments of the callable
  std::vector<TorchScriptInput> inputs;  ///< one per positional argument of forward(); B is the batch size
  TorchScriptOptions::Task task = TorchScriptOptions::Task::kSum;
  std::int64_t num_classes = 0;  ///< classify only
  /// Optional `(output, batch) -> loss` in place of `task`, named as `entry` is (`loss_file` / `loss_module`).
  std::string loss;
  std::string loss_file;
  std::string loss_module;
  std::string loss_callable;
  /// Optional `batch: (batch_size, device, generator) -> tensor | tuple | list | dict` (nested), in place of
  /// `inputs`: a tensor goes to forward as model(t), a tuple or list as model(*b), a dict as model(**b).
  PythonCallable batch;
  /// Optional `compute_loss: (model, batch) -> scalar loss`, the loop's forward(s) and loss, in place of `task` and
  /// `loss`; also what the eval passes run (under no_grad).
  PythonCallable compute_loss;
  /// Optional `target:` beside `inputs` and a `loss` callable: a tensor made after the inputs, given to the loss as
  /// batch.target (not to forward).
  std::vector<TorchScriptInput> target;  ///< none or one
  /// `training.optimizer: {class: torch.optim.<Name>, ...kwargs}`: the class (dotted) and its keyword arguments,
  /// made over the trainable parameters; or `training.optimizer: file.py:callable`, `(model) -> optimizer`. Either is
  /// stepped in Python; neither: memgate's own (adamw | sgd).
  std::string optimizer_class;
  nlohmann::json optimizer_kwargs = nlohmann::json::object();
  PythonCallable optimizer;
  /// A module-name pattern (shell-style: `*` matches any run of characters, dots included): the outermost modules
  /// whose names match are the model's blocks, in module order (gradient checkpointing, last_blocks:N, FSDP units).
  std::string blocks;
  /// The Python that runs the model (the fixture's `python:`, a path resolved against the fixture's folder, or a name
  /// looked up on PATH); empty: MEMGATE_PYTHON, else python3.
  std::string python;
  std::string python_written;  ///< `python:` as the fixture writes it
  std::string python_key;      ///< where: "<fixture>:<line>: model.python", for errors

  /// Train the module as torch.compile(module) compiles it (the fixture's `training.compile`).
  bool compile = false;
  /// `training.gradient_checkpointing: {save: [...]}`: PyTorch's selective checkpointing of the checkpointed blocks,
  /// the outputs of these ops saved (`aten.mm`: each overload of the op; `aten.mm.default`: that one), the rest
  /// recomputed; or `{policy: ...}`, a callable (ctx, op, *args, **kwargs) -> CheckpointPolicy. Neither: memgate's
  /// own checkpointing of whole blocks.
  std::vector<std::string> checkpoint_save;
  PythonCallable checkpoint_policy;
  [[nodiscard]] bool selective_checkpointing() const { return !checkpoint_save.empty() || !checkpoint_policy.empty(); }
};

/// What memgate's Python extension (memgate._core) lends the probes it runs: passed to child/rank.h's rank_main, which
/// hands it down with the probe (ProbeOptions::python) to wherever a Python model is built, a probe reads its base or
/// an estimate ends. A process without it (nullptr) cannot build Python models: their probes run in a Python process
/// (launch/ranks.h, runs_in_python).
struct PythonRuntime {
  /// Builds a Python model on `device` with `seed`.
  std::function<std::unique_ptr<Model>(const PythonOptions& options, torch::Device device, std::uint64_t seed)> build;
  /// An estimate process's builds: with reuse on, a build on the Meta device is recorded and, when its probe ends, kept
  /// with the module as the build left it (CountingMetaAllocator's parked blocks); the next probe's build of the same
  /// model replays the record instead of running the builder (one built module serves every batch size of the
  /// process, and counts what building it anew would).
  std::function<void(bool on)> reuse_builds;
  /// Frees a kept module: between probes, when one left more allocated than it found.
  std::function<void()> drop_reused_build;
  /// Python's garbage collection, right before a probe reads its base: an earlier probe's model, freed by the
  /// collector in reference cycles, is collected there, never inside this probe's numbers.
  std::function<void()> collect_garbage;
  /// training.activation_offload where Python's autograd engine owns the saved-tensor hooks: enters PyTorch's own
  /// torch.autograd.graph.save_on_cpu(pin_memory) on this thread, its pack hook wrapped so that `packed` sees each
  /// tensor saved and what was packed for it; the function returned exits it.
  std::function<std::function<void()>(
      bool pin_memory, std::function<void(const torch::Tensor& saved, const torch::Tensor& packed)> packed)>
      save_on_cpu;
};

/// Builds the model with `python`'s factory; throws memgate::Error where `python` is nullptr (this process did not
/// import memgate's extension).
[[nodiscard]] std::unique_ptr<Model> make_python_model(const PythonOptions& options, torch::Device device,
                                                       std::uint64_t seed, const PythonRuntime* python);

}  // namespace memgate
