// What memgate's Meta kernels share across their files (src/estimate/meta_*.cpp, by trade: registration in
// meta_kernels.cpp, plain ops in meta_ops.cpp, oneDNN's layouts in meta_onednn.cpp, convolution and cuDNN in
// meta_convolution.cpp, attention in meta_attention.cpp, autograd's bookkeeping in meta_autograd.cpp): the target
// they follow, and the kernels meta_kernels.cpp registers. Private to src/estimate/.
#pragma once

#include "memgate/estimate/meta_kernels.h"

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>
#include <torch/library.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <tuple>
#include <vector>

namespace memgate::meta_kernels {

// --- the target (meta_kernels.cpp) ----------------------------------------------------------------------------
/// Whether the kernels speak for the CPU (else CUDA).
[[nodiscard]] bool for_cpu();
/// The CPU with its host's kernels: oneDNN where PyTorch picks it.
[[nodiscard]] bool for_cpu_host();

[[nodiscard]] inline at::ScalarType accumulate_type(at::ScalarType t) {
  return t == at::kHalf || t == at::kBFloat16 ? at::kFloat : t;
}

// --- plain ops (meta_ops.cpp) ----------------------------------------------------------------------------------
/// CUDA's reduction buffers (staging, semaphores) for a sum of `self` over `dims` into `out_dtype`, allocated and
/// freed; nothing for the CPU.
void cuda_reduction_buffers(const at::Tensor& self, at::OptionalIntArrayRef dims, at::ScalarType out_dtype);
/// The CPU's casts of inputs of another dtype than `common` (temporaries held while the returned vector lives).
[[nodiscard]] std::vector<at::Tensor> cpu_input_casts(at::ScalarType common,
                                                      std::initializer_list<const at::Tensor*> inputs);

at::Tensor sum(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim, std::optional<at::ScalarType> dtype);
at::Tensor mean(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim,
                std::optional<at::ScalarType> dtype);
at::Tensor var_correction(const at::Tensor& self, at::OptionalIntArrayRef dims, const std::optional<at::Scalar>& c,
                          bool keepdim);
at::Tensor mse_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction);
at::Tensor mse_loss_backward(const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
                             int64_t reduction);
at::Tensor prelu_kernel_meta(const at::Tensor& self, const at::Tensor& weight);
std::tuple<at::Tensor, at::Tensor> prelu_kernel_backward_meta(const at::Tensor& grad, const at::Tensor& self,
                                                              const at::Tensor& weight);
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_group_norm_meta(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    c10::SymInt n, c10::SymInt c, c10::SymInt hxw, int64_t group, double eps);
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_group_norm_backward_meta(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean, const at::Tensor& rstd,
    const std::optional<at::Tensor>& weight, c10::SymInt n, c10::SymInt c, c10::SymInt hxw, int64_t group,
    std::array<bool, 3> mask);
at::Tensor hardtanh_meta(const at::Tensor& self, const at::Scalar& min, const at::Scalar& max);
at::Tensor hardtanh_backward_meta(const at::Tensor& grad_output, const at::Tensor& self, const at::Scalar& min,
                                  const at::Scalar& max);
at::Tensor roll_meta(const at::Tensor& self, c10::SymIntArrayRef shifts, at::IntArrayRef dims);
at::Tensor& abs_out_meta(const at::Tensor& self, at::Tensor& out);
std::tuple<at::Tensor, at::Tensor> nll_loss2d_forward_meta(const at::Tensor& self, const at::Tensor& target,
                                                           const std::optional<at::Tensor>& weight, int64_t reduction,
                                                           c10::SymInt ignore_index);
at::Tensor nll_loss2d_backward_meta(const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
                                    const std::optional<at::Tensor>& weight, int64_t reduction,
                                    c10::SymInt ignore_index, const at::Tensor& total_weight);
