// The measurement protocol: build on the device, eval forward, warm-up step(s), then one measured step whose
// forward, backward and optimizer step are read off the allocator (see docs/design.md, "The protocol").
#include "memgate/measure/probe.h"

#include "memgate/base/error.h"
#include "memgate/backend/memory_backend.h"
#include "memgate/backend/module_attribution.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <ATen/Context.h>
#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>

namespace memgate {

void configure_determinism(bool deterministic) {
  at::globalContext().setBenchmarkCuDNN(false);
  at::globalContext().setDeterministicCuDNN(deterministic);
  at::globalContext().setDeterministicAlgorithms(deterministic, /*warn_only=*/true);
}

void configure_cpu_kernels(CpuKernels kernels) {
  const bool host = kernels == CpuKernels::kHost;
  at::globalContext().setUserEnabledMkldnn(host);
  at::globalContext().setUserEnabledNNPACK(host);
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Pins intra-op threads for the probe and restores them after.
class ThreadScope {
 public:
  ThreadScope(c10::Device device, int threads) {
    if (device.is_cpu() && threads > 0) {
      previous_ = torch::get_num_threads();
      torch::set_num_threads(threads);
    }
  }
  ~ThreadScope() {
    if (previous_ > 0) torch::set_num_threads(previous_);
  }
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  int previous_ = 0;
};

// Tracks a step's peak across the resets that measure its parts: each part's peak is read before the next
// reset, so the step's peak is the highest of them.
class PeakTracker {
 public:
  explicit PeakTracker(MemoryBackend& backend) : backend_(backend) {}
  void fold() {
    backend_.synchronize();
    const auto s = backend_.snapshot();
    allocated_ = std::max(allocated_, s.peak_allocated);
    reserved_ = std::max(reserved_, s.peak_reserved);
  }
  void reset() {
    fold();
    backend_.reset_peak();
  }
  [[nodiscard]] std::int64_t allocated() const { return allocated_; }
  [[nodiscard]] std::int64_t reserved() const { return reserved_; }

 private:
  MemoryBackend& backend_;
  std::int64_t allocated_ = 0;
  std::int64_t reserved_ = 0;
};

// Reads what a probe reports off the allocator between the parts of the build, the warm-up and the measured
// step (docs/design.md): params after the build, eval_peak over the second eval forward, optimizer_state over the
// first warm-up optimizer step; then, in the measured step, activations and forward_peak over the first
// micro-batch's forward, gradients after backward, and the whole step's peaks.
class ProbeObserver final : public StepObserver {
 public:
  ProbeObserver(c10::Device device, std::function<void(std::string_view)> on_phase)
      : backend_(make_memory_backend(device)), attribution_(device), on_phase_(std::move(on_phase)) {}
  void start_measured_step() {
    measuring_ = true;
    backend_->synchronize();
    backend_->reset_peak();
    attribution_.reset_peak(ModuleAttribution::kStep);
    tracker_.emplace(*backend_);
    before_step_ = backend_->snapshot().allocated;
  }
  void finish_measured_step() {
    tracker_->fold();
    c_.step_peak = tracker_->allocated() - base_.allocated;
    c_.step_peak_reserved = tracker_->reserved() - base_.reserved;
    modules_.components["step_peak"] = attribution_.peak_since(ModuleAttribution::kStep, base_mark_);
  }
  /// The per-module breakdown of the components that have one, where the model's modules were seen.
  [[nodiscard]] ModuleBreakdown modules() const { return attribution_.saw_modules() ? modules_ : ModuleBreakdown{}; }
  /// What the measured step left allocated beyond what it started with (0 for a steady step: its gradients and
  /// graph freed, the optimizer's state as it was).
  [[nodiscard]] std::int64_t step_growth() const { return after_step_ - before_step_; }
  [[nodiscard]] std::int64_t before_step() const { return before_step_; }
  [[nodiscard]] std::int64_t after_step() const { return after_step_; }
  [[nodiscard]] const MemorySnapshot& base() const { return base_; }
  [[nodiscard]] const Components& components() const { return c_; }

  void base_read(const MemorySnapshot& base) override {
    base_ = base;
    base_mark_ = attribution_.mark();
    phase("building the model");
  }
  void model_built() override {
    backend_->synchronize();
    c_.params = backend_->snapshot().allocated - base_.allocated;
  }
  void eval_begin(int) override {
    phase("eval forward");
    backend_->synchronize();
    backend_->reset_peak();
    attribution_.reset_peak(ModuleAttribution::kPart);
  }
  void eval_end(int) override {
    backend_->synchronize();
    c_.eval_peak = backend_->snapshot().peak_allocated - base_.allocated;
    modules_.components["eval_peak"] = attribution_.peak_since(ModuleAttribution::kPart, base_mark_);
  }
  void forward_begin(std::int64_t index) override {
    phase(measuring_ ? "measured step: forward" : "warm-up step: forward");
    if (!measuring_ || index != 0) return;
    tracker_->reset();
    before_forward_ = backend_->snapshot().allocated;
    forward_mark_ = attribution_.mark();
    attribution_.reset_peak(ModuleAttribution::kPart);
  }
  void forward_end(std::int64_t index) override {
    phase(measuring_ ? "measured step: backward" : "warm-up step: backward");
    if (!measuring_ || index != 0) return;
    backend_->synchronize();
    const auto s = backend_->snapshot();
    c_.activations = s.allocated - before_forward_;
    c_.forward_peak = s.peak_allocated - before_forward_;
    modules_.components["activations"] = attribution_.since(forward_mark_);
    modules_.components["forward_peak"] = attribution_.peak_since(ModuleAttribution::kPart, forward_mark_);
  }
  void backward_done() override {
    phase(measuring_ ? "measured step: optimizer step" : "warm-up step: optimizer step");
    backend_->synchronize();
    const auto allocated = backend_->snapshot().allocated;
    if (measuring_) c_.gradients = allocated - before_step_;
    else before_optimizer_ = allocated;
  }
  void ema_begin() override {
    phase("making the EMA copy");
    backend_->synchronize();
    before_ema_ = backend_->snapshot().allocated;
  }
  void ema_end() override {
    backend_->synchronize();
    c_.ema = backend_->snapshot().allocated - before_ema_;
    c_.keeps_ema = true;
  }
  void optimizer_done() override {
    phase(measuring_ ? "measured step: zero_grad" : "warm-up step: zero_grad");
    if (measuring_ || optimizer_state_seen_) return;
    backend_->synchronize();
    // What the first warm-up step that allocated optimizer state allocated (a step the fp16 scaler skipped
    // allocates none; an optimizer without state never does, and reads 0).
    c_.optimizer_state = backend_->snapshot().allocated - before_optimizer_;
    optimizer_state_seen_ = c_.optimizer_state > 0;
  }
  void step_done() override {
    if (!measuring_) return;
    backend_->synchronize();
    after_step_ = backend_->snapshot().allocated;
  }

 private:
  void phase(const char* what) {
    if (what != phase_) attribution_.set_phase(what);
    if (what != phase_ && on_phase_) on_phase_(what);
    phase_ = what;
  }

  std::unique_ptr<MemoryBackend> backend_;
  ModuleAttribution attribution_;
  std::function<void(std::string_view)> on_phase_;
  const char* phase_ = nullptr;
  MemorySnapshot base_;
  ModuleAttribution::Mark base_mark_;
  ModuleAttribution::Mark forward_mark_;
  ModuleBreakdown modules_;
  Components c_;
  bool measuring_ = false;
  bool optimizer_state_seen_ = false;
  std::int64_t before_optimizer_ = 0;
  std::int64_t before_ema_ = 0;
  std::int64_t before_step_ = 0;
  std::int64_t after_step_ = 0;
  std::int64_t before_forward_ = 0;
  std::optional<PeakTracker> tracker_;
};

}  // namespace

PreparedStep::PreparedStep(const Workload& workload, std::int64_t batch_size, c10::Device device,
                           const ProbeOptions& options, StepObserver* observer)
    : guard_(device.is_cuda() ? std::optional<c10::Device>(device) : std::nullopt),
      backend_(make_memory_backend(device)) {
  require_batch_size(workload, batch_size);
  configure_determinism(workload.training.deterministic);
  configure_cpu_kernels(workload.training.cpu_kernels);
  backend_->apply_allocator_settings(workload.training.allocator);
  library_workspace_bytes_ = backend_->create_library_workspaces();
  // Nothing an earlier probe left for Python's collector is freed inside this probe's numbers.
  if (options.python != nullptr && options.python->collect_garbage) options.python->collect_garbage();
  backend_->empty_cache();
  backend_->synchronize();
  base_ = backend_->snapshot();
  if (observer != nullptr) observer->base_read(base_);
  step_ = std::make_unique<TrainingStep>(workload, batch_size, device, options.seed, observer, options.rank_group,
                                         options.python);
  // DDP rebuilds its buckets at the second iteration's forward: a rank's steady state starts at the third.
  const int warmup = step_->data_parallel() != nullptr ? std::max(options.warmup_steps, 2) : options.warmup_steps;
  step_->warm_up(warmup, observer);
}

bool is_out_of_memory(std::string_view message) {
  for (const std::string_view sign : {"CUDA out of memory", "CUDA error: out of memory", "cudaErrorMemoryAllocation",
                                      "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED",
                                      "DefaultCPUAllocator: not enough memory",
                                      "DefaultCPUAllocator: can't allocate memory",
                                      "memgate: CPU allocator limit reached"}) {
    if (message.find(sign) != std::string_view::npos) return true;
  }
  return false;
}

namespace {

// An out-of-memory inside backward leaves the failed graph's pending tasks, and the gradients they carry, in the
// autograd engine's ready queue of that thread or device; the next backward there drops them, in the middle of the
// next probe's step (a CPU probe after one ran out of memory read 6.5 MB low, and a capped one fitted a batch it
// does not). One tiny backward on the device drops them now.
void drop_failed_backward(c10::Device device) {
  try {
    auto x = torch::ones({1}, torch::TensorOptions().device(device).requires_grad(true));
    x.sum().backward();
  } catch (const std::exception&) {
    // Nothing more to do: the out-of-memory result stands.
  }
}

}  // namespace

std::optional<std::chrono::seconds> parse_rank_timeout(std::string_view text) {
  std::int64_t seconds = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), seconds);
  if (ec != std::errc() || end != text.data() + text.size() || seconds < 1 || seconds > 86400) return std::nullopt;
  return std::chrono::seconds(seconds);
}

