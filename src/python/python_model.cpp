// A user's nn.Module, built by their own Python code in this (Python) process and trained by memgate's C++
// TrainingStep: its parameters mirrored (the same tensors) as a torch::nn::Module, its forward called through
// pybind11, its blocks run through memgate's checkpointing and block hooks (FSDP's units).
#include "python_model.h"

#include "memgate/base/error.h"
#include "memgate/base/heartbeat.h"
#include "memgate/estimate/estimate_context.h"
#include "memgate/estimate/meta_kernels.h"
#include "memgate/models/checkpoint.h"
#include "memgate/models/task.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fnmatch.h>
#include <memory>
#include <optional>
#include <utility>
#include <set>
#include <unordered_set>

namespace py = pybind11;

namespace memgate::python {

std::string describe_python_error(const py::error_already_set& e) {
  py::gil_scoped_acquire gil;
  std::string type = "Error";
  try {
    type = py::str(e.type().attr("__name__")).cast<std::string>();
  } catch (const std::exception&) {
  }
  std::string message;
  try {
    message = py::str(e.value()).cast<std::string>();
  } catch (const std::exception&) {
  }
  // The Python error's last line, as a traceback ends: "ModuleNotFoundError: No module named 'x'".
  if (const auto nl = message.find('\n'); nl != std::string::npos) message = message.substr(0, nl);
  return message.empty() ? type : type + ": " + message;
}

namespace {

// The module tree of a Python nn.Module as torch::nn::Modules holding the same tensors (not copies), so that what
// reads module() (trainable selection, parameter counts, train()/eval()) sees the module's own parameters under their
// own dotted names. A tensor shared by two modules (tied weights) is registered once, at its first place in
// module order, as named_parameters() lists it.
class PyMirror : public torch::nn::Module {
 public:
  PyMirror(const py::handle& module, std::unordered_set<const c10::TensorImpl*>& seen) {
    for (const auto item : module.attr("named_parameters")(py::arg("recurse") = false)) {
      const auto pair = item.cast<py::tuple>();
      const auto tensor = pair[1].cast<at::Tensor>();
      if (!seen.insert(tensor.unsafeGetTensorImpl()).second) continue;
      register_parameter(pair[0].cast<std::string>(), tensor, tensor.requires_grad());
    }
    for (const auto item : module.attr("named_buffers")(py::arg("recurse") = false)) {
      const auto pair = item.cast<py::tuple>();
      const auto tensor = pair[1].cast<at::Tensor>();
      if (!seen.insert(tensor.unsafeGetTensorImpl()).second) continue;
      register_buffer(pair[0].cast<std::string>(), tensor);
    }
    for (const auto item : module.attr("named_children")()) {
      const auto pair = item.cast<py::tuple>();
      register_module(pair[0].cast<std::string>(), std::make_shared<PyMirror>(pair[1], seen));
    }
  }
};

class RootMirror final : public PyMirror {
 public:
  RootMirror(py::object module, std::unordered_set<const c10::TensorImpl*>& seen)
      : PyMirror(module, seen), module_(std::move(module)) {}
  ~RootMirror() override {
    py::gil_scoped_acquire gil;
    module_ = py::object();
  }
  void train(bool on) override {
    torch::nn::Module::train(on);
    py::gil_scoped_acquire gil;
    module_.attr("train")(on);
  }

