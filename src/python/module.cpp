// memgate._core: memgate's C++ core as a Python extension module, built against the torch of the Python that
// imports it. Its rank_main runs one probe, one rank or one search of a fixture in this process, as a memgate program
// started with --memgate-rank does, and lends it what builds Python models (PythonModel: python_runtime below).
#include "python_model.h"

#include "memgate/backend/cpu_allocator.h"
#include "memgate/backend/meta_allocator.h"
#include "memgate/backend/module_attribution.h"
#include "memgate/base/files.h"
#include "memgate/base/heartbeat.h"
#include "memgate/child/rank.h"
#include "memgate/estimate/estimate_context.h"
#include "memgate/estimate/meta_kernels.h"
#include "memgate/measure/probe.h"

#include <nlohmann/json.hpp>
#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace py = pybind11;

namespace {

// Whether the probe `argv` asks for (`--memgate-rank --request FILE`: launch/request.h) is an estimate on the Meta
// device: memgate._meta then sets this Python up for it before rank_main runs it. A request that cannot be read is
// rank_main's to name.
bool requests_an_estimate(const std::vector<std::string>& argv) {
  for (std::size_t i = 2; i + 1 < argv.size(); i += 2) {
    if (argv[i] != "--request") continue;
    try {
      const auto j = nlohmann::json::parse(memgate::read_text_file(argv[i + 1], "a probe's request"));
      return j.is_object() && j.contains("estimate") && !j.at("estimate").is_null();
    } catch (const std::exception&) {
      return false;
    }
  }
  return false;
}

// Every allocation and free of the CPU's counting allocator and of the Meta device's while it records, in their order
// (tools/conformance.py compares an op's bytes on the CPU with its estimate's). One recorder at a time: it takes both
// allocators' observers, which no probe holds in a process that records.
class AllocationRecorder final {
 public:
  // (device, bytes: + allocated, - freed, block id): the CPU's block is its data pointer, the Meta device's its id.
  using Event = std::tuple<std::string, std::int64_t, std::uint64_t>;

  AllocationRecorder() = default;
  AllocationRecorder(const AllocationRecorder&) = delete;
  AllocationRecorder& operator=(const AllocationRecorder&) = delete;
  ~AllocationRecorder() {
    if (started_) stop();
  }
  void start() {
    started_ = true;
    {
      const std::lock_guard lock(mutex_);
      events_.clear();
    }
    memgate::CountingCpuAllocator::install().set_observer(&cpu_);
    memgate::CountingMetaAllocator::install().set_observer(&meta_);
  }
  void stop() {
    started_ = false;
    memgate::CountingCpuAllocator::install().set_observer(nullptr);
    memgate::CountingMetaAllocator::install().set_observer(nullptr);
  }
  [[nodiscard]] std::size_t count() const {
    const std::lock_guard lock(mutex_);
    return events_.size();
  }
  [[nodiscard]] std::vector<Event> events() const {
    const std::lock_guard lock(mutex_);
    std::vector<Event> out;
    out.reserve(events_.size());
    for (const auto& e : events_) out.emplace_back(e.meta ? "meta" : "cpu", e.bytes, e.id);
    return out;
  }

