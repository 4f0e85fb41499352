// memgate_bench: the time and peak memory of one training step, for every probe of the suites the tests run
// (fixtures/suites/cpu.yaml and gpu.yaml), as Google Benchmark cases:
//
//   BM_TrainStep/fixture:vit_tiny_lora/bs:8/real_time             CPU: wall time
//   BM_TrainStep/gpu/fixture:retfound_large_lora/bs:32/manual_time  GPU: CUDA events around each step
//
// One iteration is one whole step (TrainingStep::run: every accumulation micro-batch, the optimizer step,
// zero_grad). The model is built and warmed up outside the timed region, once per case (later repetitions reuse
// it). Memory: a MemoryManager reports the step's peak allocated bytes as `max_bytes_used` (above what was
// allocated before the model was built, as the probe's step_peak), and each case has the counters
// peak_allocated_MiB, peak_reserved_MiB and samples_per_second. GPU cases skip with an error where no GPU is
// present.
//
//   BM_Reference/cpu/real_time, BM_Reference/gpu/manual_time       the machine's speed (see Reference)
//
// Run the cases with --benchmark_enable_random_interleaving=true and --memgate_processes=N (the bench presets
// do): each case's repetitions are then spread over the whole run and over N processes, so their spread includes
// the machine's drift during the run and the differences between processes (see run_in_processes).
#include "memgate/bench/bench_compare.h"
#include "memgate/backend/cpu_allocator.h"
#include "memgate/backend/device.h"
#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/base/process.h"
#include "memgate/gate/fixture.h"
#include "memgate/backend/memory_backend.h"
#include "memgate/measure/probe.h"
#include "memgate/gate/suite.h"
#include "memgate/measure/train_step.h"

#include <benchmark/benchmark.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
/// Full steps before the machine reference's timed ones.
constexpr int kReferenceWarmupSteps = 2;

// Allocations so far on a device (the counting CPU allocator, or CUDA's caching allocator's count).
std::int64_t allocation_count(c10::Device device) {
  if (device.is_cpu()) return memgate::CountingCpuAllocator::install().allocation_count();
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
  return stats.allocation[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)].allocated;
}

// What the last run of a case measured: its steps' peaks and allocations. Filled by the case, read by the
// memory manager's Stop and by the case's counters.
struct StepMemory {
  std::int64_t peak_allocated = 0;  // bytes, above what was allocated before the model was built
  std::int64_t peak_reserved = 0;
  std::int64_t allocations = 0;     // during the timed steps
};
std::optional<StepMemory> g_last_steps;
std::string g_current_case;  // the registered name of the case that ran last

// Reports the peak allocated bytes of the steps of a case (benchmark 1.7.1 runs each case once more between
// Start and Stop for it, with up to 16 iterations, after each repetition).
//
// It also keeps every result: benchmark 1.7.1 reports a run's memory through a pointer into a std::vector that
// grows with each repetition, so all but the last repetitions would print freed memory (max_bytes_used: 9).
// StableMemoryReporter points the runs at these copies instead.
class StepMemoryManager final : public benchmark::MemoryManager {
 public:
  void Start() override {
    g_last_steps.reset();
    memgate::make_memory_backend(c10::Device(c10::DeviceType::CPU))->reset_peak();
    if (memgate::cuda_available()) memgate::make_memory_backend(memgate::resolve_device("cuda"))->reset_peak();
  }
  void Stop(Result& result) override {
    if (g_last_steps) {  // else the case was skipped
      result.max_bytes_used = g_last_steps->peak_allocated;
      result.num_allocs = g_last_steps->allocations;
    }
    results_[g_current_case].push_back(result);
  }
  // benchmark 1.7.1 still declares the deprecated pointer overload pure virtual.
  void Stop(Result* result) override { Stop(*result); }