 private:
  py::object module_;
};

void collect_tensors(const py::handle& value, std::vector<torch::Tensor>& out) {
  if (THPVariable_Check(value.ptr())) {
    out.push_back(value.cast<at::Tensor>());
  } else if (py::isinstance<py::tuple>(value) || py::isinstance<py::list>(value)) {
    for (const auto e : value) collect_tensors(e, out);
  } else if (py::isinstance<py::dict>(value)) {  // a dict, or transformers' ModelOutput (an OrderedDict)
    for (const auto e : value.cast<py::dict>()) collect_tensors(e.second, out);
  }
}

// The first tensor of a batch callable's value (nested tuples, lists and dicts) that is not on `device`: its path
// ("batch[1]", "batch[\"mask\"]") and its device; nothing when each is there.
std::optional<std::pair<std::string, std::string>> tensor_off_device(const py::handle& value, const c10::Device& device,
                                                                    const std::string& path) {
  if (THPVariable_Check(value.ptr())) {
    const auto on = value.cast<at::Tensor>().device();
    if (on.type() == device.type() && (!device.has_index() || !on.has_index() || on.index() == device.index())) {
      return std::nullopt;
    }
    return std::make_pair(path, on.str());
  }
  if (py::isinstance<py::tuple>(value) || py::isinstance<py::list>(value)) {
    std::size_t i = 0;
    for (const auto e : value) {
      if (auto off = tensor_off_device(e, device, fmt::format("{}[{}]", path, i++))) return off;
    }
  } else if (py::isinstance<py::dict>(value)) {
    for (const auto e : value.cast<py::dict>()) {
      const auto key = py::isinstance<py::str>(e.first) ? "\"" + e.first.cast<std::string>() + "\""
                                                         : py::repr(e.first).cast<std::string>();
      if (auto off = tensor_off_device(e.second, device, fmt::format("{}[{}]", path, key))) return off;
    }
  }
  return std::nullopt;
}

// One call of a block's original forward with the arguments it was given besides its first tensor: kept alive for
// the recomputation of a checkpointed block in backward. Its Python objects go with the GIL held.
// (Every member is a plain py::object, emptied under the GIL in the destructor: a typed one such as py::tuple() would
// make a new empty object there, released after the GIL is.)
struct BlockCall {
  py::object forward;
  py::object rest;    ///< a tuple
  py::object kwargs;  ///< a dict
  py::object extra;   ///< what the block returned after its first tensor (a tuple's tail), or None
  BlockCall(py::object f, py::object r, py::object k) : forward(std::move(f)), rest(std::move(r)), kwargs(std::move(k)) {}
  BlockCall(const BlockCall&) = delete;
  BlockCall& operator=(const BlockCall&) = delete;
  ~BlockCall() {
    py::gil_scoped_acquire gil;
    forward = py::object();
    rest = py::object();
    kwargs = py::object();
    extra = py::object();
  }
  torch::Tensor run(const torch::Tensor& x) {
    note_progress();  // each block's forward (and its recomputation) is progress
    py::gil_scoped_acquire gil;
    py::object out = forward(x, *rest, **kwargs);
    if (THPVariable_Check(out.ptr())) return out.cast<at::Tensor>();
    if (py::isinstance<py::tuple>(out)) {
      auto tuple = out.cast<py::tuple>();
      if (!tuple.empty() && THPVariable_Check(tuple[0].ptr())) {
        extra = tuple[py::slice(1, static_cast<py::ssize_t>(tuple.size()), 1)];
        return tuple[0].cast<at::Tensor>();
      }
    }
    throw Error("a block's forward returned " + py::str(py::type::of(out)).cast<std::string>() +
                ": memgate runs blocks that return a tensor, or a tuple whose first element is one");
  }
};

bool matches(const std::string& pattern, const std::string& name) {
  return ::fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

py::object import_callable(const std::string& file, const std::string& module, const std::string& callable,
                           const std::string& key, const std::string& entry) try {
  const ProgressSection section("importing the model's Python code (" + entry + ")");
  py::object target;
  if (!file.empty()) {
    // The file's folder on sys.path first, so that it imports its neighbours as the user's scripts do.
    const auto folder = std::filesystem::path(file).parent_path().string();
    auto sys_path = py::module_::import("sys").attr("path").cast<py::list>();
    if (!sys_path.contains(py::str(folder))) sys_path.insert(0, folder);
    const auto util = py::module_::import("importlib.util");
    const auto name = "memgate_fixture_" + std::filesystem::path(file).stem().string();
    const auto spec = util.attr("spec_from_file_location")(name, file);
    target = util.attr("module_from_spec")(spec);
    py::module_::import("sys").attr("modules")[py::str(name)] = target;
    spec.attr("loader").attr("exec_module")(target);
  } else {
    target = py::module_::import(module.c_str());
  }
  if (!py::hasattr(target, callable.c_str())) {
    throw Error(fmt::format("{}: '{}' has no attribute '{}'", key, file.empty() ? module : file, callable));
  }
  auto fn = target.attr(callable.c_str());
  if (!PyCallable_Check(fn.ptr())) throw Error(fmt::format("{}: '{}' is not callable", key, callable));
  return fn;
} catch (py::error_already_set& e) {
  throw Error(fmt::format("{} {}: {}", key, entry, describe_python_error(e)));
}

py::object import_callable(const PythonCallable& c, const std::string& key) {
  return import_callable(c.file, c.module, c.callable, key, c.text);
}

// `training.gradient_checkpointing: {save: [...]}` or `{policy: ...}`: the context_fn that torch.utils.checkpoint
// takes for PyTorch's selective checkpointing, functools.partial(create_selective_checkpoint_contexts, policy), where
// the policy is the OpOverloads the names give (`aten.mm`: every overload of torch.ops.aten.mm, as
// torch.ops.aten.mm.overloads() lists them; `aten.mm.default`: that one) or the fixture's callable.
py::object selective_context(const PythonOptions& spec) {
  const std::string key = "training.gradient_checkpointing.save";
  const auto torch_module = py::module_::import("torch");
  const auto checkpoint_module = py::module_::import("torch.utils.checkpoint");
  py::object policy;
  if (!spec.checkpoint_policy.empty()) {
    policy = import_callable(spec.checkpoint_policy, "training.gradient_checkpointing.policy");
  } else {
    py::list ops;
    const auto packet_type = py::module_::import("torch._ops").attr("OpOverloadPacket");
    const auto overload_type = py::module_::import("torch._ops").attr("OpOverload");
    for (const auto& name : spec.checkpoint_save) {
      const auto bare = name.starts_with("torch.ops.") ? name.substr(10) : name;
      std::vector<std::string> parts;
      for (std::size_t start = 0;;) {
        const auto dot = bare.find('.', start);
        parts.push_back(bare.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
        if (dot == std::string::npos) break;
        start = dot + 1;
      }
      // torch.ops makes a namespace of any name; its ops are looked up (and loaded) on first access.
      py::object packet;
      try {
        packet = torch_module.attr("ops").attr(parts[0].c_str()).attr(parts[1].c_str());
      } catch (py::error_already_set&) {
      }
      if (!packet || !py::isinstance(packet, packet_type)) {
        throw Error(fmt::format("{}: '{}' is not an op of torch.ops.{} (expected an op whose outputs are saved, as "
                                "torch.ops spells it, such as aten.mm, aten.addmm or aten.mm.default)",
                                key, name, parts[0]));
      }
      if (parts.size() == 3) {
        py::object overload;
        try {
          overload = packet.attr(parts[2].c_str());
        } catch (py::error_already_set&) {
        }
        if (!overload || !py::isinstance(overload, overload_type)) {
          throw Error(fmt::format("{}: '{}': torch.ops.{}.{} has no overload '{}' (its overloads: {})", key, name,
                                  parts[0], parts[1], parts[2],
                                  py::str(py::str(", ").attr("join")(packet.attr("overloads")())).cast<std::string>()));
        }
        ops.append(overload);
      } else {
        for (const auto o : packet.attr("overloads")()) ops.append(packet.attr(o.cast<std::string>().c_str()));
      }
    }
    policy = ops;
  }
  return py::module_::import("functools")
      .attr("partial")(checkpoint_module.attr("create_selective_checkpoint_contexts"), policy);
}

// The message of a step memgate does not measure: not one forward-loss-backward-step per micro-batch.
std::string not_one_step(const std::string& key, const std::string& what) {
  return fmt::format("{}: {}: memgate measures a step of one loss, one backward and one optimizer step per micro-batch "
                     "(the loss averaged over accumulation steps); a step with several losses back-propagated on "
                     "their own or several optimizers (a GAN's generator and discriminator) is not one it measures",
                     key, what);
}

std::string type_name(const py::handle& value) { return py::str(py::type::of(value)).cast<std::string>(); }

// A Python optimizer (torch.optim's or a third party's), stepped in Python.
class PythonOptimizer final : public OwnOptimizer {
 public:
  explicit PythonOptimizer(py::object optimizer) : optimizer_(std::move(optimizer)) {}
  ~PythonOptimizer() override {
    py::gil_scoped_acquire gil;
    optimizer_ = py::object();
  }
  PythonOptimizer(const PythonOptimizer&) = delete;
  PythonOptimizer& operator=(const PythonOptimizer&) = delete;
  void step() override {
    py::gil_scoped_acquire gil;
    try {
      optimizer_.attr("step")();
    } catch (py::error_already_set& e) {
      throw std::runtime_error("training.optimizer: step(): " + describe_python_error(e));
    }
  }
  void zero_grad() override {
    py::gil_scoped_acquire gil;
    try {
      optimizer_.attr("zero_grad")(py::arg("set_to_none") = true);
    } catch (py::error_already_set& e) {
      throw std::runtime_error("training.optimizer: zero_grad(): " + describe_python_error(e));
    }
  }

 private:
  py::object optimizer_;
};

}  // namespace

namespace {

bool g_reuse_builds = false;

// What a kept build is kept for: the same callable with the same arguments, device and seed.
std::string build_key(const PythonOptions& spec, torch::Device device, std::uint64_t seed) {
  return fmt::format("{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}", spec.entry, spec.entry_file, spec.args.dump(),
                     spec.loss, spec.batch.text, spec.compute_loss.text, spec.optimizer_class, spec.blocks,
                     device.str(), seed, fmt::join(spec.checkpoint_save, ","), spec.checkpoint_policy.text);
}

}  // namespace

// A build kept between the probes of an estimate process (PythonModel::park).
struct PythonModel::Parked {
  std::string key;
  Built built;
  Parked(std::string for_key, Built&& kept) : key(std::move(for_key)), built(std::move(kept)) {}
  Parked(const Parked&) = delete;
  Parked& operator=(const Parked&) = delete;
  ~Parked() {
    py::gil_scoped_acquire gil;
    auto& b = built;
    b.module = b.forward = b.loss = b.batch_fn = b.compute_loss_fn = b.optimizer_fn = b.flags = b.hooks = py::object();
    b.checkpoint_context = py::object();
    b.blocks.clear();
    b.root.reset();
  }
};

namespace {

std::unique_ptr<PythonModel::Parked>& parked_build() {
  static auto* parked = new std::unique_ptr<PythonModel::Parked>();  // never destroyed: Python may be gone at exit
  return *parked;
}

}  // namespace

void PythonModel::reuse_builds(bool on) {
  g_reuse_builds = on;
  if (!on) drop_reused_build();
}

void PythonModel::drop_reused_build() { parked_build().reset(); }

PythonModel::PythonModel(const PythonOptions& spec, torch::Device device, std::uint64_t seed)
    : spec_(spec), device_(device), seed_(seed) {
  built_.selection_of = std::make_shared<const Model*>(this);
  py::gil_scoped_acquire gil;
  // The user's modules' globals as the process's first build left them, before this build and after it (a step
  // counter of a loss's module, rebound by the probe before: memgate._reuse.settle).
  const auto reuse = py::module_::import("memgate._reuse");
  reuse.attr("settle")();
  if (take_parked()) {
    reuse.attr("settle")(built_.module);
    return;
  }
  // Kept for the next probe: a build on the Meta device of a model whose probe is memgate's step or torch.optim's
  // (a callable optimizer may register hooks on the parameters; a compiled module keeps its graphs).
  auto& meta = CountingMetaAllocator::install();
  if (g_reuse_builds && device.is_meta() && !spec.compile && spec.optimizer.empty()) {
    built_.record = meta.start_recording();
  }
  try {
    build();
  } catch (...) {
    if (built_.record) {
      meta.stop_recording();
      built_.record.reset();
    }
    throw;
  }
  if (built_.record) {
    meta.stop_recording();
    try {
      built_.flags = reuse.attr("flags_of")(built_.module);
      built_.hooks = reuse.attr("hooks_of")(built_.module);
    } catch (const py::error_already_set&) {
      built_.record.reset();  // not kept
    }
  }
  reuse.attr("settle")(built_.module);
}

bool PythonModel::take_parked() {
  auto& parked = parked_build();
  if (!parked) return false;
  if (!g_reuse_builds || parked->key != build_key(spec_, device_, seed_)) {
    parked.reset();
    return false;
  }
  CountingMetaAllocator::install().replay(*parked->built.record);
  built_ = std::move(parked->built);
  *built_.selection_of = this;
  parked.reset();
  py::module_::import("memgate._reuse").attr("restore_flags")(built_.flags);
  return true;
}

bool PythonModel::park() {
  try {
    const auto reuse = py::module_::import("memgate._reuse");
    if (!reuse.attr("hooks_of")(built_.module).equal(built_.hooks)) return false;
    // A forward that set an attribute (a call counter, a cached tensor): the next batch size builds anew.
    if (!reuse.attr("attributes_unchanged")(built_.module).cast<bool>()) return false;
  } catch (const py::error_already_set&) {
    return false;
  }
  if (!CountingMetaAllocator::install().park(*built_.record)) return false;
  parked_build() = std::make_unique<Parked>(build_key(spec_, device_, seed_), std::move(built_));
  return true;
}

void PythonModel::build() {
  const auto& spec = spec_;
  const auto device = device_;
  const auto seed = seed_;
  py::gil_scoped_acquire gil;
  const auto torch_module = py::module_::import("torch");
  auto build = import_callable(spec.entry_file, spec.entry_module, spec.entry_callable, "model.entry", spec.entry);
  if (!spec.loss.empty()) {
    built_.loss = import_callable(spec.loss_file, spec.loss_module, spec.loss_callable, "model.loss", spec.loss);
  }
  if (!spec.batch.empty()) built_.batch_fn = import_callable(spec.batch, "model.batch");
  if (!spec.compute_loss.empty()) built_.compute_loss_fn = import_callable(spec.compute_loss, "model.compute_loss");
  if (!spec.optimizer.empty()) built_.optimizer_fn = import_callable(spec.optimizer, "training.optimizer");
  if (!spec.optimizer_class.empty()) {
    const auto dot = spec.optimizer_class.rfind('.');
    const auto module = spec.optimizer_class.substr(0, dot), name = spec.optimizer_class.substr(dot + 1);
    try {
      const auto owner = py::module_::import("importlib").attr("import_module")(module);
      if (!py::hasattr(owner, name.c_str())) {
        throw Error(fmt::format("training.optimizer.class: '{}' has no attribute '{}'", module, name));
      }
      built_.optimizer_fn = owner.attr(name.c_str());
    } catch (py::error_already_set& e) {
      throw Error(fmt::format("training.optimizer.class {}: {}", spec.optimizer_class, describe_python_error(e)));
    }
  }
  try {
    const auto kwargs = py::module_::import("json").attr("loads")(spec.args.dump()).cast<py::dict>();
    torch_module.attr("manual_seed")(seed);
    // Parameters are created on the probe's device directly (torch.device as the default device of factory
    // functions: no CPU staging, and on the Meta device nothing is allocated); to() moves what was not. On the Meta
    // device the values a builder reads of what it computes from numbers are kept on the side
    // (memgate._meta.building_on): a drop-path schedule read with item() builds there as on the CPU.
    py::object module;
    {
      const auto on_device = py::module_::import("memgate._meta").attr("building_on")(device.str());
      on_device.attr("__enter__")();
      try {
        // The build is one call: it must end within the probe's timeout (its imports are progress, its own work is
        // not: a builder that waits for ever is ended).
        const ProgressSection section("in the model's Python build callable (" + spec.entry + ")");
        module = build(**kwargs);
      } catch (...) {
        on_device.attr("__exit__")(py::none(), py::none(), py::none());
        throw;
      }
      on_device.attr("__exit__")(py::none(), py::none(), py::none());
    }
    if (!py::isinstance(module, torch_module.attr("nn").attr("Module"))) {
      throw Error(fmt::format("model.entry: {} returned {}, expected a torch.nn.Module", spec.entry,
                              py::str(py::type::of(module)).cast<std::string>()));
    }
    module = module.attr("to")(device.str());
    // What the build left in reference cycles goes now, not whenever Python's collector next runs.
    py::module_::import("gc").attr("collect")();
    std::unordered_set<const c10::TensorImpl*> seen;
    built_.root = std::make_shared<RootMirror>(module, seen);
    built_.module = module;
    find_blocks();
    if (spec.selective_checkpointing()) built_.checkpoint_context = selective_context(spec);
    // A compiled module's blocks stay as they are: memgate's wrapper, a C++ function, would break the graph at each.
    if (!spec.compile) wrap_blocks();
    built_.forward = spec.compile ? torch_module.attr("compile")(built_.module) : built_.module;
    // Which module allocates what, for the per-module breakdown a failing component names (on the CPU, whose
    // allocator memgate counts; not under torch.compile, whose graph would break at each hook).
    if (device.is_cpu() && !spec.compile) {
      module_tracking_ = py::module_::import("memgate._modules").attr("track")(built_.module);
    }
  } catch (py::error_already_set& e) {
    throw Error(fmt::format("model.entry {}: {}", spec.entry, describe_python_error(e)));
  }
}

PythonModel::~PythonModel() {
  py::gil_scoped_acquire gil;
  if (built_.record && g_reuse_builds && !module_tracking_ && park()) return;
  if (module_tracking_) {
    try {
      module_tracking_.attr("remove")();
    } catch (const py::error_already_set&) {
      // A destructor does not throw; the hooks name modules of a model that is gone, which no later probe has.
    }
    module_tracking_ = py::object();
  }
  built_.forward = py::object();
  built_.flags = py::object();
  built_.hooks = py::object();
  built_.loss = py::object();
  built_.batch_fn = py::object();
  built_.compute_loss_fn = py::object();
  built_.optimizer_fn = py::object();
  built_.blocks.clear();
  built_.checkpoint_context = py::object();
  built_.module = py::object();
  // What the model held in reference cycles goes now, with the probe, not inside the next probe's measurement: the
  // fixture's own modules too (imported anew by each build as memgate_fixture_<stem>, whose globals would otherwise
  // be freed when the next build replaces them, inside that probe's numbers).
  try {
    auto modules = py::module_::import("sys").attr("modules").cast<py::dict>();
    std::vector<py::object> ours;
    for (const auto item : modules) {
      if (py::str(item.first).cast<std::string>().starts_with("memgate_fixture_")) {
        ours.push_back(py::reinterpret_borrow<py::object>(item.first));
      }
    }
    for (const auto& name : ours) modules.attr("pop")(name, py::none());
    py::module_::import("gc").attr("collect")();
  } catch (const py::error_already_set&) {
    // A destructor does not throw: an interpreter that cannot collect leaves the check after the probe to say so.
  }
}

void PythonModel::find_blocks() {
  if (spec_.blocks.empty()) return;
  std::vector<std::string> some;
  for (const auto item : built_.module.attr("named_modules")()) {
    const auto pair = item.cast<py::tuple>();
    const auto name = pair[0].cast<std::string>();
    if (some.size() < 8 && !name.empty()) some.push_back(name);
    if (name.empty() || !matches(spec_.blocks, name)) continue;
    // The outermost modules that match: "blocks.*" names blocks.0, not blocks.0.attn too.
    const bool inside = std::any_of(built_.blocks.begin(), built_.blocks.end(),
                                    [&](const Block& b) { return name.starts_with(b.name + "."); });
    if (!inside) built_.blocks.push_back({name, py::reinterpret_borrow<py::object>(pair[1]), nullptr});
  }
  if (built_.blocks.empty()) {
    std::string names;
    for (const auto& n : some) names += (names.empty() ? "" : ", ") + n;
    throw Error(fmt::format("model.blocks: the pattern '{}' matches no module of the model (its modules: {}{})",
                            spec_.blocks, names, some.size() == 8 ? ", ..." : ""));
  }
  const auto mirrors = built_.root->named_modules();
  for (auto& b : built_.blocks) {
    const auto* found = mirrors.find(b.name);
    if (found == nullptr) throw Error("model.blocks: module '" + b.name + "' has no parameters or buffers of its own");
    b.mirror = found->get();
  }
}

// Each block's forward, replaced by one that runs it as a zoo model runs its blocks (run_block): checkpointed where
// the model's checkpoint_selection() covers it (every block, or those `gradient_checkpointing: {blocks: [...]}`
// names), read at each call, and through the thread's BlockHook (FSDP's units) when one is installed.
void PythonModel::wrap_blocks() {
  for (auto& b : built_.blocks) {
    const py::object original = b.module.attr("forward");
    torch::nn::Module* mirror = b.mirror;
    const std::shared_ptr<const Model*> model = built_.selection_of;
    const std::string prefix = b.name + ".";
    const py::object context = built_.checkpoint_context;
    b.module.attr("forward") = py::cpp_function([original, mirror, model, prefix, context](py::args args,
                                                                                           py::kwargs kwargs) {
      if (args.empty() || !THPVariable_Check(args[0].ptr())) {
        throw Error("a block's forward takes its input tensor as its first positional argument");
      }
      if (context && (*model)->checkpoint_selection().covers(prefix)) {
        // PyTorch's selective checkpointing, as a user's loop calls it (the state of the CPU generator not kept, as
        // memgate's own checkpoint keeps none): its outputs, whatever they are, returned as they are.
        if (block_hook() != nullptr) {
          throw Error("training.gradient_checkpointing: a selective policy runs no block through FSDP's units");
        }
        note_progress();
        const py::cpp_function run([original](py::args a, py::kwargs k) {
          note_progress();  // the block's forward, and its recomputation in backward
          return original(*a, **k);
        });
        py::dict options(kwargs);
        options["use_reentrant"] = false;
        options["preserve_rng_state"] = false;
        options["context_fn"] = context;
        return py::module_::import("torch.utils.checkpoint").attr("checkpoint")(run, *args, **options);
      }
      const auto x = args[0].cast<at::Tensor>();
      auto call = std::make_shared<BlockCall>(original, args[py::slice(1, static_cast<py::ssize_t>(args.size()), 1)],
                                              py::dict(kwargs));
      const bool checkpointed = (*model)->checkpoint_selection().covers(prefix);
      torch::Tensor y;
      {
        py::gil_scoped_release release;
        auto forward = [call, checkpointed](const torch::Tensor& t) -> torch::Tensor {
          if (!checkpointed) return call->run(t);
          return checkpoint([call](const torch::Tensor& u) { return call->run(u); }, t);
        };
        if (auto* hook = block_hook()) y = hook->run(*mirror, x, forward);
        else y = forward(x);
      }
      if (call->extra && !call->extra.is_none()) {
        return py::object(py::make_tuple(y) + call->extra.cast<py::tuple>());
      }
      return py::cast(y);
    });
  }
}

Batch PythonModel::make_batch(std::int64_t batch_size) {
  if (!built_.batch_fn) {
    auto batch = make_task_batch(spec_.inputs, spec_.task, spec_.num_classes, device_, batch_size,
                                 [this](const Batch& b) { return forward(b); });
    // The loss callable's target, made after the inputs (as the task's is).
    if (!spec_.target.empty()) batch.target = make_input(spec_.target.front(), device_, batch_size);
    return batch;
  }
  py::gil_scoped_acquire gil;
  py::object value;
  try {
    const auto torch_module = py::module_::import("torch");
    // A generator seeded from the probe (seed + 1, as memgate's own batches are), on the device where it can be: the
    // CPU's for the CPU and the Meta device (which has none; a CPU generator draws nothing for Meta tensors).
    const auto generator =
        torch_module.attr("Generator")(py::arg("device") = device_.is_cuda() ? device_.str() : std::string("cpu"));
    generator.attr("manual_seed")(seed_ + 1);
    value = built_.batch_fn(batch_size, torch_module.attr("device")(device_.str()), generator);
  } catch (py::error_already_set& e) {
    throw Error(fmt::format("model.batch {}: {}", spec_.batch.text, describe_python_error(e)));
  }
  const bool tensor = THPVariable_Check(value.ptr()) != 0;
  if (!tensor && !py::isinstance<py::tuple>(value) && !py::isinstance<py::list>(value) &&
      !py::isinstance<py::dict>(value)) {
    throw Error(fmt::format("model.batch: {} returned {}, expected a tensor, a tuple, a list or a dict (nested)",
                            spec_.batch.text, type_name(value)));
  }
  // A callable that ignores its `device` argument would fail deep in the forward or in autograd ("expected device
  // meta but got cpu"): the tensor is named here, with where it is and where it was asked for.
  if (const auto off = tensor_off_device(value, device_, "batch")) {
    throw Error(fmt::format("model.batch: {} returned {} on {}, expected it on {} (the device argument it is called "
                            "with{}): make the batch's tensors on `device`",
                            spec_.batch.text, off->first, off->second, device_.str(),
                            device_.is_meta() ? ": an estimate runs the model on the Meta device" : ""));
  }
  Batch batch;
  collect_tensors(value, batch.inputs);
  batch.own = std::shared_ptr<void>(new py::object(std::move(value)), [](void* p) {
    py::gil_scoped_acquire gil;
    delete static_cast<py::object*>(p);
  });
  return batch;
}

py::object PythonModel::call(const Batch& batch) {
  const ProgressSection section("in the model's Python forward (" + spec_.entry + ")");
  if (batch.own) {
    // The batch callable's value: a tensor as model(t), a tuple or list as model(*b), a dict as model(**b).
    const auto& value = *static_cast<const py::object*>(batch.own.get());
    if (py::isinstance<py::dict>(value)) return built_.forward(**value);
    if (py::isinstance<py::tuple>(value) || py::isinstance<py::list>(value)) return built_.forward(*value);
    return built_.forward(value);
  }
  py::list args;
  py::dict kwargs;
  for (std::size_t i = 0; i < batch.inputs.size(); ++i) {
    if (i < batch.names.size() && !batch.names[i].empty()) kwargs[py::str(batch.names[i])] = py::cast(batch.inputs[i]);
    else args.append(py::cast(batch.inputs[i]));
  }
  return built_.forward(*args, **kwargs);
}

py::object PythonModel::python_batch(const Batch& batch) const {
  if (batch.own) return *static_cast<const py::object*>(batch.own.get());
  py::list inputs;
  py::dict kwargs;
  for (std::size_t i = 0; i < batch.inputs.size(); ++i) {
    if (i < batch.names.size() && !batch.names[i].empty()) kwargs[py::str(batch.names[i])] = py::cast(batch.inputs[i]);
    else inputs.append(py::cast(batch.inputs[i]));
  }
  return py::module_::import("types").attr("SimpleNamespace")(
      py::arg("inputs") = inputs, py::arg("kwargs") = kwargs,
      py::arg("target") = batch.target.defined() ? py::cast(batch.target) : py::none());
}

namespace {

// A loss that requires grad but was made by no op (a leaf: loss.detach().requires_grad_()) is computed from no
// parameter: backward would give none a gradient, and the step would be measured training nothing.
void require_from_model(const torch::Tensor& loss, const std::string& key, const std::string& what) {
  if (torch::GradMode::is_enabled() && loss.requires_grad() && loss.is_leaf()) {
    throw Error(fmt::format("{}: {} returned a loss detached from the model (a leaf tensor that requires grad, as "
                            "loss.detach().requires_grad_() makes: no trainable parameter would get a gradient): "
                            "expected the loss computed from the model's output, with its autograd graph",
                            key, what));
  }
}

}  // namespace

torch::Tensor PythonModel::run_compute_loss(const Batch& batch) {
  // A callable that runs backward itself leaves gradients where there were none: not a step memgate measures.
  const auto any_grad = [this] {
    for (const auto& p : built_.root->parameters()) {
      if (p.grad().defined()) return true;
    }
    return false;
  };
  const bool check = torch::GradMode::is_enabled() && !any_grad();
  py::object value;
  try {
    const ProgressSection section("in the model's Python compute_loss (" + spec_.compute_loss.text + ")");
    value = built_.compute_loss_fn(built_.forward, python_batch(batch));
  } catch (py::error_already_set& e) {
    // In the eval passes (no_grad) a callable that calls backward itself fails in torch: say what it is.
    const auto message = describe_python_error(e);
    if (!torch::GradMode::is_enabled() && message.find("does not require grad") != std::string::npos) {
      throw Error(not_one_step("model.compute_loss", spec_.compute_loss.text + " ran backward itself (in the eval "
                                                     "passes, under torch.no_grad(): " + message + "): return the loss "
                                                     "instead"));
    }
    throw;
  }
  if (py::isinstance<py::tuple>(value) || py::isinstance<py::list>(value) || py::isinstance<py::dict>(value)) {
    throw Error(not_one_step("model.compute_loss", fmt::format("{} returned {}, expected one scalar loss",
                                                               spec_.compute_loss.text, type_name(value))));
  }
  if (!THPVariable_Check(value.ptr())) {
    throw Error(fmt::format("model.compute_loss: {} returned {}, expected a scalar tensor (the loss)",
                            spec_.compute_loss.text, type_name(value)));
  }
  auto loss = value.cast<at::Tensor>();
  value = py::object();
  if (loss.numel() != 1) {
    throw Error(fmt::format("model.compute_loss: {} returned a tensor of shape {}, expected a scalar loss",
                            spec_.compute_loss.text, c10::str(loss.sizes())));
  }
  if (check && any_grad()) {
    throw Error(not_one_step("model.compute_loss", spec_.compute_loss.text + " ran backward itself (a parameter has a "
                                                   "gradient when it returns): return the loss instead"));
  }
  require_from_model(loss, "model.compute_loss", spec_.compute_loss.text);
  return loss;
}

torch::Tensor PythonModel::loss(const Batch& batch) {
  py::gil_scoped_acquire gil;
  try {
    if (built_.compute_loss_fn) return run_compute_loss(batch);
    py::object out = call(batch);
    if (built_.loss) {
      py::object value;
      {
        const ProgressSection section("in the model's Python loss (" + spec_.loss + ")");
        value = built_.loss(out, python_batch(batch));
      }
      out = py::object();
      if (!THPVariable_Check(value.ptr())) {
        throw Error(fmt::format("model.loss: {} returned {}, expected a scalar tensor", spec_.loss, type_name(value)));
      }
      auto loss = value.cast<at::Tensor>();
      require_from_model(loss, "model.loss", spec_.loss);
      return loss;
    }
    std::vector<torch::Tensor> tensors;
    collect_tensors(out, tensors);
    out = py::object();
    return task_loss(spec_.task, spec_.num_classes, tensors, batch, spec_.entry);
  } catch (py::error_already_set& e) {
    rethrow(e);
  }
}

bool PythonModel::splits_loss() const {
  return !built_.loss && !built_.compute_loss_fn && spec_.task != TorchScriptOptions::Task::kSum;
}

torch::Tensor PythonModel::loss_of_output(const Batch& batch, const torch::Tensor& output) {
  return task_loss(spec_.task, spec_.num_classes, {output}, batch, spec_.entry);
}

torch::Tensor PythonModel::forward(const Batch& batch) {
  py::gil_scoped_acquire gil;
  try {
    // With compute_loss, the eval passes run it: the loop's forward(s) and loss, under no_grad.
    if (built_.compute_loss_fn) return run_compute_loss(batch);
    std::vector<torch::Tensor> tensors;
    collect_tensors(call(batch), tensors);
    if (tensors.empty()) throw Error(spec_.entry + ": forward() returned no tensor");
    return tensors.front();
  } catch (py::error_already_set& e) {
    rethrow(e);
  }
}

void PythonModel::rethrow(py::error_already_set& e) const {
  // An error an op raised (an out-of-memory among them) comes back as the op's own message, which the probe reads.
  auto message = describe_python_error(e);
  // On the Meta device, an op whose output's size depends on data (nonzero, a read of values: memgate._meta's
  // data_dependent_op) or an op without a Meta kernel: named with the module whose forward called it.
  if (device_.is_meta()) {
    const auto meta = py::module_::import("memgate._meta");
    const bool data_dependent = !meta.attr("data_dependent_op")(message).cast<std::string>().empty();
    if (data_dependent || op_without_meta_kernel(message)) {
      std::string module;
      try {
        module = meta.attr("module_of_error")(built_.module, e.trace()).cast<std::string>();
      } catch (const std::exception&) {
        // Without the module: the op still names what failed.
      }
      message = data_dependent ? meta.attr("describe_data_dependent")(message, module).cast<std::string>()
                               : *describe_missing_meta_kernel(message, /*in_python=*/true, module);
    }
  }
  throw std::runtime_error(message);
}

std::unique_ptr<OwnOptimizer> PythonModel::make_own_optimizer(const std::vector<torch::Tensor>& trainable) {
  if (!built_.optimizer_fn) return nullptr;
  py::gil_scoped_acquire gil;
  const auto what = spec_.optimizer_class.empty() ? spec_.optimizer.text : spec_.optimizer_class;
  py::object optimizer;
  try {
    if (!spec_.optimizer_class.empty()) {
      // The class over the trainable parameters (the module's own Parameter objects), with the fixture's keywords.
      py::list params;
      for (const auto& p : trainable) params.append(py::cast(p));
      const auto kwargs = py::module_::import("json").attr("loads")(spec_.optimizer_kwargs.dump()).cast<py::dict>();
      optimizer = built_.optimizer_fn(params, **kwargs);
    } else {
      optimizer = built_.optimizer_fn(built_.module);
    }
  } catch (py::error_already_set& e) {
    throw Error(fmt::format("training.optimizer {}: {}", what, describe_python_error(e)));
  }
  if (py::isinstance<py::tuple>(optimizer) || py::isinstance<py::list>(optimizer)) {
    throw Error(not_one_step("training.optimizer", fmt::format("{} returned {}, expected one optimizer", what,
                                                               type_name(optimizer))));
  }
  if (!py::hasattr(optimizer, "step") || !py::hasattr(optimizer, "zero_grad")) {
    throw Error(fmt::format("training.optimizer: {} returned {}, expected an optimizer (with step() and zero_grad())",
                            what, type_name(optimizer)));
  }
  // An estimate for CUDA runs on the Meta device, where torch.optim's default is its per-parameter loop; on CUDA it is
  // foreach (_default_to_fused_or_foreach), whose temporaries are part of the step's peak: the groups that leave it to
  // the default take foreach, as on the GPU.
  if (device_.is_meta() && estimate_context().target == EstimateTarget::kCuda &&
      py::hasattr(optimizer, "param_groups")) {
    try {
      for (auto group : optimizer.attr("param_groups")) {
        auto g = group.cast<py::dict>();
        const bool fused = g.contains("fused") && py::bool_(g["fused"]);
        if (g.contains("foreach") && g["foreach"].is_none() && !fused) g["foreach"] = true;
      }
    } catch (py::error_already_set& e) {
      throw Error(fmt::format("training.optimizer {}: {}", what, describe_python_error(e)));
    }
  }
  return std::make_unique<PythonOptimizer>(std::move(optimizer));
}

std::unique_ptr<ModelEma> PythonModel::make_ema(double decay) {
  py::gil_scoped_acquire gil;
  try {
    // (Its buffers' storages are copied through torch.UntypedStorage, which memgate's probe counts on the CPU too:
    // python/memgate/_probe.py, _count_cpu_storage_copies.)
    auto copy = py::module_::import("copy").attr("deepcopy")(built_.module);
    copy.attr("eval")();
    std::vector<torch::Tensor> model, ema;
    for (const auto& v : built_.module.attr("state_dict")().attr("values")()) model.push_back(v.cast<torch::Tensor>());
    for (const auto& v : copy.attr("state_dict")().attr("values")()) ema.push_back(v.cast<torch::Tensor>());
    // The copy lives as long as the EMA; it goes with the GIL held.
    auto* held = new py::object(std::move(copy));
    std::shared_ptr<void> keep_alive(held, [](void* p) {
      py::gil_scoped_acquire again;
      delete static_cast<py::object*>(p);
    });
    return std::make_unique<ModelEma>(std::move(model), std::move(ema), decay, std::move(keep_alive));
  } catch (py::error_already_set& e) {
    throw Error(fmt::format("training.ema: copy.deepcopy of the model (as timm's ModelEmaV3 makes its copy): {}",
                            describe_python_error(e)));
  }
}

std::vector<std::string> PythonModel::block_prefixes() const {
  std::vector<std::string> out;
  for (const auto& b : built_.blocks) out.push_back(b.name + ".");
  return out;
}

}  // namespace memgate::python