std::chrono::seconds default_rank_timeout() {
  const char* env = std::getenv("MEMGATE_RANK_TIMEOUT");
  if (env == nullptr || *env == '\0') return kDefaultRankTimeout;
  if (const auto timeout = parse_rank_timeout(env)) return *timeout;
  throw Error(fmt::format("MEMGATE_RANK_TIMEOUT={}: expected whole seconds from 1 to 86400", env));
}

ProbeResult measure_probe(const Workload& workload, std::int64_t batch_size, c10::Device device,
                          const ProbeOptions& options) {
  require_batch_size(workload, batch_size);
  if (workload.training.distributed.enabled() && options.rank_group == nullptr) {
    throw Error(workload.source + ": a distributed workload's probe runs one process per rank: measure it with "
                "run_probe (memgate/launch/run.h), which starts them");
  }
  ThreadScope threads(device, options.cpu_threads);
  ProbeResult result;
  result.batch_size = batch_size;
  const auto start = Clock::now();
  // Started before the build (an out-of-memory in the warm-up is recorded too), finished however the probe ends.
  std::optional<AllocationHistory> history;
  if (options.snapshot) history.emplace(device, *options.snapshot);
  const auto on_phase = [&](std::string_view phase) {
    if (history) history->set_phase(phase);
    if (options.on_phase) options.on_phase(phase);
  };
  std::optional<std::int64_t> base_allocated;  // what the device held before this probe built anything
  try {
    ProbeObserver observer(device, on_phase);
    PreparedStep prepared(workload, batch_size, device, options, &observer);
    base_allocated = observer.base().allocated;
    auto* offload = prepared.step().activation_offloader();
    // FSDP2's CPUOffloadPolicy in an estimate for CUDA: its host memory.
    auto* host_state = prepared.step().fsdp_host_memory();
    observer.start_measured_step();
    if (offload != nullptr) offload->reset_peak();
    if (host_state != nullptr) host_state->reset_peak();
    const auto step_start = Clock::now();
    prepared.step().run(&observer);
    observer.finish_measured_step();
    result.step_seconds = seconds_since(step_start);
    result.components = observer.components();
    // The host copies activation offload made: their peak over the measured step (all freed by its end).
    if (offload != nullptr) result.components.set("host_activations", offload->peak_bytes());
    // The shards, their gradients and the optimizer's state and temporaries on the host: their peak over the step.
    if (host_state != nullptr) result.components.set("host_state", host_state->peak_bytes());
    result.modules = observer.modules();
    // The protocol measures one step as every step of training: a step that ends with more (or less) allocated than
    // it started with is not that, and its numbers would be recorded as truth.
    if (const auto growth = observer.step_growth(); growth != 0) {
      throw Error(fmt::format(
          "{} at batch {}: memory {} by {} bytes per step: the measured step ended with {} bytes allocated above "
          "the probe's base, {} when it began (after the warm-up). Something is {} from step to step (a tensor kept "
          "per forward: a loss or an output appended to a list, a module attribute that keeps its input, a cache "
          "that grows); memgate does not record or judge a step that is not steady. Log loss.item(), or detach what "
          "you keep and drop it.",
          workload.source, batch_size, growth > 0 ? "grows" : "shrinks", growth > 0 ? growth : -growth,
          observer.after_step() - observer.base().allocated, observer.before_step() - observer.base().allocated,
          growth > 0 ? "kept" : "freed"));
    }
    for (const auto& info : kComponentTable) {
      if (const auto bytes = result.components.get(info.name); bytes < 0) {
        throw Error(fmt::format(
            "{} at batch {}: {} measured {} bytes: memory allocated before it was freed while it was measured (a "
            "previous probe's tensors, or a model that frees what it held). Nothing is recorded from it.",
            workload.source, batch_size, info.name, bytes));
      }
    }
    result.library_workspace_bytes = prepared.library_workspace_bytes();
    result.outside_allocator_bytes = prepared.backend().outside_allocator_bytes();
    if (const auto* ddp = prepared.step().data_parallel()) {
      result.comm_buffer_bytes = ddp->bucket_bytes();
      result.comm_buffers = ddp->bucket_count();
    }
    if (history) {
      result.snapshot = history->finish();
      history.reset();
    }
  } catch (const c10::OutOfMemoryError& e) {
    result.oom = true;
    result.error = e.what_without_backtrace();
  } catch (const c10::Error& e) {
    if (!is_out_of_memory(e.what_without_backtrace())) throw;
    result.oom = true;
    result.error = e.what_without_backtrace();
  } catch (const std::runtime_error& e) {
    // The TorchScript interpreter rethrows what an op raised as a plain error with the op's message.
    if (!is_out_of_memory(e.what())) throw;
    result.oom = true;
    result.error = e.what();
  }
  if (result.oom) drop_failed_backward(device);
  // Everything of the probe is gone. Less allocated than before it means that memory allocated before the probe (a
  // previous probe's tensors, kept by a module-level list or a reference cycle) was freed while it was measured: its
  // numbers are short by those bytes (that made `params` negative). What a probe leaves allocated (a cache a library
  // keeps for the process) stays out of later probes' numbers as long as it is never freed, and is not an error.
  if (!result.oom && base_allocated) {
    auto backend = make_memory_backend(device);
    backend->synchronize();
    if (const auto left = backend->snapshot().allocated - *base_allocated; left < 0) {
      throw Error(fmt::format(
          "{} at batch {}: {} bytes allocated before this probe were freed while it was measured: tensors of an "
          "earlier probe (kept by a module-level list or cache, or in a reference cycle) were released inside this "
          "probe's numbers. Nothing is recorded from it; keep no tensors outside the model between builds.",
          workload.source, batch_size, -left));
    }
  }
  if (history) {  // the probe ran out of memory: the history up to there
    try {
      result.snapshot = history->finish();
    } catch (const std::exception&) {
      result.snapshot.clear();  // no snapshot; the out-of-memory result stands
    }
  }
  make_memory_backend(device)->empty_cache();
  result.seconds = seconds_since(start);
  return result;
}