at::Tensor index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index);
at::Tensor embedding_dense_backward(const at::Tensor& grad_output, const at::Tensor& indices, int64_t num_weights,
                                    int64_t padding_idx, bool scale_grad_by_freq);
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm(const at::Tensor& input, at::IntArrayRef normalized,
                                                                 const std::optional<at::Tensor>& weight,
                                                                 const std::optional<at::Tensor>& bias, double eps);
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, at::IntArrayRef normalized, const at::Tensor& mean,
    const at::Tensor& rstd, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    std::array<bool, 3> mask);
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var, bool training,
    double momentum, double eps);
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
    const std::optional<at::Tensor>& save_mean, const std::optional<at::Tensor>& save_invstd, bool train, double eps,
    std::array<bool, 3> mask);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_with_update(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    at::Tensor& running_mean, at::Tensor& running_var, double momentum, double eps);
std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& weight,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
    const std::optional<at::Tensor>& save_mean, const std::optional<at::Tensor>& save_var, bool update, double eps,
    std::array<bool, 3> mask, const at::Tensor& reserve);
at::Tensor relu(const at::Tensor& self);
at::Tensor& relu_(at::Tensor& self);
at::Tensor flip(const at::Tensor& self, at::IntArrayRef dims);
at::Tensor matrix_product(const at::Tensor& a, const at::Tensor& b);
at::Tensor addmm(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                 const at::Scalar& alpha);
std::tuple<at::Tensor, at::Tensor> log_sigmoid_forward(const at::Tensor& self);
at::Tensor log_sigmoid_backward(const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& buffer);
at::Tensor where(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other);
at::Tensor& where_out(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other, at::Tensor& out);
void amp_unscale(at::TensorList grads, at::Tensor& found_inf, const at::Tensor& inv_scale);
at::Tensor& amp_update_scale(at::Tensor& self, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                             double growth_factor, double backoff_factor, int64_t growth_interval);
at::Tensor add(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha);
at::Tensor sub(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha);
at::Tensor softmax(const at::Tensor& self, int64_t dim, bool half_to_float);
at::Tensor log_softmax(const at::Tensor& self, int64_t dim, bool half_to_float);
at::Tensor softmax_backward(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim,
                            at::ScalarType input_dtype);
at::Tensor log_softmax_backward(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim,
                                at::ScalarType input_dtype);
at::Tensor scatter_src(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src);
at::Tensor scatter_value(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Scalar& value);
at::Tensor scatter_reduce_two(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                              c10::string_view reduce, bool include_self);
at::Tensor scatter_add(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src);
std::tuple<at::Tensor, at::Tensor> sort_stable(const at::Tensor& self, std::optional<bool> stable, int64_t dim,
                                               bool descending);
at::Tensor avg_pool2d(const at::Tensor& self, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                      at::IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                      std::optional<int64_t> divisor_override);
at::Tensor avg_pool3d(const at::Tensor& self, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                      at::IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                      std::optional<int64_t> divisor_override);
at::Tensor avg_pool2d_backward(const at::Tensor& grad_output, const at::Tensor& self, at::IntArrayRef kernel_size,
                               at::IntArrayRef stride, at::IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                               std::optional<int64_t> divisor_override);
at::Tensor avg_pool3d_backward(const at::Tensor& grad_output, const at::Tensor& self, at::IntArrayRef kernel_size,
                               at::IntArrayRef stride, at::IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                               std::optional<int64_t> divisor_override);
std::tuple<at::Tensor, at::Tensor> max_pool2d_with_indices(const at::Tensor& self, at::IntArrayRef kernel_size,
                                                           at::IntArrayRef stride, at::IntArrayRef padding,
                                                           at::IntArrayRef dilation, bool ceil_mode);
at::Tensor max_pool2d_with_indices_backward(const at::Tensor& grad_output, const at::Tensor& self,
                                            at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                            at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode,
                                            const at::Tensor& indices);
std::tuple<at::Tensor, at::Tensor> adaptive_max_pool2d(const at::Tensor& self, at::IntArrayRef output_size);
at::Tensor adaptive_max_pool2d_backward(const at::Tensor& grad_output, const at::Tensor& self,
                                        const at::Tensor& indices);
