// The measurement protocol: build on the device, eval forward, warm-up step(s), then one measured step whose
// forward, backward and optimizer step are read off the allocator (see DESIGN.md, "The measurement protocol").
#include "memgate/probe.h"

#include "memgate/error.h"
#include "memgate/memory_backend.h"
#include "memgate/train_step.h"
#include "memgate/training.h"

#include <ATen/Context.h>
#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

namespace memgate {

std::int64_t Components::get(std::string_view name) const {
  if (name == "params") return params;
  if (name == "gradients") return gradients;
  if (name == "optimizer_state") return optimizer_state;
  if (name == "activations") return activations;
  if (name == "forward_peak") return forward_peak;
  if (name == "eval_peak") return eval_peak;
  if (name == "step_peak") return step_peak;
  if (name == "step_peak_reserved") return step_peak_reserved;
  throw Error("unknown component '" + std::string(name) + "'");
}

void Components::set(std::string_view name, std::int64_t bytes) {
  if (name == "params") params = bytes;
  else if (name == "gradients") gradients = bytes;
  else if (name == "optimizer_state") optimizer_state = bytes;
  else if (name == "activations") activations = bytes;
  else if (name == "forward_peak") forward_peak = bytes;
  else if (name == "eval_peak") eval_peak = bytes;
  else if (name == "step_peak") step_peak = bytes;
  else if (name == "step_peak_reserved") step_peak_reserved = bytes;
  else throw Error("unknown component '" + std::string(name) + "'");
}

void configure_determinism() {
  // cuBLAS keeps one fixed workspace per handle and stream instead of growing one per call.
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/1);
  at::globalContext().setBenchmarkCuDNN(false);
  at::globalContext().setDeterministicCuDNN(true);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
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

struct Measured {
  Components components;
  double step_seconds = 0.0;
};

Measured measure(const Fixture& fixture, std::int64_t batch_size, c10::Device device, MemoryBackend& backend,
                 const ProbeOptions& options) {
  const auto& training = fixture.training;
  const auto k = training.accumulation_steps;
  Components c;

  backend.empty_cache();
  backend.synchronize();
  const auto base = backend.snapshot();

  auto model = build_model(fixture.model, device, options.seed);
  model->set_gradient_checkpointing(training.gradient_checkpointing);
  backend.synchronize();
  c.params = backend.snapshot().allocated - base.allocated;

  auto trainable = select_trainable(*model, training.trainable);
  torch::manual_seed(options.seed + 1);
  const Batch batch = model->make_batch(batch_size);

  // Eval: one forward to warm up (workspaces, lazy handles), then the measured one.
  model->module().eval();
  for (int pass = 0; pass < 2; ++pass) {
    torch::NoGradGuard no_grad;
    AutocastScope autocast(device.type(), training.precision);
    backend.synchronize();
    backend.reset_peak();
    (void)model->forward(batch);
    backend.synchronize();
    c.eval_peak = backend.snapshot().peak_allocated - base.allocated;
  }
  model->module().train();

  auto optimizer = make_optimizer(training, trainable);
  auto micro_step = [&](bool measure_forward, PeakTracker* tracker) {
    torch::Tensor loss;
    std::int64_t before = 0;
    if (measure_forward) {
      tracker->reset();
      before = backend.snapshot().allocated;
    }
    loss = micro_batch_loss(*model, batch, training, device.type());
    if (measure_forward) {
      backend.synchronize();
      const auto s = backend.snapshot();
      c.activations = s.allocated - before;
      c.forward_peak = s.peak_allocated - before;
    }
    loss.backward();
  };

  for (int step = 0; step < options.warmup_steps; ++step) {
    for (std::int64_t i = 0; i < k; ++i) micro_step(false, nullptr);
    backend.synchronize();
    const auto before_step = backend.snapshot().allocated;
    optimizer->step();
    backend.synchronize();
    if (step == 0) c.optimizer_state = backend.snapshot().allocated - before_step;
    optimizer->zero_grad(/*set_to_none=*/true);
  }

  // The measured step, from no gradients to no gradients.
  backend.synchronize();
  backend.reset_peak();
  PeakTracker tracker(backend);
  const auto step_start = Clock::now();
  const auto before_step = backend.snapshot().allocated;
  for (std::int64_t i = 0; i < k; ++i) micro_step(i == 0, &tracker);
  backend.synchronize();
  c.gradients = backend.snapshot().allocated - before_step;
  optimizer->step();
  optimizer->zero_grad(/*set_to_none=*/true);
  tracker.fold();
  Measured m;
  m.step_seconds = seconds_since(step_start);
  c.step_peak = tracker.allocated() - base.allocated;
  c.step_peak_reserved = tracker.reserved() - base.reserved;
  m.components = c;
  return m;
}

}  // namespace

ProbeResult run_probe(const Fixture& fixture, std::int64_t batch_size, c10::Device device,
                      const ProbeOptions& options) {
  require_batch_size(fixture, batch_size);
  configure_determinism();
  ThreadScope threads(device, options.cpu_threads);
  auto backend = make_memory_backend(device);
  backend->apply_allocator_settings(fixture.training.allocator);
  ProbeResult result;
  result.batch_size = batch_size;
  const auto start = Clock::now();
  try {
    auto m = measure(fixture, batch_size, device, *backend, options);
    result.components = m.components;
    result.step_seconds = m.step_seconds;
  } catch (const c10::OutOfMemoryError& e) {
    result.oom = true;
    result.error = e.what_without_backtrace();
  }
  backend->empty_cache();
  result.seconds = seconds_since(start);
  return result;
}

Profile run_profile(const Fixture& fixture, const std::vector<std::int64_t>& batch_sizes, c10::Device device,
                    const ProbeOptions& options) {
  Profile profile;
  profile.device = describe_probe_device(device, fixture, options);
  profile.fixture = fixture.name;
  profile.fixture_hash = fixture.hash;
  profile.params = fixture_param_counts(fixture);
  for (auto bs : batch_sizes) profile.probes.push_back(run_probe(fixture, bs, device, options));
  return profile;
}

DeviceInfo describe_probe_device(c10::Device device, const Fixture& fixture, const ProbeOptions& options) {
  auto info = describe_device(device);
  if (!fixture.training.allocator.empty()) info.allocator_settings = fixture.training.allocator;
  info.cpu_threads = device.is_cpu() ? options.cpu_threads : 0;
  return info;
}

ParamCounts fixture_param_counts(const Fixture& fixture) {
  // On the meta device parameters have shapes but no storage: a 7B model is counted without allocating it.
  auto model = build_model(fixture.model, c10::Device(c10::DeviceType::Meta));
  (void)select_trainable(*model, fixture.training.trainable);
  return count_parameters(model->module());
}

}  // namespace memgate
