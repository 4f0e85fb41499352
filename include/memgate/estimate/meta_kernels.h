// Meta kernels for the ops LibTorch's C++ has none for (convolution, batch and layer norm, scaled-dot-product
// attention, embedding, where), so that a training step runs on the Meta device for an estimate.
#pragma once

#include "memgate/backend/device.h"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace memgate {

/// The device an estimate speaks for: its kernels decide which tensors exist (the attention a GPU picks saves
/// other tensors than the CPU's).
enum class EstimateTarget { kCpu, kCuda };

/// Registers memgate's Meta kernels (once per process) and makes them follow `target`: the attention kernel the
/// target would pick and the tensors its kernels allocate; for the CPU, those of `cpu_kernels` (LibTorch's own
/// kernels, or oneDNN's as they run on an AVX-512 CPU with bf16).
void use_meta_kernels_for(EstimateTarget target, CpuKernels cpu_kernels = CpuKernels::kPortable);

/// The target use_meta_kernels_for set last (the CPU until it is called).
[[nodiscard]] EstimateTarget meta_kernels_target();

/// Registers autocast for Meta tensors (once per process) with the policy of `target`: which ops run in the lower
/// precision, which in fp32, which promote, as torch's autocast runs them on that device. AutocastScope turns it on
/// for the Meta device. use_meta_kernels_for calls it.
void use_meta_autocast_for(EstimateTarget target);

/// The op an error says has no Meta kernel ("aten::roll"): LibTorch's "Could not run 'aten::roll' with arguments from
/// the 'Meta' backend" or torch's Python "aten::roll: attempted to run this operator with Meta tensors, but there was
/// no fake impl or Meta kernel registered" (an op defined with torch.library and a CPU kernel alone), or
/// torch.library.custom_op's "There was no fake impl registered for <CustomOpDef(ns::op)>"; nullopt for any other
/// error.
[[nodiscard]] std::optional<std::string> op_without_meta_kernel(std::string_view message);

/// The estimate's error for such an op: the op, which kernels it lacks (`in_python`: in a Python fixture's process,
/// where torch's Python Meta kernels are there too), the module whose forward called it where `module` names one (a
/// Python fixture's: "'body.2' (PReLU)"), that the Meta device cannot run it, and to measure instead; nullopt when
/// `message` is not about a missing Meta kernel.
[[nodiscard]] std::optional<std::string> describe_missing_meta_kernel(std::string_view message, bool in_python,
                                                                      const std::string& module = "");

/// The ops ("name" or "name.overload") that `target` autocasts, each with a policy.
[[nodiscard]] std::vector<std::string> meta_autocast_ops(EstimateTarget target);

}  // namespace memgate