at::Tensor adaptive_max_pool3d_backward(const at::Tensor& grad_output, const at::Tensor& self,
                                        const at::Tensor& indices);
at::Tensor& arange_out(const at::Scalar& start, const at::Scalar& end, const at::Scalar& step, at::Tensor& out);
const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format);
void fused_optimizer_in_place(const c10::OperatorHandle& op, torch::jit::Stack* stack);


// The binary ops whose .Scalar forms wrap the number and call them (mul, true division; build_borrowing_binary_op and
// its float form, which takes integer inputs to the default float dtype) and the comparisons
// (build_borrowing_comparison_op), with the CPU's casts of their inputs.
using BinaryMeta = at::Tensor (*)(const at::Tensor&, const at::Tensor&);
template <BinaryMeta op, bool to_float = false>
at::Tensor binary_cast_on_cpu(const at::Tensor& self, const at::Tensor& other) {
  auto common = at::result_type(self, other);
  if (to_float && at::isIntegralType(common, /*includeBool=*/true)) {
    common = c10::typeMetaToScalarType(c10::get_default_dtype());
  }
  const auto casts = cpu_input_casts(common, {&self, &other});
  return op(self, other);
}

// A comparison with a number (eq.Scalar, ...): its structured kernel wraps the number (a CPU tensor the iterator owns,
// freed before the casts) and compares as with a tensor.
template <BinaryMeta op>
at::Tensor compare_scalar_cast_on_cpu(const at::Tensor& self, const at::Scalar& other) {
  std::vector<at::Tensor> casts;
  const auto wrapped = at::native::wrapped_scalar_tensor(other);
  casts = cpu_input_casts(at::result_type(self, wrapped), {&self, &wrapped});
  return op(self, wrapped);
}

// --- oneDNN on the CPU (meta_onednn.cpp) ----------------------------------------------------------------------
/// Whether the CPU's oneDNN takes this dtype (bf16, fp16) on this host.
[[nodiscard]] bool cpu_mkldnn_takes(at::ScalarType dtype);
/// Whether the CPU (with its host's kernels) runs this 2-D convolution through oneDNN.
[[nodiscard]] bool cpu_uses_mkldnn(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                                   at::IntArrayRef dilation, int64_t groups);
/// oneDNN's 2-D convolution (transposed or not) of output `shape` in `options`: what it holds around the output.
at::Tensor onednn_convolution(const at::Tensor& input, const at::Tensor& weight, const std::vector<int64_t>& shape,
                              const at::TensorOptions& options, bool transposed, int64_t groups);
/// oneDNN's backward of a 2-D convolution that is not transposed.
std::tuple<at::Tensor, at::Tensor, at::Tensor> onednn_convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
    at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups, std::array<bool, 3> mask);
/// A bf16 product of `a` and an n-column matrix through oneDNN's brgemm: its scratchpad, allocated and freed;
/// whether oneDNN took it.
bool cpu_bf16_matmul_scratch(const at::Tensor& a, int64_t n);

// --- convolution and cuDNN (meta_convolution.cpp) -------------------------------------------------------------
at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                       at::IntArrayRef output_padding, int64_t groups);
std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
    at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed, at::IntArrayRef output_padding, int64_t groups,
    std::array<bool, 3> mask);

// --- attention (meta_attention.cpp) ---------------------------------------------------------------------------
at::Tensor meta_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const std::optional<at::Tensor>& attn_mask, double dropout_p, bool causal,
                          std::optional<double> scale, bool enable_gqa);
std::tuple<at::Tensor, at::Tensor> flash_attention_cpu(const at::Tensor& query, const at::Tensor& key,
                                                       const at::Tensor& value, double dropout_p, bool causal,
                                                       const std::optional<at::Tensor>& mask,
                                                       std::optional<double> scale);