DeviceInfo describe_probe_device(c10::Device device, const Workload& workload, const ProbeOptions& options) {
  auto info = describe_device(device);
  // What the probe's allocator runs with on CUDA (the CPU's counting allocator has no settings).
  if (device.is_cuda()) {
    info.allocator_settings = merge_allocator_settings(allocator_settings_from_environment(), workload.training.allocator);
  }
  info.cpu_threads = device.is_cpu() ? options.cpu_threads : 0;
  if (device.is_cpu()) set_cpu_kernels(info, workload.training.cpu_kernels);
  return info;
}

ParamCounts workload_param_counts(const Workload& workload, std::optional<c10::Device> fallback,
                                  const std::function<void()>& on_fallback, const PythonRuntime* python) {
  // On the meta device parameters have shapes but no storage: a 7B model is counted without allocating it.
  std::unique_ptr<Model> model;
  const auto on_its_fallback = [&] {
    if (on_fallback) on_fallback();
    return build_model(workload.model, *fallback, 0, python);
  };
  try {
    model = build_model(workload.model, c10::Device(c10::DeviceType::Meta), 0, python);
  } catch (const c10::Error&) {
    // A registered model whose factory builds on the CPU and then moves (Module::to) cannot go to the meta device:
    // count it on the CPU.
    if (workload.model.arch == Arch::kRegistered) {
      model = build_model(workload.model, c10::Device(c10::DeviceType::CPU));
    } else if (fallback) {
      model = on_its_fallback();
    } else {
      throw;
    }
  } catch (const std::exception&) {
    if (!fallback) throw;
    model = on_its_fallback();
  }
  (void)select_trainable(*model, workload.training.trainable, workload.source);
  return count_parameters(model->module());
}

}  // namespace memgate
