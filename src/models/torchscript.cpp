// TorchScript models: a module saved from Python, trained through the TorchScript interpreter.
#include "memgate/models/torchscript.h"

#include "memgate/base/error.h"
#include "memgate/models/task.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"  // in LibTorch's flat hash map, which jit headers include
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/script.h>
#pragma GCC diagnostic pop
#include <torch/torch.h>

#include <filesystem>

namespace memgate {
namespace {

// The module tree of a TorchScript module as torch::nn::Modules holding the same tensors (not copies), so that
// what reads module() (trainable selection, parameter counts, train()/eval()) sees the TorchScript module's own
// parameters under their own dotted names.
class MirrorModule : public torch::nn::Module {
 public:
  explicit MirrorModule(const torch::jit::Module& source) {
    for (const auto& p : source.named_parameters(/*recurse=*/false)) {
      register_parameter(p.name, p.value, p.value.requires_grad());
    }
    for (const auto& b : source.named_buffers(/*recurse=*/false)) register_buffer(b.name, b.value);
    for (const auto& child : source.named_children()) {
      register_module(child.name, std::make_shared<MirrorModule>(child.value));
    }
  }
};

class RootMirror : public MirrorModule {
 public:
  explicit RootMirror(torch::jit::Module module) : MirrorModule(module), module_(std::move(module)) {}
  void train(bool on) override {
    torch::nn::Module::train(on);
    module_.train(on);
  }
  torch::jit::Module& scripted() { return module_; }

 private:
  torch::jit::Module module_;
};

void collect_tensors(const c10::IValue& value, std::vector<torch::Tensor>& out) {
  if (value.isTensor()) {
    out.push_back(value.toTensor());
  } else if (value.isTuple()) {
    for (const auto& e : value.toTupleRef().elements()) collect_tensors(e, out);
  } else if (value.isList()) {
    for (const auto& e : value.toListRef()) collect_tensors(e, out);
  } else if (value.isGenericDict()) {
    for (const auto& e : value.toGenericDict()) collect_tensors(e.value(), out);
  }
}

// Replaces every parameter and buffer of `module` and its submodules with a copy on `device` (Module::to cannot
// go from the CPU to Meta: it keeps each tensor object and swaps its data, which needs one tensor type).
void move_tensors(torch::jit::Module& module, torch::Device device) {
  for (auto m : module.modules()) {
    for (const auto& p : m.named_parameters(/*recurse=*/false)) {
      m.setattr(p.name, p.value.detach().to(device).requires_grad_(p.value.requires_grad()));
    }
    for (const auto& b : m.named_buffers(/*recurse=*/false)) m.setattr(b.name, b.value.to(device));
  }
}

class TorchScriptModel final : public Model {
 public:
  TorchScriptModel(const TorchScriptOptions& spec, torch::Device device) : spec_(spec), device_(device) {
    // Each op as in eager PyTorch: no fused or autodiff subgraphs, whose saved tensors differ.
    torch::jit::setGraphExecutorOptimize(false);
    torch::jit::Module module;
    try {
      // Without the source-range debug records: host bytes about the Python source that would otherwise stay
      // allocated beside the parameters (26 KB for a tiny ViT) and are no part of training.
      //
      // For the Meta device the module is read onto the CPU and only its parameters and buffers move to Meta:
      // a traced module keeps tensor constants in its graph (the sizes and scalars it divided by, as 0-dim
      // tensors), which must keep their values (the loader compares them, and `int(size * c)` reads them). On a
      // real device they go with the module, as `torch.jit.load(map_location=...)` puts them.
      module = torch::jit::load(spec.path, device.is_meta() ? torch::Device(torch::kCPU) : device,
                                /*load_debug_files=*/false);
      if (device.is_meta()) move_tensors(module, device);
    } catch (const std::exception& e) {
      throw Error(spec.path + ": cannot load a TorchScript module (saved with torch.jit.save from "
                  "torch.jit.script or torch.jit.trace?): " + first_line(e.what()));
    }
    root_ = std::make_shared<RootMirror>(std::move(module));
  }

  torch::nn::Module& module() override { return *root_; }

  Batch make_batch(std::int64_t batch_size) override {
    return make_task_batch(spec_.inputs, spec_.task, spec_.num_classes, device_, batch_size,
                           [this](const Batch& b) { return output_tensor(run(b), "regress"); });
  }

  torch::Tensor loss(const Batch& batch) override {
    std::vector<torch::Tensor> tensors;
    collect_tensors(run(batch), tensors);
    return task_loss(spec_.task, spec_.num_classes, tensors, batch, spec_.path);
  }

  torch::Tensor forward(const Batch& batch) override { return output_tensor(run(batch), "forward"); }

  std::vector<std::string> block_prefixes() const override { return {}; }
  std::vector<std::string> head_prefixes() const override { return {}; }

 private:
  static std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

  c10::IValue run(const Batch& batch) {
    // Errors (an out-of-memory among them) propagate as LibTorch raised them: the probe tells them apart.
    std::vector<c10::IValue> args(batch.inputs.begin(), batch.inputs.end());
    return root_->scripted().forward(args);
  }

  torch::Tensor output_tensor(const c10::IValue& out, const char* what) const {
    std::vector<torch::Tensor> tensors;
    collect_tensors(out, tensors);
    if (tensors.empty()) throw Error(spec_.path + ": " + what + ": forward() returned no tensor");
    return tensors.front();
  }

  TorchScriptOptions spec_;
  torch::Device device_;
  std::shared_ptr<RootMirror> root_;
};

}  // namespace

std::unique_ptr<Model> make_torchscript_model(const TorchScriptOptions& spec, torch::Device device) {
  return std::make_unique<TorchScriptModel>(spec, device);
}

}  // namespace memgate
