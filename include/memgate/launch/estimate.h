// Estimates: the probe protocol run on the Meta device, where nothing is computed and a counting allocator sees
// every tensor's request, so a 7B fixture's components come out in seconds on a machine without a GPU.
#pragma once

#include "memgate/estimate/meta_kernels.h"
#include "memgate/launch/run.h"

#include <cstdint>
#include <vector>

namespace memgate {

/// Runs the probe protocol of `workload` at `batch_size` on the Meta device for `target`: every component, counted
/// from the tensors' requests. For CUDA they are counted in the caching allocator's 512-byte blocks and replayed
/// through its model (CachingAllocatorModel: pools, segments, best fit, splitting), which gives step_peak_reserved;
/// for the CPU, reserved is allocated. The probe runs under an EstimateContextGuard for `target` (the context around
/// the call gives the GPU; the workload, the CPU's kernels): the Meta kernels and autocast (the ops torch autocasts on
/// that device, cast as it casts them) read it. An op without a Meta kernel throws memgate::Error naming it.
[[nodiscard]] ProbeResult estimate_probe(const Workload& workload, std::int64_t batch_size, EstimateTarget target,
                                         const ProbeOptions& options = {});

/// estimate_probe for each batch size: the profile of an estimate (its device says "estimate for ...").
[[nodiscard]] Profile estimate_profile(const Workload& workload, const std::vector<std::int64_t>& batch_sizes,
                                       EstimateTarget target, const ProbeOptions& options = {},
                                       const ProbeCallback& on_probe = {});

}  // namespace memgate
