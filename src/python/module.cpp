// memgate._core: memgate's C++ core as a Python extension module, built against the torch of the Python that
// imports it. Importing it lets this process build Python models (PythonModel); rank_main runs one probe or one rank
// of a fixture in this process, as a memgate program started with --memgate-rank does.
#include "python_model.h"

#include "memgate/advise/advise.h"

#include "memgate/backend/meta_allocator.h"
#include "memgate/backend/module_attribution.h"
#include "memgate/base/heartbeat.h"
#include "memgate/estimate/meta_kernels.h"
#include "memgate/gate/rank.h"
#include "memgate/measure/probe.h"

#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>

#include <string>
#include <vector>

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
  m.doc() = "memgate's C++ core: probes of Python models by memgate's own protocol";
  m.attr("__version__") = MEMGATE_VERSION;
  m.attr("TORCH_VERSION") = MEMGATE_BUILT_FOR_TORCH;
  memgate::set_python_model_factory([](const memgate::PythonOptions& options, torch::Device device,
                                       std::uint64_t seed) -> std::unique_ptr<memgate::Model> {
    return std::make_unique<memgate::python::PythonModel>(options, device, seed);
  });
  memgate::set_rank_search(&memgate::search_largest_batches_here);
  memgate::set_python_build_reuse({.enable = &memgate::python::PythonModel::reuse_builds,
                                    .drop = &memgate::python::PythonModel::drop_reused_build});
  // An earlier probe's model is freed by Python's collector, in reference cycles: collected before the next probe
  // reads its base, never inside its numbers.
  memgate::set_before_base_hook([] {
    py::gil_scoped_acquire gil;
    py::module_::import("gc").attr("collect")();
  });
  m.def("note_progress", &memgate::note_progress,
        "Tells the probe's supervisor that the work moved (a module imported): it ends a probe that makes none for "
        "its timeout.");
  m.def(
      "enter_module", [](const std::string& name) { memgate::enter_module(name); }, py::arg("name"),
      "The module whose forward runs from now on, by its dotted name: what the per-module breakdown names the bytes "
      "allocated next by (memgate._modules's hooks call it).");
  m.def("exit_module", &memgate::exit_module, "The module entered last has returned.");
  m.def(
      "register_meta_kernels", [] { memgate::use_meta_kernels_for(memgate::meta_kernels_target()); },
      "Registers memgate's own Meta kernels in this process (once; an estimate sets their target), before "
      "memgate._meta decides which of torch's Python Meta kernels an estimate keeps.");
  m.def(
      "uncounted",
      [](const py::function& fn, const py::args& args, const py::kwargs& kwargs) {
        const memgate::CountingMetaAllocator::UncountedScope uncounted;
        return fn(*args, **kwargs);
      },
      "fn(*args, **kwargs) with this thread's Meta tensors allocated outside the estimate's count: a decomposition "
      "standing in for a device kernel makes its temporaries so (memgate._meta).");
  m.def(
      "rank_main",
      [](const std::vector<std::string>& argv) {
        std::vector<std::string> args = argv;
        std::vector<char*> pointers;
        for (auto& a : args) pointers.push_back(a.data());
        pointers.push_back(nullptr);
        // The probe runs without the GIL; the model's Python code takes it for each call (autograd's threads too).
        py::gil_scoped_release release;
        return memgate::rank_main(static_cast<int>(args.size()), pointers.data());
      },
      py::arg("argv"),
      "Runs `<program> --memgate-rank --fixture F --batch-size B ...` in this process; returns its exit code.");
}