  // The result of a case's repetition, or nullptr.
  [[nodiscard]] const Result* find(const std::string& name, std::int64_t repetition) const {
    auto it = results_.find(name);
    if (it == results_.end() || repetition < 0 || static_cast<std::size_t>(repetition) >= it->second.size()) {
      return nullptr;
    }
    return &it->second[static_cast<std::size_t>(repetition)];
  }

 private:
  std::map<std::string, std::deque<Result>> results_;  // deque: pointers stay valid as it grows
};

// Passes runs to another reporter with their memory results taken from the memory manager's copies.
class StableMemoryReporter final : public benchmark::BenchmarkReporter {
 public:
  StableMemoryReporter(std::unique_ptr<benchmark::BenchmarkReporter> inner, const StepMemoryManager& memory)
      : inner_(std::move(inner)), memory_(memory) {}
  bool ReportContext(const Context& context) override {
    // The library sets this reporter's streams (the --benchmark_out file) before it calls ReportContext.
    inner_->SetOutputStream(&GetOutputStream());
    inner_->SetErrorStream(&GetErrorStream());
    return inner_->ReportContext(context);
  }
  void ReportRuns(const std::vector<Run>& runs) override {
    auto fixed = runs;
    for (auto& run : fixed) {
      if (run.memory_result == nullptr || run.run_type != Run::RT_Iteration) continue;
      const auto* result = memory_.find(run.run_name.function_name, run.repetition_index);
      if (result != nullptr) run.memory_result = result;
    }
    inner_->ReportRuns(fixed);
  }
  void Finalize() override { inner_->Finalize(); }

 private:
  std::unique_ptr<benchmark::BenchmarkReporter> inner_;
  const StepMemoryManager& memory_;
};

// The value of `--<flag>=value` on the command line (before benchmark::Initialize consumes it).
std::optional<std::string> flag_value(int argc, char** argv, const std::string& flag) {
  std::optional<std::string> value;
  const auto prefix = "--" + flag + "=";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind(prefix, 0) == 0) value = arg.substr(prefix.size());
  }
  return value;
}

// A case's model, optimizer and batch, built and warmed up as a probe does (memgate::PreparedStep), kept while
// the same case runs again (repetitions, the memory manager's run); building another case frees it first.
struct Prepared {
  std::string key;
  std::unique_ptr<memgate::PreparedStep> prepared;
};
std::unique_ptr<Prepared> g_prepared;

void release_prepared() {
  if (!g_prepared) return;
  const auto device = g_prepared->prepared->backend().device();
  g_prepared.reset();
  memgate::make_memory_backend(device)->empty_cache();
}

memgate::PreparedStep& prepare(const std::string& key, const memgate::Fixture& fixture, std::int64_t batch_size,
                               c10::Device device) {
  if (g_prepared && g_prepared->key == key) return *g_prepared->prepared;
  release_prepared();
  auto p = std::make_unique<Prepared>();
  p->key = key;
  p->prepared = std::make_unique<memgate::PreparedStep>(fixture, batch_size, device);
  p->prepared->backend().synchronize();
  g_prepared = std::move(p);
  return *g_prepared->prepared;
}

// Times `step` once per benchmark iteration (CUDA events around it on a GPU, wall time on the CPU), and returns
// what the timed steps held: their peaks above `base` and their allocations.
template <class Step>
StepMemory time_steps(benchmark::State& state, c10::Device device, memgate::MemoryBackend& backend,
                      const memgate::MemorySnapshot& base, Step&& step) {
  backend.synchronize();
  backend.reset_peak();
  const auto allocations_before = allocation_count(device);
  if (device.is_cuda()) {
    c10::cuda::CUDAEvent start(cudaEventDefault);
    c10::cuda::CUDAEvent end(cudaEventDefault);
    for (auto _ : state) {
      start.record();
      step();
      end.record();
      end.synchronize();
      state.SetIterationTime(static_cast<double>(start.elapsed_time(end)) / 1000.0);
    }
  } else {
    for (auto _ : state) step();
  }
  backend.synchronize();
  const auto s = backend.snapshot();
  return {s.peak_allocated - base.allocated, s.peak_reserved - base.reserved,
          allocation_count(device) - allocations_before};
}

