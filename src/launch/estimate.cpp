// Estimates on the Meta device: the probe's own protocol, counted by the Meta allocator.
#include "memgate/launch/estimate.h"

#include "memgate/base/error.h"
#include "memgate/backend/cpu_allocator.h"
#include "memgate/backend/meta_allocator.h"
#include "memgate/estimate/estimate_context.h"
#include "memgate/estimate/meta_kernels.h"
#include "memgate/launch/ranks.h"
#include "memgate/launch/run.h"
#include "memgate/models/python.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/version.h>

#include <span>
#include <utility>
#include <vector>

namespace memgate {

namespace {

// For a CPU estimate: what the step allocates on the real CPU meanwhile (AdamW keeps its step counters there, as
// torch.optim does) is counted with the Meta tensors, as the CPU's one allocator counts everything. A CUDA
// estimate leaves it out: host memory is not the GPU's.
class CpuBesideMeta final : public CountingCpuAllocator::Observer {
 public:
  explicit CpuBesideMeta(bool active) : active_(active) {
    if (active_) CountingCpuAllocator::install().set_observer(this);
  }
  ~CpuBesideMeta() override {
    if (active_) CountingCpuAllocator::install().set_observer(nullptr);
  }
  CpuBesideMeta(const CpuBesideMeta&) = delete;
  CpuBesideMeta& operator=(const CpuBesideMeta&) = delete;
  void on_alloc(const void*, std::size_t bytes) override {
    CountingMetaAllocator::install().count_external(static_cast<std::int64_t>(bytes));
  }
  void on_free(const void*, std::size_t bytes) override {
    CountingMetaAllocator::install().count_external(-static_cast<std::int64_t>(bytes));
  }

 private:
  bool active_;
};

// What an estimate does not model yet, refused naming the fixture and the key before anything runs. Selective
// checkpointing under autocast: torch.utils.checkpoint restores no autocast of the Meta device for the recomputation
// (it failed there), and with it restored the estimate of a GPT-2 in bf16 saving its addmms kept 74% less of the
// forward's activations than the measurement (the casts seen by the policy's mode are not yet the CPU's): a number
// that far off is worse than none. Whole blocks, and the policy in fp32, are estimated to the byte.
void refuse_unmodelled(const Workload& workload) {
  const auto* python = std::get_if<PythonOptions>(&workload.model.options);
  if (python != nullptr && python->selective_checkpointing() && workload.training.precision != Precision::kFp32) {
    throw Error(fmt::format("{}: training.gradient_checkpointing: a selective policy under {} autocast is measured but "
                            "not estimated yet (expected precision fp32, whole blocks, or memgate profile on the "
                            "device)", workload.source, name_of(kPrecisionNames, workload.training.precision)));
  }
}

}  // namespace

ProbeResult estimate_probe(const Workload& workload, std::int64_t batch_size, EstimateTarget target,
                           const ProbeOptions& options) {
  const c10::Device meta_device(c10::DeviceType::Meta);
  refuse_unmodelled(workload);
  // FSDP2's pinned CPU offload for the CPU: refused here, where the fixture's file is known, before a rank starts
  // (fully_shard.cpp refuses it too, for a caller that gets this far). For CUDA it is estimated (fully_shard.h).
  const auto& distributed = workload.training.distributed;
  if (target == EstimateTarget::kCpu && distributed.strategy == DistributedStrategy::kFsdp &&
      distributed.offload_policy == FsdpOffload::kCpuPinned) {
    throw Error(workload.source + ": training.distributed.offload_policy: cpu_pinned pins host memory, which needs "
                "CUDA (PyTorch's pin_memory() raises without it): expected cpu or none for the CPU, or --for cuda");
  }
  if (place_of(workload, meta_device, options) == Place::kPython) {
    return run_python_probe(workload, batch_size, meta_device, options, target);
  }
  // The CUDA caching allocator hands out blocks in multiples of 512 bytes, and counts those.
  auto& meta = CountingMetaAllocator::install();
  meta.set_granularity(target == EstimateTarget::kCuda ? 512 : 0);
  // ... and reserves them in segments (each probe starts from an empty cache, as a probe on a GPU does; the Meta
  // backend applies the probe's allocator settings to the model, as the CUDA backend does to the allocator).
  meta.model_caching_allocator(target == EstimateTarget::kCuda);
  // What the estimate is for: the target and the CPU's kernels, on the GPU of the context around it.
  auto context = estimate_context();
  context.target = target;
  context.cpu_kernels = workload.training.cpu_kernels;
  const EstimateContextGuard estimating(std::move(context));
  register_meta_kernels();
  // A Python model kept for the next probe (PythonRuntime::reuse_builds) is as its build left it, and nothing of the
  // probe is alive: else it is freed now, between probes, and the next probe builds anew.
  struct KeptBuildCheck {
    const PythonRuntime* python;
    std::int64_t before = CountingMetaAllocator::install().current_bytes();
    ~KeptBuildCheck() {
      const bool changed = CountingMetaAllocator::install().current_bytes() != before;
      if (changed && python != nullptr && python->drop_reused_build) python->drop_reused_build();
    }
  } kept_build_check{options.python};
  try {
    const CpuBesideMeta cpu(target == EstimateTarget::kCpu);
    return run_probe(workload, batch_size, c10::Device(c10::DeviceType::Meta), options);
  } catch (const c10::Error& e) {
    const auto missing = describe_missing_meta_kernel(e.what_without_backtrace(), options.python != nullptr);
    throw Error(workload.source + ": cannot estimate at batch " + std::to_string(batch_size) + " on the Meta device: " +
                (missing ? *missing : std::string(e.what_without_backtrace())));
  } catch (const std::exception& e) {
    // A Python kernel's error (a Python fixture's backward) is not a c10::Error.
    if (const auto missing = describe_missing_meta_kernel(e.what(), options.python != nullptr)) {
      throw Error(workload.source + ": cannot estimate at batch " + std::to_string(batch_size) +
                  " on the Meta device: " + *missing);
    }
    throw;
  }
}

Profile estimate_profile(const Workload& workload, const std::vector<std::int64_t>& batch_sizes, EstimateTarget target,
                         const ProbeOptions& options, const ProbeCallback& on_probe) {
  refuse_unmodelled(workload);
  Profile profile;
  profile.device.device = c10::Device(c10::DeviceType::Meta);
  profile.device.name = target == EstimateTarget::kCpu ? "estimate for the CPU" : "estimate for CUDA";
  profile.device.slug = "cuda";
  if (target == EstimateTarget::kCpu) {
    auto cpu = describe_device(c10::Device(c10::DeviceType::CPU));
    set_cpu_kernels(cpu, workload.training.cpu_kernels);
    profile.device.slug = cpu.slug;
    profile.device.cpu_kernels = cpu.cpu_kernels;
  }
  profile.device.torch_version = TORCH_VERSION;
  profile.fixture = workload.name;
  const bool python = place_of(workload, c10::Device(c10::DeviceType::Meta), options) == Place::kPython;
  if (!python) profile.params = workload_param_counts(workload);
  // A Python fixture's estimates in one Python process (its imports paid once).
  return collect_profile(
      batch_sizes, python,
      [&](std::span<const std::int64_t> sizes) {
        if (python) {
          return run_python_probes(workload, sizes, c10::Device(c10::DeviceType::Meta), options, target);
        }
        std::vector<ProbeResult> results;
        for (const auto batch_size : sizes) results.push_back(estimate_probe(workload, batch_size, target, options));
        return results;
      },
      on_probe, std::move(profile), options.keep_going);
}

}  // namespace memgate
