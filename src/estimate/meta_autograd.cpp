// The autograd engine's bookkeeping on the Meta device: which op is the engine summing gradients, so that add sums
// in place where the device's engine does (meta_ops.cpp's add).
#include "meta_kernels_internal.h"

#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/function.h>

#include <cstdint>
#include <memory>
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

void track_backward_functions() {
  at::addGlobalCallback(at::RecordFunctionCallback(&enter_backward_function, &exit_backward_function)
                            .scopes({at::RecordScope::BACKWARD_FUNCTION}));
}

}  // namespace memgate::meta_kernels
