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

/// Registers memgate's Meta kernels (once per process; later calls do nothing). They follow what this thread's
/// estimate is for (estimate_context.h: EstimateContext, set by an EstimateContextGuard; the CPU's portable kernels
/// where none is set): the attention kernel the target would pick and the tensors its kernels allocate; for the CPU,
/// those of its kernels (LibTorch's own, or oneDNN's as they run on an AVX-512 CPU with bf16).
///
///   memgate::register_meta_kernels();
///   const memgate::EstimateContextGuard for_cuda({.target = memgate::EstimateTarget::kCuda});
///   auto q = torch::empty({8, 12, 197, 64}, torch::kMeta);  // attention on q allocates what CUDA's kernel does
void register_meta_kernels();

/// Registers autocast for Meta tensors (once per process), by the policy of this thread's estimate target: which ops
/// run in the lower precision, which in fp32, which promote, as torch's autocast runs them on that device.
/// AutocastScope turns it on for the Meta device. register_meta_kernels calls it.
void register_meta_autocast();

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
