// Meta kernels for the ops LibTorch's C++ lacks them for (Python registers its own in torch/_meta_registrations.py):
// each returns tensors of the exact shapes and dtypes the target device's kernel returns, allocated in the same
// order, so that the counting Meta allocator sees what that device's allocator would. Registered once per process;
// each kernel reads what the estimate is for from this thread's EstimateContext (estimate_context.h).
//
// This file holds the table of what is registered; the kernels live by trade in meta_ops.cpp,
// meta_onednn.cpp, meta_convolution.cpp, meta_attention.cpp and meta_autograd.cpp (meta_kernels_internal.h).
#include "memgate/estimate/meta_kernels.h"

#include "memgate/estimate/estimate_context.h"
#include "meta_kernels_internal.h"

#include <ATen/ops/div_meta_dispatch.h>
#include <ATen/ops/eq_meta_dispatch.h>
#include <ATen/ops/ge_meta_dispatch.h>
#include <ATen/ops/gt_meta_dispatch.h>
#include <ATen/ops/le_meta_dispatch.h>
#include <ATen/ops/lt_meta_dispatch.h>
#include <ATen/ops/mul_meta_dispatch.h>
#include <ATen/ops/ne_meta_dispatch.h>
#include <torch/library.h>

#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace memgate {
namespace meta_kernels {

bool for_cpu() { return estimate_context().target == EstimateTarget::kCpu; }
bool for_cpu_host() { return for_cpu() && estimate_context().cpu_kernels == CpuKernels::kHost; }

}  // namespace meta_kernels

std::optional<std::string> op_without_meta_kernel(std::string_view message) {
  // LibTorch's dispatcher: "Could not run 'aten::roll' with arguments from the 'Meta' backend. ..."
  constexpr std::string_view cpp_prefix = "Could not run '";
  constexpr std::string_view cpp_suffix = "' with arguments from the 'Meta' backend";
  if (const auto at = message.find(cpp_prefix); at != std::string_view::npos) {
    const auto begin = at + cpp_prefix.size();
    const auto end = message.find(cpp_suffix, begin);
    if (end != std::string_view::npos) return std::string(message.substr(begin, end - begin));
  }
  // torch's Python fallback for ops with a Python registration but no kernel on Meta:
  // "aten::roll: attempted to run this operator with Meta tensors, but there was no fake impl or Meta kernel ..."
  constexpr std::string_view python_suffix = ": attempted to run this operator with Meta tensors";
  if (const auto end = message.find(python_suffix); end != std::string_view::npos) {
    auto begin = message.rfind(' ', end);
    begin = begin == std::string_view::npos ? 0 : begin + 1;
    if (begin < end) return std::string(message.substr(begin, end - begin));
  }
  // torch.library.custom_op without register_fake: "There was no fake impl registered for <CustomOpDef(ns::op)>."
  constexpr std::string_view custom_prefix = "There was no fake impl registered for <CustomOpDef(";
  if (const auto at = message.find(custom_prefix); at != std::string_view::npos) {
    const auto begin = at + custom_prefix.size();
    const auto end = message.find(")>", begin);
    if (end != std::string_view::npos) return std::string(message.substr(begin, end - begin));
  }
  return std::nullopt;
}

