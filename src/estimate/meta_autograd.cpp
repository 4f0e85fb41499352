// The autograd engine's bookkeeping on the Meta device: which op is the engine summing gradients, so that add sums
// in place where the device's engine does (meta_ops.cpp's add). And the composites whose path ATen chooses by
// "tensor-subclass-like" inputs, which Meta tensors are: CTC loss at the autograd key, as the device runs it.
#include "meta_kernels_internal.h"

#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/function.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <vector>

namespace memgate::meta_kernels {
namespace {

// --- the autograd engine's sum of gradients ----------------------------------------------------------------
// Where several gradients reach one tensor, the engine sums them (InputBuffer::accumulate): in place into the one it
// holds when it holds the last reference to it (can_accumulate_inplace), else into a new tensor. Meta tensors count
// as "tensor-subclass-like" there (BackendComponent::MetaBit is in kTensorSubclassLike), so on Meta every such sum
// allocated a new tensor where the device sums in place: a mixture of experts' shared input held two gradients at
// once (+3-4% on step_peak). This add takes the device's path back for the engine's sums: those made while a
// backward node is current (autograd::get_current_node) but outside that node's own function (the engine runs each
// node's function in a BACKWARD_FUNCTION RecordFunction, whose sequence numbers are tracked per thread).

thread_local std::vector<std::uint64_t> t_backward_functions;

std::unique_ptr<at::ObserverContext> enter_backward_function(const at::RecordFunction& fn) {
  t_backward_functions.push_back(static_cast<std::uint64_t>(fn.seqNr()));
  return nullptr;
}

void exit_backward_function(const at::RecordFunction&, at::ObserverContext*) {
  if (!t_backward_functions.empty()) t_backward_functions.pop_back();
}

}  // namespace

bool in_engine_sum() {
  if (at::GradMode::is_enabled()) return false;
  const auto node = torch::autograd::get_current_node();
  if (node == nullptr) return false;
  return t_backward_functions.empty() || t_backward_functions.back() != node->sequence_nr();
}

// can_accumulate_inplace, but for the Meta check: dense and the last reference to it and to its storage.
bool holds_last_reference(const at::Tensor& t) {
  return t.is_non_overlapping_and_dense() && t.use_count() == 1 && t.has_storage() && t.storage().use_count() == 1;
}

// --- CTC loss ----------------------------------------------------------------------------------------------------
// F.ctc_loss with the lengths as tensors is aten::ctc_loss.Tensor, a composite (LossCTC.cpp) with two paths: for
// tensor-subclass-like inputs, ctc_loss_impl over the tensors (_ctc_loss.Tensor, which has no Meta kernel, and a mean
// dividing by target_lengths.clamp_min(1), a tensor of the lengths' device); else its fast path, the one every CPU
// and CUDA run takes: the lengths copied to contiguous int64 on the CPU (input_lengths.to(kCPU, kLong).contiguous()),
// read as int[] and passed to ctc_loss.IntList: _ctc_loss (log_alpha [B, T, 2 * max target length + 1], then the
// loss [B]: LibTorch's Meta kernel is ctc_loss_meta, the CPU's allocate_outputs) and, for the mean,
// at::tensor(target lengths, the loss's options).clamp_min(1). Meta tensors are subclass-like (kTensorSubclassLike
// has BackendComponent::MetaBit), so on Meta the estimate took the first path and failed ("_ctc_loss.Tensor has no
// Meta kernel"): a speech model trained with CTC could be measured but not estimated. This kernel takes the fast path
// on Meta, reading the lengths where the device reads them: the CPU tensors a training loop passes. Lengths on the
// Meta device hold no values (log_alpha's size is the longest target's), so the estimate refuses them by name.

at::Tensor ctc_loss_tensor(const at::Tensor& log_probs, const at::Tensor& targets, const at::Tensor& input_lengths,
                           const at::Tensor& target_lengths, int64_t blank, int64_t reduction, bool zero_infinity) {
  if (input_lengths.is_meta() || target_lengths.is_meta()) {
    // memgate._meta.data_dependent_op names the op from this text
    throw std::runtime_error(
        "the lengths of aten::ctc_loss: attempted to run this operator with Meta tensors, whose values its sizes "
        "depend on (input_lengths and target_lengths on the Meta device; pass them as CPU tensors or lists)");
  }
  TORCH_CHECK(at::isIntegralType(input_lengths.scalar_type(), /*includeBool=*/false), "input_lengths must be integral");
  TORCH_CHECK(at::isIntegralType(target_lengths.scalar_type(), /*includeBool=*/false),
              "target_lengths must be integral");
  // The device's copy of each length tensor that is not contiguous int64 on the CPU: on the CPU's allocator, held
  // for the call; on Meta a tensor of its bytes, as a CPU estimate counts the CPU.
  auto copy_of = [](const at::Tensor& lengths) {
    const bool copies = lengths.device().type() != at::kCPU || lengths.scalar_type() != at::kLong ||
                        !lengths.is_contiguous();
    return copies && for_cpu() ? at::empty({lengths.numel()}, at::TensorOptions().dtype(at::kLong).device(at::kMeta))
                               : at::Tensor();
  };
  const auto held_input = copy_of(input_lengths);
  const auto held_target = copy_of(target_lengths);
  const auto il = input_lengths.to(at::kCPU, at::kLong).contiguous();
  const auto tl = target_lengths.to(at::kCPU, at::kLong).contiguous();
  return at::ctc_loss(log_probs, targets, at::IntArrayRef(il.const_data_ptr<int64_t>(), il.numel()),
                      at::IntArrayRef(tl.const_data_ptr<int64_t>(), tl.numel()), blank, reduction, zero_infinity);
}

// _ctc_loss's backward (int[] lengths), as ctc_loss_backward_cpu_template allocates: the gradient, full_like(log_probs)
// contiguous, then log_beta, empty_like(log_alpha) contiguous, freed on return. CUDA's kernel is not modelled apart.
at::Tensor ctc_loss_backward(const at::Tensor& grad, const at::Tensor& log_probs, const at::Tensor& targets,
                             at::IntArrayRef input_lengths, at::IntArrayRef target_lengths,
                             const at::Tensor& neg_log_likelihood, const at::Tensor& log_alpha, int64_t blank,
                             bool zero_infinity) {
  (void)grad, (void)targets, (void)input_lengths, (void)target_lengths, (void)neg_log_likelihood, (void)blank;
  (void)zero_infinity;
  auto result = at::empty(log_probs.sizes(), log_probs.options().memory_format(at::MemoryFormat::Contiguous));
  const auto log_beta = at::empty(log_alpha.sizes(), log_alpha.options().memory_format(at::MemoryFormat::Contiguous));
  return result;
}

void track_backward_functions() {
  at::addGlobalCallback(at::RecordFunctionCallback(&enter_backward_function, &exit_backward_function)
                            .scopes({at::RecordScope::BACKWARD_FUNCTION}));
}

}  // namespace memgate::meta_kernels