 private:
  struct Raw {
    bool meta;
    std::int64_t bytes;
    std::uint64_t id;
  };
  void add(bool meta, std::int64_t bytes, std::uint64_t id) {
    const std::lock_guard lock(mutex_);
    events_.push_back({meta, bytes, id});
  }
  // Called with the allocators' locks held: they allocate no tensor.
  struct Cpu final : memgate::CountingCpuAllocator::Observer {
    explicit Cpu(AllocationRecorder& r) : r(r) {}
    void on_alloc(const void* data, std::size_t bytes) override {
      r.add(false, static_cast<std::int64_t>(bytes), reinterpret_cast<std::uintptr_t>(data));
    }
    void on_free(const void* data, std::size_t bytes) override {
      r.add(false, -static_cast<std::int64_t>(bytes), reinterpret_cast<std::uintptr_t>(data));
    }
    AllocationRecorder& r;
  };
  struct Meta final : memgate::CountingMetaAllocator::Observer {
    explicit Meta(AllocationRecorder& r) : r(r) {}
    void on_alloc(std::uint64_t id, std::size_t bytes, std::uint64_t) override {
      r.add(true, static_cast<std::int64_t>(bytes), id);
    }
    void on_free(std::uint64_t id, std::size_t bytes) override { r.add(true, -static_cast<std::int64_t>(bytes), id); }
    AllocationRecorder& r;
  };
  mutable std::mutex mutex_;
  std::vector<Raw> events_;
  bool started_ = false;
  Cpu cpu_{*this};
  Meta meta_{*this};
};

// What this extension lends the probes rank_main runs in this process (models/python.h): Python models built as
// PythonModel, an estimate's builds reused, and Python's collector run before each probe reads its base (an earlier
// probe's model is freed by it, in reference cycles: collected there, never inside the next probe's numbers).
const memgate::PythonRuntime& python_runtime() {
  static const memgate::PythonRuntime runtime{
      .build = [](const memgate::PythonOptions& options, torch::Device device,
                  std::uint64_t seed) -> std::unique_ptr<memgate::Model> {
        return std::make_unique<memgate::python::PythonModel>(options, device, seed);
      },
      .reuse_builds = &memgate::python::PythonModel::reuse_builds,
      .drop_reused_build = &memgate::python::PythonModel::drop_reused_build,
      .collect_garbage =
          [] {
            py::gil_scoped_acquire gil;
            py::module_::import("gc").attr("collect")();
          },
      // PyTorch's save_on_cpu itself, entered on the forward's thread; its pack hook, wrapped, shows memgate each
      // packed copy (whose bytes it counts), and the hooks object is let go under the GIL.
      .save_on_cpu =
          [](bool pin_memory, std::function<void(const torch::Tensor&, const torch::Tensor&)> packed)
          -> std::function<void()> {
        py::gil_scoped_acquire gil;
        auto* hooks = new py::object(
            py::module_::import("torch.autograd.graph").attr("save_on_cpu")(py::arg("pin_memory") = pin_memory));
        py::object pack = hooks->attr("pack_hook");
        hooks->attr("pack_hook") = py::cpp_function([pack, packed](const py::object& tensor) {
          py::object result = pack(tensor);
          packed(tensor.cast<torch::Tensor>(), py::tuple(result)[1].cast<torch::Tensor>());
          return result;
        });
        hooks->attr("__enter__")();
        return [hooks] {
          py::gil_scoped_acquire gil;
          hooks->attr("__exit__")(py::none(), py::none(), py::none());
          delete hooks;
        };
      },
  };
  return runtime;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "memgate's C++ core: probes of Python models by memgate's own protocol";
  m.attr("__version__") = MEMGATE_VERSION;
  m.attr("TORCH_VERSION") = MEMGATE_BUILT_FOR_TORCH;
  m.def("note_progress", &memgate::note_progress,
        "Tells the probe's supervisor that the work moved (a module imported): it ends a probe that makes none for "
        "its timeout.");
  m.def(
      "enter_module", [](const std::string& name) { memgate::enter_module(name); }, py::arg("name"),
      "The module whose forward runs from now on, by its dotted name: what the per-module breakdown names the bytes "
      "allocated next by (memgate._modules's hooks call it).");
  m.def("exit_module", &memgate::exit_module, "The module entered last has returned.");
  m.def(
      "register_meta_kernels", [] { memgate::register_meta_kernels(); },
      "Registers memgate's own Meta kernels in this process (once; they follow the estimate context of the thread "
      "that runs them, which an estimate sets), before "
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
      "count_cpu_allocations", [] { memgate::CountingCpuAllocator::install(); },
      "Installs memgate's counting CPU allocator in this process (as a CPU probe does): CPU tensors allocated from now "
      "on are counted, and an AllocationRecorder sees them.");
  m.def(
      "estimate_for_cpu",
      [] {
        auto& meta = memgate::CountingMetaAllocator::install();
        meta.set_granularity(0);
        meta.model_caching_allocator(false);
        // No EstimateContextGuard around the caller: the kernels speak for the CPU's portable ones, the default.
        memgate::register_meta_kernels();
      },
      "Sets the Meta device up as an estimate for the CPU sets it (its portable kernels): each request counted as it "
      "is, no caching allocator's model, memgate's Meta kernels allocating what the CPU's do.");
  py::class_<AllocationRecorder>(m, "AllocationRecorder",
                                 "Records every allocation and free of memgate's counting CPU allocator and of the "
                                 "Meta device's from start() to stop(), in order: events() is a list of (device, "
                                 "bytes, block), bytes negative for a free (tools/conformance.py).")
      .def(py::init<>())
      .def("start", &AllocationRecorder::start, "Forgets what it recorded and records from now on.")
      .def("stop", &AllocationRecorder::stop)
      .def("count", &AllocationRecorder::count, "The number of events recorded so far.")
      .def("events", &AllocationRecorder::events);
  m.def(
      "rank_main",
      [](const std::vector<std::string>& argv) {
        std::vector<std::string> args = argv;
        std::vector<char*> pointers;
        for (auto& a : args) pointers.push_back(a.data());
        pointers.push_back(nullptr);
        // An estimate: torch's Python Meta kernels that memgate._meta keeps (its registrations last while `kept`
        // does) and autocast on the Meta device.
        py::object kept;
        if (requests_an_estimate(args)) {
          const auto meta = py::module_::import("memgate._meta");
          kept = meta.attr("prefer_libtorch_meta_kernels")();
          meta.attr("autocast_on_meta")();
        }
        // The probe runs without the GIL; the model's Python code takes it for each call (autograd's threads too).
        py::gil_scoped_release release;
        return memgate::rank_main(static_cast<int>(args.size()), pointers.data(), &python_runtime());
      },
      py::arg("argv"),
      "Runs `<program> --memgate-rank --request FILE` (launch/request.h) in this process; returns its exit code. For "
      "an estimate it sets memgate._meta up first.");
}