// Skips a GPU case where LibTorch sees no GPU; returns whether it did.
bool skipped_without_gpu(benchmark::State& state, bool on_gpu) {
  if (!on_gpu || memgate::cuda_available()) return false;
  state.SkipWithError("no GPU: LibTorch sees no CUDA device, GPU cases skip");
  return true;
}

struct Case {
  std::string name;  // as registered
  memgate::ProbeCase probe;
  memgate::SuiteDevice device;
};

void BM_TrainStep(benchmark::State& state, const Case& c) {
  g_current_case = c.name;
  const bool on_gpu = c.device == memgate::SuiteDevice::kCuda;
  if (skipped_without_gpu(state, on_gpu)) return;
  try {
    const auto device = memgate::resolve_device(on_gpu ? "cuda" : "cpu");
    std::optional<c10::cuda::CUDAGuard> guard;
    if (on_gpu) guard.emplace(device);
    const auto fixture = memgate::load_fixture(c.probe.fixture_path);
    auto& p = prepare(c.probe.name() + (on_gpu ? "@cuda" : "@cpu"), fixture, c.probe.batch_size, device);
    const auto m = time_steps(state, device, p.backend(), p.base(), [&p] { p.step().run(); });
    g_last_steps = m;

    state.counters["peak_allocated_MiB"] = static_cast<double>(m.peak_allocated) / kMiB;
    state.counters["peak_reserved_MiB"] = static_cast<double>(m.peak_reserved) / kMiB;
    state.counters["samples_per_second"] = benchmark::Counter(
        static_cast<double>(p.step().samples_per_step() * state.iterations()), benchmark::Counter::kIsRate);
  } catch (const c10::OutOfMemoryError& e) {
    release_prepared();
    state.SkipWithError(("out of memory: " + std::string(e.what_without_backtrace())).c_str());
  } catch (const std::exception& e) {
    release_prepared();
    state.SkipWithError(e.what());
  }
}

// The machine's speed: a fixed LibTorch training step that does not depend on memgate's code (convolution, GEMM,
// GELU, LayerNorm, softmax, their backward and an SGD update, in fp32 with fixed weights and inputs), so that
// `memgate bench-compare` can tell a runner that got slower from a step that got slower. Interleaved with the
// cases (--benchmark_enable_random_interleaving), it samples the same moments of the run as they do. The GPU
// one does the same work on a bigger batch, timed by CUDA events.
struct Reference {
  torch::Tensor conv_w, fc_w, x;
  explicit Reference(c10::Device device, std::int64_t batch) {
    torch::manual_seed(0);
    const auto opts = torch::TensorOptions().device(device).dtype(torch::kFloat32);
    conv_w = (torch::randn({32, 16, 3, 3}, opts) * 0.1).set_requires_grad(true);
    fc_w = (torch::randn({256, 256}, opts) * 0.05).set_requires_grad(true);
    x = torch::randn({batch, 16, 16, 16}, opts);
  }
  void step() {
    auto h = torch::gelu(torch::conv2d(x, conv_w, {}, 1, 1));           // [B, 32, 16, 16]
    h = h.reshape({h.size(0) * 8, -1, 256});                             // [B*8, 32, 256]
    h = torch::layer_norm(torch::matmul(h, fc_w), {256});
    const auto loss = torch::softmax(h, -1).mul(h).mean();
    loss.backward();
    torch::NoGradGuard no_grad;
    for (auto* w : {&conv_w, &fc_w}) {
      w->sub_(w->grad(), 1e-3);
      w->mutable_grad() = torch::Tensor();
    }
  }
};