std::optional<std::string> describe_missing_meta_kernel(std::string_view message, bool in_python,
                                                       const std::string& module) {
  const auto op = op_without_meta_kernel(message);
  if (!op) return std::nullopt;
  std::string out = "the op " + *op + " has no Meta kernel (" +
                    (in_python ? std::string("not LibTorch's, memgate's or torch's Python one")
                               : std::string("not LibTorch's or memgate's; torch's Python ones serve the estimates of "
                                             "Python fixtures alone")) +
                    ")";
  if (!module.empty()) out += ", called in the forward of " + module;
  out += ": the Meta device cannot run it, so the estimate cannot; measure the fixture instead (memgate profile)";
  return out;
}
void register_meta_kernels() {
  using namespace meta_kernels;
  register_meta_autocast();
  static std::once_flag once;
  std::call_once(once, [] {
    static torch::Library autograd(torch::Library::IMPL, "aten", c10::DispatchKey::AutogradMeta, __FILE__, __LINE__);
    autograd.impl("scaled_dot_product_attention", TORCH_FN(meta_attention));
    autograd.impl("ctc_loss.Tensor", TORCH_FN(ctc_loss_tensor));
    static torch::Library lib(torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__, __LINE__);
    lib.impl("convolution_overrideable", TORCH_FN(convolution));
    lib.impl("convolution_backward_overrideable", TORCH_FN(convolution_backward));
    lib.impl("index_select", TORCH_FN(index_select));
    lib.impl("embedding_dense_backward", TORCH_FN(embedding_dense_backward));
    lib.impl("native_layer_norm", TORCH_FN(native_layer_norm));
    lib.impl("native_layer_norm_backward", TORCH_FN(native_layer_norm_backward));
    lib.impl("native_batch_norm", TORCH_FN(native_batch_norm));
    lib.impl("native_batch_norm_backward", TORCH_FN(native_batch_norm_backward));
    lib.impl("_batch_norm_with_update", TORCH_FN(batch_norm_with_update));
    lib.impl("batch_norm_backward", TORCH_FN(batch_norm_backward));
    lib.impl("_scaled_dot_product_flash_attention_for_cpu", TORCH_FN(flash_attention_cpu));
    lib.impl("_scaled_dot_product_flash_attention_for_cpu_backward", TORCH_FN(flash_attention_cpu_backward));
    lib.impl("_scaled_dot_product_flash_attention", TORCH_FN(flash_attention_cuda));
    lib.impl("_scaled_dot_product_flash_attention_backward", TORCH_FN(flash_attention_cuda_backward));
    lib.impl("_scaled_dot_product_efficient_attention", TORCH_FN(efficient_attention_cuda));
    lib.impl("_scaled_dot_product_efficient_attention_backward", TORCH_FN(efficient_attention_cuda_backward));
    lib.impl("_transform_bias_rescale_qkv", TORCH_FN(transform_bias_rescale_qkv));
    lib.impl("_masked_softmax", TORCH_FN(masked_softmax));
    lib.impl("_native_multi_head_attention", TORCH_FN(native_multi_head_attention));
    lib.impl("_transformer_encoder_layer_fwd", TORCH_FN(transformer_encoder_layer));
    lib.impl("relu", TORCH_FN(relu));
    lib.impl("flip", TORCH_FN(flip));
    lib.impl("var.correction", TORCH_FN(var_correction));
    lib.impl("std.correction", TORCH_FN(var_correction));
    lib.impl("mse_loss", TORCH_FN(mse_loss));
    lib.impl("mse_loss_backward", TORCH_FN(mse_loss_backward));
    lib.impl("_prelu_kernel", TORCH_FN(prelu_kernel_meta));
    lib.impl("_prelu_kernel_backward", TORCH_FN(prelu_kernel_backward_meta));
    lib.impl("native_group_norm", TORCH_FN(native_group_norm_meta));
    lib.impl("native_group_norm_backward", TORCH_FN(native_group_norm_backward_meta));
    lib.impl("hardtanh", TORCH_FN(hardtanh_meta));
    lib.impl("hardtanh_backward", TORCH_FN(hardtanh_backward_meta));
    lib.impl("roll", TORCH_FN(roll_meta));
    lib.impl("abs.out", TORCH_FN(abs_out_meta));
    lib.impl("nll_loss2d_forward", TORCH_FN(nll_loss2d_forward_meta));
    lib.impl("nll_loss2d_backward", TORCH_FN(nll_loss2d_backward_meta));
    lib.impl("log_sigmoid_forward", TORCH_FN(log_sigmoid_forward));
    lib.impl("log_sigmoid_backward", TORCH_FN(log_sigmoid_backward));
    lib.impl("relu_", TORCH_FN(relu_));
    lib.impl("where.self", TORCH_FN(where));
    lib.impl("mm", TORCH_FN(matrix_product));
    lib.impl("addmm", TORCH_FN(addmm));
    lib.impl("where.self_out", TORCH_FN(where_out));
    lib.impl("_amp_foreach_non_finite_check_and_unscale_", TORCH_FN(amp_unscale));
    lib.impl("_amp_update_scale_", TORCH_FN(amp_update_scale));
    lib.impl("add.Tensor", TORCH_FN(add));
    lib.impl("sub.Tensor", TORCH_FN(sub));
    lib.impl("mul.Tensor", TORCH_FN((binary_cast_on_cpu<static_cast<BinaryMeta>(&at::meta::mul)>)));
    lib.impl("div.Tensor", TORCH_FN((binary_cast_on_cpu<static_cast<BinaryMeta>(&at::meta::div), true>)));
#define MEMGATE_COMPARISON(name)                                                                   \
  lib.impl(#name ".Tensor", TORCH_FN((binary_cast_on_cpu<static_cast<BinaryMeta>(&at::meta::name)>))); \
  lib.impl(#name ".Scalar", TORCH_FN((compare_scalar_cast_on_cpu<static_cast<BinaryMeta>(&at::meta::name)>)))
    MEMGATE_COMPARISON(eq);
    MEMGATE_COMPARISON(ne);
    MEMGATE_COMPARISON(lt);
    MEMGATE_COMPARISON(le);
    MEMGATE_COMPARISON(gt);
    MEMGATE_COMPARISON(ge);
#undef MEMGATE_COMPARISON
    lib.impl("sum.dim_IntList", TORCH_FN(sum));
    lib.impl("mean.dim", TORCH_FN(mean));
    lib.impl("_softmax", TORCH_FN(softmax));
    lib.impl("_log_softmax", TORCH_FN(log_softmax));
    lib.impl("_softmax_backward_data", TORCH_FN(softmax_backward));
    lib.impl("_log_softmax_backward_data", TORCH_FN(log_softmax_backward));
    lib.impl("scatter.src", TORCH_FN(scatter_src));
    lib.impl("scatter.value", TORCH_FN(scatter_value));
    lib.impl("scatter_reduce.two", TORCH_FN(scatter_reduce_two));
    lib.impl("scatter_add", TORCH_FN(scatter_add));
    lib.impl("sort.stable", TORCH_FN(sort_stable));
    lib.impl("avg_pool2d", TORCH_FN(avg_pool2d));
    lib.impl("avg_pool3d", TORCH_FN(avg_pool3d));
    lib.impl("avg_pool2d_backward", TORCH_FN(avg_pool2d_backward));
    lib.impl("avg_pool3d_backward", TORCH_FN(avg_pool3d_backward));
    lib.impl("max_pool2d_with_indices", TORCH_FN(max_pool2d_with_indices));
    lib.impl("max_pool2d_with_indices_backward", TORCH_FN(max_pool2d_with_indices_backward));
    lib.impl("adaptive_max_pool2d", TORCH_FN(adaptive_max_pool2d));
    lib.impl("adaptive_max_pool2d_backward", TORCH_FN(adaptive_max_pool2d_backward));
    lib.impl("adaptive_max_pool3d_backward", TORCH_FN(adaptive_max_pool3d_backward));
    lib.impl("arange.start_out", TORCH_FN(arange_out));
    lib.impl("resize_", TORCH_FN(resize_));
    lib.impl("_ctc_loss_backward", TORCH_FN(ctc_loss_backward));
    for (const auto* op : {"_fused_adamw_", "_fused_adamw_.tensor_lr", "_fused_adam_", "_fused_adam_.tensor_lr",
                           "_fused_sgd_", "_fused_sgd_.tensor_lr"}) {
      lib.impl(op, torch::CppFunction::makeFromBoxedFunction<&fused_optimizer_in_place>());
    }
    track_backward_functions();
  });
}

}  // namespace memgate