std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_attention_cpu_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& out, const at::Tensor& logsumexp, double dropout_p, bool causal,
    const std::optional<at::Tensor>& mask, std::optional<double> scale);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor, at::Tensor, at::Tensor>
flash_attention_cuda(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, double dropout_p,
                     bool causal, bool return_debug_mask, std::optional<double> scale);
std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_attention_cuda_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& out, const at::Tensor& logsumexp, const at::Tensor& cum_seq_q, const at::Tensor& cum_seq_k,
    int64_t max_q, int64_t max_k, double dropout_p, bool causal, const at::Tensor& philox_seed,
    const at::Tensor& philox_offset, std::optional<double> scale);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> efficient_attention_cuda(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const std::optional<at::Tensor>& bias,
    bool compute_lse, double dropout_p, bool causal, std::optional<double> scale);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> efficient_attention_cuda_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& bias, const at::Tensor& out, const at::Tensor& logsumexp, const at::Tensor& philox_seed,
    const at::Tensor& philox_offset, double dropout_p, std::array<bool, 4> grad_input_mask, bool causal,
    std::optional<double> scale);

std::tuple<at::Tensor, at::Tensor, at::Tensor> transform_bias_rescale_qkv(const at::Tensor& qkv,
                                                                          const at::Tensor& qkv_bias,
                                                                          int64_t num_head);
at::Tensor masked_softmax(const at::Tensor& input, const at::Tensor& mask, std::optional<int64_t> dim,
                          std::optional<int64_t> mask_type);
std::tuple<at::Tensor, at::Tensor> native_multi_head_attention(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, int64_t embed_dim, int64_t num_head,
    const at::Tensor& qkv_weight, const at::Tensor& qkv_bias, const at::Tensor& proj_weight,
    const at::Tensor& proj_bias, const std::optional<at::Tensor>& mask, bool need_weights, bool average_attn_weights,
    std::optional<int64_t> mask_type);
at::Tensor transformer_encoder_layer(const at::Tensor& src, int64_t embed_dim, int64_t num_heads,
                                     const at::Tensor& qkv_weight, const at::Tensor& qkv_bias,
                                     const at::Tensor& proj_weight, const at::Tensor& proj_bias, bool use_gelu,
                                     bool norm_first, double eps, const at::Tensor& norm_weight_1,
                                     const at::Tensor& norm_bias_1, const at::Tensor& norm_weight_2,
                                     const at::Tensor& norm_bias_2, const at::Tensor& ffn_weight_1,
                                     const at::Tensor& ffn_bias_1, const at::Tensor& ffn_weight_2,
                                     const at::Tensor& ffn_bias_2, const std::optional<at::Tensor>& mask,
                                     std::optional<int64_t> mask_type);

// --- autograd's bookkeeping (meta_autograd.cpp) ---------------------------------------------------------------
/// Follows the backward functions the engine runs (a RecordFunction callback), once per process.
void track_backward_functions();
/// Whether this op is the autograd engine summing gradients (InputBuffer::accumulate), not a node's function.
[[nodiscard]] bool in_engine_sum();
/// can_accumulate_inplace, but for the Meta check: dense and the last reference to it and to its storage.
[[nodiscard]] bool holds_last_reference(const at::Tensor& t);
/// ctc_loss.Tensor at the autograd key: the device's path, the lengths read from the CPU tensors passed.
at::Tensor ctc_loss_tensor(const at::Tensor& log_probs, const at::Tensor& targets, const at::Tensor& input_lengths,
                           const at::Tensor& target_lengths, int64_t blank, int64_t reduction, bool zero_infinity);
at::Tensor ctc_loss_backward(const at::Tensor& grad, const at::Tensor& log_probs, const at::Tensor& targets,
                             at::IntArrayRef input_lengths, at::IntArrayRef target_lengths,
                             const at::Tensor& neg_log_likelihood, const at::Tensor& log_alpha, int64_t blank,
                             bool zero_infinity);

}  // namespace memgate::meta_kernels