void BM_Reference(benchmark::State& state, const std::string& name, bool on_gpu) {
  g_current_case = name;
  if (skipped_without_gpu(state, on_gpu)) return;
  release_prepared();  // what a case kept is freed: the reference runs in the same memory state every time
  try {
    const auto device = memgate::resolve_device(on_gpu ? "cuda" : "cpu");
    std::optional<c10::cuda::CUDAGuard> guard;
    if (on_gpu) guard.emplace(device);
    auto backend = memgate::make_memory_backend(device);
    backend->synchronize();
    const auto base = backend->snapshot();
    Reference ref(device, on_gpu ? 512 : 4);
    for (int i = 0; i < kReferenceWarmupSteps; ++i) ref.step();
    g_last_steps = time_steps(state, device, *backend, base, [&ref] { ref.step(); });
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void register_references() {
  benchmark::RegisterBenchmark("BM_Reference/cpu", [](benchmark::State& s) { BM_Reference(s, "BM_Reference/cpu", false); })
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("BM_Reference/gpu", [](benchmark::State& s) { BM_Reference(s, "BM_Reference/gpu", true); })
      ->Unit(benchmark::kMillisecond)
      ->UseManualTime();
}

// Registers one case per probe of a suite file; returns false (after saying why) when the file is bad.
bool register_suite(const std::string& suite_name, std::vector<std::unique_ptr<Case>>& cases) {
  const auto dir = memgate::project_dir();
  memgate::Suite suite;
  try {
    suite = memgate::load_suite(dir + "/fixtures/suites/" + suite_name + ".yaml", dir + "/fixtures/models");
    if (!suite.broken.empty()) throw memgate::Error(suite.broken.front().error);
  } catch (const memgate::Error& e) {
    std::cerr << "memgate_bench: " << e.what() << "\n";
    return false;
  }
  const std::string prefix = suite.device == memgate::SuiteDevice::kCpu ? "" : suite.name + "/";
  for (const auto& probe : suite.probes) {
    const auto name = "BM_TrainStep/" + prefix + "fixture:" + probe.fixture + "/bs:" + std::to_string(probe.batch_size);
    cases.push_back(std::make_unique<Case>(Case{name, probe, suite.device}));
    const Case& c = *cases.back();
    auto* b = benchmark::RegisterBenchmark(name.c_str(), [&c](benchmark::State& state) { BM_TrainStep(state, c); });
    b->Unit(benchmark::kMillisecond);
    if (suite.device == memgate::SuiteDevice::kCpu) {
      b->UseRealTime();
    } else {
      b->UseManualTime();
    }
  }
  return true;
}

}  // namespace

// --memgate_processes=N: run the benchmarks in N processes, one after the other, each with the same flags, and
// merge their JSON into the --benchmark_out file. A process's repetitions share its address-space layout,
// allocator state and caches, so a case can run a few percent faster or slower in one process than in the
// next for no reason in the code: repetitions from several processes carry that spread, so that
// `memgate bench-compare` does not read it as a change. Returns the exit code.
int run_in_processes(int processes, const std::string& out, int argc, char** argv) {
  namespace fs = std::filesystem;
  const auto exe = fs::read_symlink("/proc/self/exe");
  const fs::path parts = out + ".processes";
  memgate::remove_tree(parts.string());
  fs::create_directories(parts);
  std::vector<nlohmann::json> docs;
  for (int i = 0; i < processes; ++i) {
    const auto part = (parts / ("process_" + std::to_string(i) + ".json")).string();
    std::vector<std::string> args{exe.string()};
    for (int a = 1; a < argc; ++a) {
      const std::string arg = argv[a];
      if (arg.rfind("--benchmark_out=", 0) == 0 || arg.rfind("--benchmark_out_format=", 0) == 0 ||
          arg.rfind("--memgate_processes=", 0) == 0) {
        continue;
      }
      args.push_back(arg);
    }
    args.push_back("--benchmark_out=" + part);
    args.push_back("--benchmark_out_format=json");
    std::vector<char*> cargs;
    for (auto& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    std::cout << "memgate_bench: process " << (i + 1) << " of " << processes << std::endl;
    const pid_t pid = fork();
    if (pid < 0) {
      std::cerr << "memgate_bench: fork failed: " << std::strerror(errno) << "\n";
      return 1;
    }
    if (pid == 0) {
      execv(cargs[0], cargs.data());
      std::cerr << "memgate_bench: cannot run " << cargs[0] << ": " << std::strerror(errno) << "\n";
      _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::cerr << "memgate_bench: process " << (i + 1) << " of " << processes << " failed (status " << status
                << "); its output is in " << part << "\n";
      return 1;
    }
    try {
      docs.push_back(memgate::read_bench_document(part));
    } catch (const memgate::Error& e) {
      std::cerr << "memgate_bench: " << e.what() << "\n";
      return 1;
    }
  }
  try {
    memgate::write_file_atomically(out, memgate::merge_bench_json(docs, out).dump(2) + "\n");
  } catch (const std::exception& e) {
    std::cerr << "memgate_bench: " << e.what() << "\n";
    return 1;
  }
  memgate::remove_tree(parts.string());
  std::cout << "memgate_bench: " << processes << " processes merged into " << out << std::endl;
  return 0;
}

static int bench_main(int argc, char** argv) {
  const auto processes_flag = flag_value(argc, argv, "memgate_processes");
  if (processes_flag) {
    int processes = 0;
    const auto [end, ec] = std::from_chars(processes_flag->data(), processes_flag->data() + processes_flag->size(), processes);
    if (ec != std::errc() || end != processes_flag->data() + processes_flag->size() || processes < 1) {
      std::cerr << "memgate_bench: --memgate_processes: expected a positive integer, got '" << *processes_flag << "'\n";
      return 2;
    }
    const auto out = flag_value(argc, argv, "benchmark_out");
    if (processes > 1) {
      if (!out || out->empty() || flag_value(argc, argv, "benchmark_out_format").value_or("json") != "json") {
        std::cerr << "memgate_bench: --memgate_processes above 1 merges JSON: give --benchmark_out=<file.json>\n";
        return 2;
      }
      return run_in_processes(processes, *out, argc, argv);
    }
    // One process: drop the flag, as benchmark::Initialize would not know it.
    int kept = 1;
    for (int a = 1; a < argc; ++a) {
      if (std::string(argv[a]).rfind("--memgate_processes=", 0) != 0) argv[kept++] = argv[a];
    }
    argc = kept;
  }

  // Before any tensor: CPU bytes are counted from the first allocation on, and probes pin intra-op threads.
  memgate::CountingCpuAllocator::install();
  torch::set_num_threads(1);

  // A JSON file reporter of our own where --benchmark_out is given (the library refuses one without it); the
  // console and CSV formats print no memory.
  const auto out = flag_value(argc, argv, "benchmark_out");
  const bool json_out = out && !out->empty() && flag_value(argc, argv, "benchmark_out_format").value_or("json") == "json";
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::vector<std::unique_ptr<Case>> cases;
  register_references();
  if (!register_suite("cpu", cases) || !register_suite("gpu", cases)) return 1;
  StepMemoryManager memory;
  benchmark::RegisterMemoryManager(&memory);
  std::unique_ptr<benchmark::BenchmarkReporter> file_reporter;
  if (json_out) file_reporter = std::make_unique<StableMemoryReporter>(std::make_unique<benchmark::JSONReporter>(), memory);
  // nullptr: the display that --benchmark_format asks for. A filter that matches no case is an error.
  const auto matched = benchmark::RunSpecifiedBenchmarks(nullptr, file_reporter.get());
  benchmark::RegisterMemoryManager(nullptr);
  release_prepared();
  benchmark::Shutdown();
  return matched > 0 ? 0 : 1;
}

// Without LibTorch's static destructors (base/process.h): `--memgate_processes` runs this program once per part.
int main(int argc, char** argv) { memgate::exit_fast(bench_main(argc, argv)); }
