// Meta kernels for plain ops: reductions, losses, norms, embedding, matmul, elementwise ops and their casts on the
// CPU, resize_, and the ops LibTorch's C++ has no Meta kernel for. Each allocates as the target's kernel does.
#include "meta_kernels_internal.h"

#include "memgate/estimate/cuda_reduce.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/OpMathType.h>
#include <ATen/ScalarOps.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/core/Reduction.h>
#include <ATen/ops/_log_softmax_backward_data_meta_dispatch.h>
#include <ATen/ops/_log_softmax_meta_dispatch.h>
#include <ATen/ops/_softmax_backward_data_meta_dispatch.h>
#include <ATen/ops/_softmax_meta_dispatch.h>
#include <ATen/ops/adaptive_max_pool2d_backward_meta_dispatch.h>
#include <ATen/ops/adaptive_max_pool2d_meta_dispatch.h>
#include <ATen/ops/adaptive_max_pool3d_backward_meta_dispatch.h>
#include <ATen/ops/add_meta_dispatch.h>
#include <ATen/ops/avg_pool2d_backward_meta_dispatch.h>
#include <ATen/ops/avg_pool2d_meta_dispatch.h>
#include <ATen/ops/avg_pool3d_backward_meta_dispatch.h>
#include <ATen/ops/avg_pool3d_meta_dispatch.h>
#include <ATen/ops/max_pool2d_with_indices_backward_meta_dispatch.h>
#include <ATen/ops/max_pool2d_with_indices_meta_dispatch.h>
#include <ATen/ops/mean_meta_dispatch.h>
#include <ATen/ops/mse_loss_meta_dispatch.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/scatter_add_meta_dispatch.h>
#include <ATen/ops/scatter_meta_dispatch.h>
#include <ATen/ops/scatter_reduce_meta_dispatch.h>
#include <ATen/ops/sort_meta_dispatch.h>
#include <ATen/ops/sub_meta_dispatch.h>
#include <ATen/ops/sum_meta_dispatch.h>
#include <torch/csrc/autograd/function.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

namespace memgate::meta_kernels {

// --- CUDA's reductions -------------------------------------------------------------------------------------
// CUDA's sum and mean (gpu_reduce_kernel) take a staging buffer and semaphores from the caching allocator where they
// split each output's inputs over several blocks, after the output, freed before the op returns (cuda_reduce.h). For
// the CPU, nothing.
void cuda_reduction_buffers(const at::Tensor& self, at::OptionalIntArrayRef dims, at::ScalarType out_dtype) {
  if (for_cpu() || self.numel() == 0) return;
  // make_reduction_from_out_ty on CUDA: an fp16 or bf16 input summed into fp32 is read as it is; any other input of
  // another dtype than the output's is first cast (to(), which keeps a dense input's strides; the cast's own bytes
  // are not counted here, as they are not for the CPU).
  const auto self_dtype = self.scalar_type();
  const bool lowp_to_f32 = (self_dtype == at::kHalf || self_dtype == at::kBFloat16) && out_dtype == at::kFloat;
  const auto in_dtype = lowp_to_f32 ? self_dtype : out_dtype;
  const bool cast = in_dtype != self_dtype;
  ReduceOperands operands;
  operands.sizes = self.sizes().vec();
  operands.strides = self.strides().vec();
  if (cast && !self.is_non_overlapping_and_dense()) {
    std::int64_t stride = 1;
    for (auto d = self.dim(); d-- > 0;) {
      operands.strides[static_cast<std::size_t>(d)] = stride;
      stride *= std::max<std::int64_t>(self.size(d), 1);
    }
  }
  operands.input_offset_bytes = cast ? 0 : self.storage_offset() * self.element_size();
  if (dims.has_value() && !dims->empty() && self.dim() > 0) {  // else all of them
    operands.reduced.assign(operands.sizes.size(), false);
    for (const auto d : *dims) operands.reduced[static_cast<std::size_t>(at::maybe_wrap_dim(d, self.dim()))] = true;
  }
  operands.input_element_size = static_cast<int>(c10::elementSize(in_dtype));
  operands.output_element_size = static_cast<int>(c10::elementSize(out_dtype));
  operands.accumulate_size =
      in_dtype == at::kComplexHalf ? 8 : static_cast<int>(c10::elementSize(accumulate_type(in_dtype)));
  operands.input_vec_size = operands.input_element_size == 2 ? 8 : 4;
  operands.max_threads = in_dtype == at::kComplexDouble ? 256 : 512;
  operands.can_accumulate_in_output =
      !((in_dtype == at::kHalf || in_dtype == at::kBFloat16 || in_dtype == at::kComplexHalf) && out_dtype == in_dtype);
  const auto buffers = cuda_reduce_buffers(operands, estimated_cuda_reduce_device());
  const auto bytes = self.options().dtype(at::kByte);
  auto accumulation = buffers.accumulation_bytes > 0 ? at::empty({buffers.accumulation_bytes}, bytes) : at::Tensor();
  for (const auto& launch : buffers.launches) {
    if (launch.staging_bytes == 0) continue;
    auto staging = at::empty({launch.staging_bytes}, bytes);
    auto semaphores = at::empty({launch.semaphore_bytes}, bytes);
  }
}

at::Tensor sum(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim,
               std::optional<at::ScalarType> dtype) {
  auto out = at::meta::sum(self, dims, keepdim, dtype);
  cuda_reduction_buffers(self, dims, out.scalar_type());
  return out;
}

// mean on the CPU (2.11's TORCH_IMPL_FUNC(mean_out), its CPU branch): a bf16 or fp16 mean sums into a float copy of
// the output (result.to(Float), freed after its copy_ back), sum_out casts an input of another dtype than the sum's
// into a temporary first, and the sum is divided in place by the element count, a wrapped int64 (8 bytes on the CPU)
// that div_'s iterator casts to the sum's dtype.
at::Tensor mean(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim,
                std::optional<at::ScalarType> dtype) {
  auto out = at::meta::mean(self, dims, keepdim, dtype);
  if (for_cpu()) {
    const bool half = out.scalar_type() == at::kHalf || out.scalar_type() == at::kBFloat16;
    const auto sum_dtype = half ? at::kFloat : out.scalar_type();
    at::Tensor temp;
    if (half) temp = at::empty_like(out, out.options().dtype(sum_dtype));
    if (self.scalar_type() != sum_dtype) (void)at::empty_like(self, self.options().dtype(sum_dtype));
    const auto count = at::empty({}, at::TensorOptions().dtype(at::kLong));
    const auto cast = at::empty({}, at::TensorOptions().dtype(sum_dtype));
  }
  cuda_reduction_buffers(self, dims, out.scalar_type());
  return out;
}

// var / std with a correction (VICReg's variance term): the reduced output, real-valued, as sum's (on the CPU a
// Welford reduction that keeps no temporaries; on CUDA the reduction buffers taken as sum's).
at::Tensor var_correction(const at::Tensor& self, at::OptionalIntArrayRef dims, const std::optional<at::Scalar>& /*c*/,
                          bool keepdim) {
  auto out = at::meta::sum(self, dims, keepdim, c10::toRealValueType(self.scalar_type()));
  cuda_reduction_buffers(self, dims, out.scalar_type());
  return out;
}

// mse_loss's backward: the gradient of the input, a contiguous tensor of its shape (zeros_like, then the kernel).
// mse_loss with a reduction, as TORCH_IMPL_FUNC(mse_loss_out) runs on the device: the structured op's output is built
// at the broadcast shape (build_borrowing_binary_op) and resized to 0-dim, keeping that storage (LibTorch's Meta kernel
// does as much); the squared differences go to a temporary of that shape, reduced into the output by mean_out or
// sum_out. Measured on the CPU (torch.profiler's allocations, 2.11), a mean also takes an 8-byte scalar and one of the
// output's dtype on its way (its divisor). On CUDA the reduction's staging instead. Without the temporary a regression
// head's forward_peak was 7% low on a small MLP (py_meta_regress).
at::Tensor mse_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  if (reduction == at::Reduction::None) return at::meta::mse_loss(self, target, reduction);
  const auto shape = at::infer_size(self.sizes(), target.sizes());
  const auto dtype = at::result_type(self, target);
  const auto options = self.options().dtype(dtype);
  auto out = at::empty(shape, options);
  {
    const auto squared = at::empty(shape, options);
    if (for_cpu() && reduction == at::Reduction::Mean) {
      [[maybe_unused]] const auto count = at::empty({}, options.dtype(at::kLong));
      [[maybe_unused]] const auto divisor = at::empty({}, options);
    }
    cuda_reduction_buffers(squared, std::nullopt, dtype);
  }
  out.resize_({});
  return out;
}

at::Tensor mse_loss_backward(const at::Tensor& /*grad_output*/, const at::Tensor& self, const at::Tensor& /*target*/,
                             int64_t /*reduction*/) {
  return at::empty(self.sizes(), self.options());
}

// --- ops the CPU runs that LibTorch's C++ has no Meta kernel for ------------------------------------------------
// torch's Python registers Meta kernels for these (torch/_meta_registrations.py, torch/_decomp), which a Python
// fixture's estimate keeps (python/memgate/_meta.py); a zoo or TorchScript fixture's estimate runs in C++ alone, where
// the Meta device had none and the estimate stopped at the op (issue 59). Each allocates its outputs as the CPU's
// kernel does (the layouts the Python kernels give, which the Python fixtures' estimates equal their measurements
// with: tests/python/meta_ops_test.cpp).

namespace {

// A binary TensorIterator op's output: in `self`'s layout at its shape, else contiguous at the broadcast shape.
at::Tensor binary_output_meta(const at::Tensor& self, const at::Tensor& other) {
  const auto shape = at::infer_size(self.sizes(), other.sizes());
  return shape == self.sizes().vec() ? at::empty_like(self) : at::empty(shape, self.options());
}

}  // namespace


// _prelu_kernel (PReLU, its weight already viewed to broadcast).
at::Tensor prelu_kernel_meta(const at::Tensor& self, const at::Tensor& weight) {
  return binary_output_meta(self, weight);
}

// _prelu_kernel_backward: the input's gradient and the weight's (the latter at the input's shape, reduced by autograd).
std::tuple<at::Tensor, at::Tensor> prelu_kernel_backward_meta(const at::Tensor& /*grad*/, const at::Tensor& self,
                                                              const at::Tensor& weight) {
  return {prelu_kernel_meta(self, weight), prelu_kernel_meta(self, weight)};
}

// native_group_norm (group_norm.cpp): the output in the input's layout, then mean and rstd of (N, group) in the
// parameters' type (float for a reduced-precision input with float affine parameters: param_scalar_type).
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_group_norm_meta(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& /*bias*/,
    c10::SymInt n, c10::SymInt /*c*/, c10::SymInt /*hxw*/, int64_t group, double /*eps*/) {
  const bool mixed = weight.has_value() && weight->defined() && weight->scalar_type() != input.scalar_type();
  const auto dtype = mixed ? weight->scalar_type() : input.scalar_type();
  auto y = at::empty_like(input, input.suggest_memory_format());
  auto mean = at::empty({n.expect_int(), group}, input.options().dtype(dtype));
  auto rstd = at::empty({n.expect_int(), group}, input.options().dtype(dtype));
  return {y, mean, rstd};
}

// native_group_norm_backward: the input's gradient (in its layout), the weight's and the bias's (the weight's shape).
// On the CPU, the kernel for a contiguous input (GroupNormBackwardKernelImplInternal) then sums its internal gradients
// into ds and db, {N, C} each in the input's math type (float for bf16 and fp16), freed as it returns; its kernel for
// channels last is not modelled.
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_group_norm_backward_meta(
    const at::Tensor& /*grad_out*/, const at::Tensor& input, const at::Tensor& /*mean*/, const at::Tensor& /*rstd*/,
    const std::optional<at::Tensor>& weight, c10::SymInt n, c10::SymInt c, c10::SymInt /*hxw*/, int64_t /*group*/,
    std::array<bool, 3> mask) {
  const auto param = weight.has_value() && weight->defined() ? input.options().dtype(weight->scalar_type())
                                                             : input.options();
  at::Tensor dx, dgamma, dbeta;
  if (mask[0]) dx = at::empty_like(input, input.suggest_memory_format());
  if (mask[1]) dgamma = at::empty({c.expect_int()}, param);
  if (mask[2]) dbeta = at::empty({c.expect_int()}, param);
  if (for_cpu() && input.suggest_memory_format() == at::MemoryFormat::Contiguous) {
    const auto math = input.options().dtype(at::toOpMathType(input.scalar_type()));
    const auto ds = at::empty({n.expect_int(), c.expect_int()}, math);
    const auto db = at::empty({n.expect_int(), c.expect_int()}, math);
  }
  return {dx, dgamma, dbeta};
}

// hardtanh (ReLU6, a zoo's or TorchScript's): a unary TensorIterator output, in the input's layout.
at::Tensor hardtanh_meta(const at::Tensor& self, const at::Scalar& /*min*/, const at::Scalar& /*max*/) {
  return at::empty_like(self);
}

// hardtanh_backward (ReLU6's backward).
at::Tensor hardtanh_backward_meta(const at::Tensor& grad_output, const at::Tensor& self, const at::Scalar& /*min*/,
                                  const at::Scalar& /*max*/) {
  return binary_output_meta(self, grad_output);
}

// roll: a contiguous tensor of the input's shape (roll_cpu's empty_like, LEGACY_CONTIGUOUS_MEMORY_FORMAT).
at::Tensor roll_meta(const at::Tensor& self, c10::SymIntArrayRef /*shifts*/, at::IntArrayRef /*dims*/) {
  return at::empty(self.sizes(), self.options());
}

// abs.out (abs of an integer tensor: abs's composite allocates the result, then calls this): the out resized.
at::Tensor& abs_out_meta(const at::Tensor& self, at::Tensor& out) {
  if (out.sizes() != self.sizes()) out.resize_(self.sizes());
  return out;
}

// nll_loss2d_forward (2-D cross-entropy): the loss (per pixel without a reduction, else a scalar) and the total weight.
std::tuple<at::Tensor, at::Tensor> nll_loss2d_forward_meta(const at::Tensor& self, const at::Tensor& target,
                                                           const std::optional<at::Tensor>& /*weight*/,
                                                           int64_t reduction, c10::SymInt /*ignore_index*/) {
  auto output = reduction == at::Reduction::None ? at::empty(target.sizes(), self.options())
                                                 : at::empty({}, self.options());
  auto total_weight = at::empty({}, self.options());
  return {output, total_weight};
}

// nll_loss2d_backward: the input's gradient, zeros of its shape (contiguous), then the kernel scatters into it.
at::Tensor nll_loss2d_backward_meta(const at::Tensor& /*grad_output*/, const at::Tensor& self,
                                    const at::Tensor& /*target*/, const std::optional<at::Tensor>& /*weight*/,
                                    int64_t /*reduction*/, c10::SymInt /*ignore_index*/,
                                    const at::Tensor& /*total_weight*/) {
  return at::empty(self.sizes(), self.options());
}

// --- embedding -----------------------------------------------------------------------------------------------
at::Tensor index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  auto sizes = self.sizes().vec();
  if (!sizes.empty()) sizes[at::maybe_wrap_dim(dim, self.dim())] = index.numel();
  return at::empty(sizes, self.options());
}

// embedding's backward: the weight's gradient, zeros. On the CPU (Embedding.cpp's embedding_dense_backward_cpu) then a
// contiguous copy of the indices and of the output's gradient where they are not (the gradient of a sum comes back
// expanded), held until it returns. CUDA's are not modelled here.
at::Tensor embedding_dense_backward(const at::Tensor& grad_output, const at::Tensor& indices, int64_t num_weights,
                                   int64_t /*padding_idx*/, bool /*scale_grad_by_freq*/) {
  auto grad_weight = at::zeros({num_weights, grad_output.size(-1)}, grad_output.options());
  if (for_cpu()) {
    [[maybe_unused]] const auto indices_contig = indices.contiguous();
    [[maybe_unused]] const auto grad = grad_output.contiguous();
  }
  return grad_weight;
}

// --- layer norm ----------------------------------------------------------------------------------------------
// The CPU's layer norm, forward and backward (layer_norm_cpu, layer_norm_backward_cpu), first takes contiguous copies
// of its input, weight and bias where they are not (expect_contiguous: a permuted input, as ConvNeXt's and Swin's
// norms over channels last get), held until it returns (for the CPU only: CUDA's are not modelled here).
namespace {

std::vector<at::Tensor> cpu_contiguous_copies(std::initializer_list<const at::Tensor*> tensors) {
  std::vector<at::Tensor> copies;
  if (!for_cpu()) return copies;
  for (const auto* t : tensors) {
    if (t != nullptr && t->defined() && !t->is_contiguous()) {
      copies.push_back(at::empty_like(*t, at::MemoryFormat::Contiguous));
    }
  }
  return copies;
}

std::vector<int64_t> stat_shape(const at::Tensor& input, std::size_t normalized) {
  std::vector<int64_t> shape;
  const auto axis = input.dim() - static_cast<int64_t>(normalized);
  for (int64_t i = 0; i < input.dim(); ++i) shape.push_back(i < axis ? input.size(i) : 1);
  return shape;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm(const at::Tensor& input, at::IntArrayRef normalized,
                                                                 const std::optional<at::Tensor>& weight,
                                                                 const std::optional<at::Tensor>& bias, double) {
  int64_t m = 1;
  for (int64_t i = 0; i < input.dim() - static_cast<int64_t>(normalized.size()); ++i) m *= input.size(i);
  const auto copies = cpu_contiguous_copies({&input, weight ? &*weight : nullptr, bias ? &*bias : nullptr});
  auto y = at::empty_like(input, at::MemoryFormat::Contiguous);
  // Mean and rstd: CUDA keeps them in the accumulate type; the CPU in the input's, or fp32 when a reduced-precision
  // input meets fp32 parameters (autocast leaves layer_norm alone on the CPU).
  const bool mixed = weight && weight->defined() && weight->scalar_type() != input.scalar_type();
  const auto stats = input.options().dtype(!for_cpu() || mixed ? accumulate_type(input.scalar_type()) : input.scalar_type());
  auto mean = at::empty({m}, stats);
  auto rstd = at::empty({m}, stats);
  const auto shape = stat_shape(input, normalized.size());
  return {y, mean.view(shape), rstd.view(shape)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, at::IntArrayRef normalized, const at::Tensor&,
    const at::Tensor&, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    std::array<bool, 3> mask) {
  const auto copies = cpu_contiguous_copies({&input, weight ? &*weight : nullptr, bias ? &*bias : nullptr});
  at::Tensor dx, dgamma, dbeta;
  if (mask[0]) dx = at::empty_like(input, at::MemoryFormat::Contiguous);
  if (mask[1] && weight && weight->defined()) dgamma = at::empty_like(*weight, at::MemoryFormat::Contiguous);
  if (mask[2] && bias && bias->defined()) dbeta = at::empty_like(*bias, at::MemoryFormat::Contiguous);
  int64_t n = 1;
  for (const auto d : normalized) n *= d;
  if (for_cpu() && n > 0 && input.numel() > 0) {
    // The CPU's kernel (M > 0) takes a contiguous copy of the output's gradient (dY.contiguous(), an expanded one
    // from a sum's backward too), then reduces dgamma and dbeta through a {2, threads, N} buffer (one thread in a
    // probe); both are freed as it returns.
    const auto dy = cpu_contiguous_copies({&grad_out});
    if (dgamma.defined() || dbeta.defined()) (void)at::empty({2, 1, n}, input.options());
  }
  return {dx, dgamma, dbeta};
}

// --- batch norm ----------------------------------------------------------------------------------------------
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm(const at::Tensor& input,
                                                                 const std::optional<at::Tensor>&,
                                                                 const std::optional<at::Tensor>&,
                                                                 const std::optional<at::Tensor>&,
                                                                 const std::optional<at::Tensor>&, bool training,
                                                                 double, double) {
  auto out = at::empty_like(input, input.suggest_memory_format());
  const auto stats = input.options().dtype(accumulate_type(input.scalar_type()));
  if (for_cpu() && !training && accumulate_type(input.scalar_type()) != input.scalar_type()) {
    // The CPU's inference kernel for a reduced-precision input takes per-channel scale and shift in fp32.
    auto alpha = at::empty({input.size(1)}, stats);
    auto beta = at::empty({input.size(1)}, stats);
  }
  const auto c = training ? input.size(1) : 0;
  return {out, at::empty({c}, stats), at::empty({c}, stats)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm_backward(
    const at::Tensor& /*grad_out*/, const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&, bool, double, std::array<bool, 3> mask) {
  at::Tensor gi, gw, gb;
  const auto params = input.options().dtype(weight && weight->defined() ? weight->scalar_type() : input.scalar_type());
  if (mask[0]) gi = at::empty_like(input, input.suggest_memory_format());
  if (mask[1]) gw = at::empty({input.size(1)}, params);
  if (mask[2]) gb = at::empty({input.size(1)}, params);
  return {gi, gw, gb};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_with_update(
    const at::Tensor& input, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, at::Tensor&, at::Tensor&,
    double, double) {
  auto out = at::empty_like(input, input.suggest_memory_format());
  const auto stats = input.options().dtype(accumulate_type(input.scalar_type()));
  auto mean = at::empty({input.size(1)}, stats);
  auto invstd = at::empty({input.size(1)}, stats);
  auto reserve = at::empty({0}, input.options().dtype(at::kByte));
  return {out, mean, invstd, reserve};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_backward(
    const at::Tensor& /*grad_out*/, const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, bool, double,
    std::array<bool, 3> mask, const at::Tensor&) {
  at::Tensor gi, gw, gb;
  if (mask[0]) gi = at::empty_like(input, input.suggest_memory_format());
  if (mask[1]) gw = at::empty_like(weight);
  if (mask[2]) gb = at::empty_like(weight);
  return {gi, gw, gb};
}

at::Tensor relu(const at::Tensor& self) { return at::empty_like(self); }

// flip (an augmentation's horizontal flip, and its own backward): a new tensor of the input's shape and layout, as
// the CPU's and CUDA's TensorIterator output (empty_like, preserving the strides).
at::Tensor flip(const at::Tensor& self, at::IntArrayRef /*dims*/) { return at::empty_like(self); }
// --- matmul --------------------------------------------------------------------------------------------------
// A bf16 matmul through oneDNN is cpu_bf16_matmul_scratch's (meta_onednn.cpp).
namespace {

// Outside oneDNN the CPU's mm and addmm (addmm_impl_cpu_, PyTorch 2.11's LinearAlgebra.cpp) hand BLAS each operand
// as it lies where it is row- or column-major with a leading dimension large enough; any other operand is cloned
// contiguous first (m1.clone(MemoryFormat::Contiguous)), held until the product returns. An expanded operand is
// such: a loss that is a sum sends back ones expanded (strides 0) into the last linear layer's two products, so
// each clones the whole output gradient. The output (contiguous, fresh) fixes which operand is which: for N > 1 it
// is read transposed (transpose_c), m1 and m2 swapped.
void cpu_gemm_operand_copies(const at::Tensor& out, const at::Tensor& mat1, const at::Tensor& mat2) {
  if (!for_cpu() || out.numel() == 0 || mat1.size(1) == 0) return;
  const auto m_all = out.size(0), n_all = out.size(1);
  const bool transpose_c = !(out.stride(0) == 1 && (n_all == 1 || out.stride(1) >= std::max<int64_t>(1, m_all)));
  const auto& m1 = transpose_c ? mat2 : mat1;
  const auto& m2 = transpose_c ? mat1 : mat2;
  const int64_t m = transpose_c ? n_all : m_all, n = transpose_c ? m_all : n_all;
  const int64_t k = m1.size(transpose_c ? 0 : 1);
  const int64_t lead = transpose_c ? 1 : 0, other = transpose_c ? 0 : 1;
  // BLAS reads an operand as it is where one stride is 1 and the other at least the leading size of that way round:
  // m1 as [m, k] (m) or transposed (k), m2 as [k, n] (k) or transposed (n).
  const auto readable = [&](const at::Tensor& t, int64_t as_is, int64_t transposed) {
    return (t.stride(lead) == 1 && t.stride(other) >= std::max<int64_t>(1, as_is)) ||
           (t.stride(other) == 1 && t.stride(lead) >= std::max<int64_t>(1, transposed));
  };
  at::Tensor a, b;
  if (!readable(m1, m, k)) a = at::empty(m1.sizes(), m1.options());
  if (!readable(m2, k, n)) b = at::empty(m2.sizes(), m2.options());
}

void check_matmul(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2, "mm: expected 2-D matrices, got ", a.dim(), "-D and ", b.dim(), "-D");
  TORCH_CHECK(a.size(1) == b.size(0), "mat1 and mat2 shapes cannot be multiplied (", a.size(0), "x", a.size(1),
              " and ", b.size(0), "x", b.size(1), ")");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "expected m1 and m2 to have the same dtype, but got: ",
              a.scalar_type(), " != ", b.scalar_type());
}

}  // namespace

at::Tensor matrix_product(const at::Tensor& a, const at::Tensor& b) {
  check_matmul(a, b);
  auto out = at::empty({a.size(0), b.size(1)}, a.options());
  if (!cpu_bf16_matmul_scratch(a, b.size(1))) cpu_gemm_operand_copies(out, a, b);
  return out;
}

// addmm allocates as mm does: its bias is added into the product.
at::Tensor addmm(const at::Tensor&, const at::Tensor& a, const at::Tensor& b, const at::Scalar&, const at::Scalar&) {
  return matrix_product(a, b);
}

// log_sigmoid (binary cross-entropy with logits): the output, and the buffer its backward reads (empty on CUDA).
std::tuple<at::Tensor, at::Tensor> log_sigmoid_forward(const at::Tensor& self) {
  auto out = at::empty_like(self);
  auto buffer = for_cpu() ? at::empty_like(self) : at::empty({0}, self.options());
  return {out, buffer};
}

at::Tensor log_sigmoid_backward(const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor&) {
  return at::empty(at::infer_size(grad_output.sizes(), self.sizes()), self.options());
}
at::Tensor& relu_(at::Tensor& self) { return self; }

// where(condition, self, other): broadcast of the three, the promoted dtype.
at::Tensor where(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other) {
  const auto shape = at::infer_size(at::infer_size(condition.sizes(), self.sizes()), other.sizes());
  return at::empty(shape, self.options().dtype(at::result_type(self, other)));
}

at::Tensor& where_out(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  out.resize_(at::infer_size(at::infer_size(condition.sizes(), self.sizes()), other.sizes()));
  return out;
}

// GradScaler's unscale and update work in place, on every device: nothing to allocate, nothing to compute.
void amp_unscale(at::TensorList, at::Tensor&, const at::Tensor&) {}
at::Tensor& amp_update_scale(at::Tensor& self, at::Tensor&, const at::Tensor&, double, double, int64_t) { return self; }
// On the CPU an input of another dtype than the op's common dtype is cast into a temporary first (TensorIterator's
// compute_types, promote_inputs_to_common_dtype: the CPU's loops take one dtype), before the output is allocated, and
// freed with the iterator once the op is done; CUDA's kernels cast as they load, and the Meta device's iterator casts
// nothing. A residual sum of an fp32 stream and a bf16 or fp16 branch (autocast's linear output) holds one more stream
// in fp32 at that moment: an fp16 GPT's eval_peak was estimated 2.8% low without it (the corpus). A 0-dim input is cast
// too: the wrapped Python number of x * 0.5 or x == 0 (an 8-byte double, cast to x's dtype), the few bytes by which
// CPU estimates were low (tools/conformance.py: the first difference of some 80 of op_db's ops).
std::vector<at::Tensor> cpu_input_casts(at::ScalarType common, std::initializer_list<const at::Tensor*> inputs) {
  std::vector<at::Tensor> casts;
  if (!for_cpu()) return casts;
  for (const auto* t : inputs) {
    if (t->scalar_type() != common) casts.push_back(at::empty_like(*t, t->options().dtype(common)));
  }
  return casts;
}

at::Tensor add(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  if (in_engine_sum() && holds_last_reference(self) && self.sizes() == other.sizes() &&
      self.scalar_type() == other.scalar_type()) {
    return at::meta::add_(const_cast<at::Tensor&>(self), other, alpha);
  }
  const auto casts = cpu_input_casts(at::result_type(self, other), {&self, &other});
  return at::meta::add(self, other, alpha);
}

at::Tensor sub(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  const auto casts = cpu_input_casts(at::result_type(self, other), {&self, &other});
  return at::meta::sub(self, other, alpha);
}

// softmax and log_softmax on the CPU (SoftMax.cpp's TORCH_IMPL_FUNC(softmax_cpu_out) and log_softmax_cpu_out): after
// the structured op's output, the input made contiguous (a copy where it is not: a transposed or strided one), freed
// on return; their backward (softmax_backward_cpu_out, log_softmax_backward_cpu_out) makes the output's gradient and
// the output contiguous, in that order, after the input's gradient (the gradient of a sum comes back expanded: a
// copy). LibTorch's Meta kernels allocate the outputs alone (tools/conformance.py: softmax, log_softmax,
// _softmax_backward_data and their masked and safe forms, low by the copies). CUDA's are not modelled here.
at::Tensor softmax(const at::Tensor& self, int64_t dim, bool half_to_float) {
  auto out = at::meta::_softmax(self, dim, half_to_float);
  if (for_cpu() && self.numel() != 0) {
    [[maybe_unused]] const auto input = self.expect_contiguous();
  }
  return out;
}

at::Tensor log_softmax(const at::Tensor& self, int64_t dim, bool half_to_float) {
  auto out = at::meta::_log_softmax(self, dim, half_to_float);
  if (for_cpu() && self.numel() != 0) {
    [[maybe_unused]] const auto input = self.expect_contiguous();
  }
  return out;
}

at::Tensor softmax_backward(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim,
                            at::ScalarType input_dtype) {
  auto grad_input = at::meta::_softmax_backward_data(grad_output, output, dim, input_dtype);
  if (for_cpu()) {
    [[maybe_unused]] const auto grad = grad_output.expect_contiguous();
    [[maybe_unused]] const auto out = output.expect_contiguous();
  }
  return grad_input;
}

at::Tensor log_softmax_backward(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim,
                                at::ScalarType input_dtype) {
  auto grad_input = at::meta::_log_softmax_backward_data(grad_output, output, dim, input_dtype);
  if (for_cpu()) {
    [[maybe_unused]] const auto grad = grad_output.expect_contiguous();
    [[maybe_unused]] const auto out = output.expect_contiguous();
  }
  return grad_input;
}

// --- backward formulas that scatter in place on the device -------------------------------------------------
// Some of autograd's formulas (FunctionsManual.cpp) take an out-of-place path where a tensor is "subclass-like"
// (areAnyTensorSubclassLike), and Meta tensors are (BackendComponent::MetaBit is in kTensorSubclassLike): the CPU and
// CUDA scatter into the zeros they just made, Meta clones them first. value_selecting_reduction_backward (max and min
// along a dim, sort, topk, mode, kthvalue, median and nanmedian along a dim) runs at::zeros(sizes).scatter_(dim,
// indices, grad); gather_backward (gather, take_along_dim) grad.new_zeros(sizes).scatter_add_(dim, index, grad).
// These take the device's path back: in the function of such a backward node (not the engine's sum), without grad
// mode, on zeros nothing else holds, they scatter into `self` (tools/conformance.py: +1 tensor of the input's size).
namespace {

bool in_backward_function_of(std::initializer_list<std::string_view> nodes) {
  if (at::GradMode::is_enabled() || in_engine_sum()) return false;
  const auto node = torch::autograd::get_current_node();
  if (node == nullptr) return false;
  const auto name = node->name();
  return std::find(nodes.begin(), nodes.end(), std::string_view(name)) != nodes.end();
}

// On the CPU a scatter into a bf16 or fp16 tensor (scatter_, scatter_add_, with or without a reduction, whatever the
// index) works in a float buffer of the destination's size, allocated after the output and freed on return, where the
// index has elements (measured with torch.profiler on 2.11: aten::empty of numel * 4 bytes inside aten::scatter_ and
// aten::scatter_add_; float32 and float64 take none).
void cpu_scatter_buffer(const at::Tensor& self, const at::Tensor& index) {
  if (for_cpu() && (self.scalar_type() == at::kBFloat16 || self.scalar_type() == at::kHalf) && index.numel() > 0) {
    [[maybe_unused]] const auto buffer = at::empty(self.sizes(), self.options().dtype(at::kFloat));
  }
}

}  // namespace

at::Tensor scatter_src(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src) {
  if (self.use_count() == 1 &&
      in_backward_function_of({"MaxBackward0", "MinBackward0", "SortBackward0", "SortBackward1", "TopkBackward0",
                               "ModeBackward0", "KthvalueBackward0", "MedianBackward1", "NanmedianBackward1"})) {
    at::Tensor out = self;
    at::meta::scatter_(out, dim, index, src);
    cpu_scatter_buffer(out, index);
    return out;
  }
  auto out = at::meta::scatter(self, dim, index, src);
  cpu_scatter_buffer(out, index);
  return out;
}

at::Tensor scatter_value(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Scalar& value) {
  auto out = at::meta::scatter(self, dim, index, value);
  cpu_scatter_buffer(out, index);
  return out;
}

at::Tensor scatter_reduce_two(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                              c10::string_view reduce, bool include_self) {
  auto out = at::meta::scatter_reduce(self, dim, index, src, reduce, include_self);
  cpu_scatter_buffer(out, index);
  return out;
}

at::Tensor scatter_add(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src) {
  if (self.use_count() == 1 && in_backward_function_of({"GatherBackward0"})) {
    at::Tensor out = self;
    at::meta::scatter_add_(out, dim, index, src);
    cpu_scatter_buffer(out, index);
    return out;
  }
  auto out = at::meta::scatter_add(self, dim, index, src);
  cpu_scatter_buffer(out, index);
  return out;
}

// sort on the CPU (Sorting.cpp's sort_stable_out, then SortingKernel.cpp's sort_kernel): after the structured op's
// values and indices, _fill_indices writes 0..n-1 along the dim into the indices from at::arange(0, n) (int64, freed on
// return) for every input but a one-element 0-dim one. CUDA's is not modelled here.
std::tuple<at::Tensor, at::Tensor> sort_stable(const at::Tensor& self, std::optional<bool> stable, int64_t dim,
                                               bool descending) {
  auto out = at::meta::sort(self, stable, dim, descending);
  if (for_cpu() && !(self.dim() == 0 && self.numel() == 1)) {
    const auto d = at::maybe_wrap_dim(dim, self.dim());
    [[maybe_unused]] const auto fill = at::arange(0, std::get<1>(out).size(d), std::get<1>(out).options());
  }
  return out;
}

// --- pooling on the CPU ----------------------------------------------------------------------------------------
// The CPU's pooling kernels (AvgPoolKernel.cpp, MaxPoolKernel.cpp, AdaptiveMaxPoolKernel.cpp) pick a layout from one
// tensor's suggest_memory_format() (the input's forward, the output gradient's backward): channels last, or else
// contiguous. Each then takes `t.contiguous(layout)` of its tensors in a fixed order, a copy of each that is not so
// (a non-contiguous input; the gradient of a sum, which comes back expanded; a channels-last gradient of the input
// under the contiguous kernel), held until it returns and copied back into a strided output. LibTorch's structured
// Meta kernels allocate the outputs alone (tools/conformance.py: avg_pool*, max_pool*, adaptive_max_pool* low by the
// copies). CUDA's are not modelled here.
namespace {

// The copies, in the kernel's order: forward (input, output[, indices]) in either layout; backward, contiguous
// (grad_output[, indices], grad_input), channels last (grad_input, grad_output[, indices]).
void cpu_pool_copies(const at::Tensor& layout_of, bool is_3d, std::initializer_list<const at::Tensor*> tensors) {
  if (!for_cpu()) return;
  const auto suggested = layout_of.suggest_memory_format();
  const auto channels_last = is_3d ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::ChannelsLast;
  const auto layout = suggested == channels_last ? channels_last : at::MemoryFormat::Contiguous;
  std::vector<at::Tensor> held;
  for (const auto* t : tensors) held.push_back(t->contiguous(layout));
}

}  // namespace

at::Tensor avg_pool2d(const at::Tensor& self, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                      at::IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                      std::optional<int64_t> divisor_override) {
  auto out = at::meta::avg_pool2d(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override);
  cpu_pool_copies(self, false, {&self, &out});
  return out;
}

at::Tensor avg_pool3d(const at::Tensor& self, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                      at::IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                      std::optional<int64_t> divisor_override) {
  auto out = at::meta::avg_pool3d(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override);
  cpu_pool_copies(self, true, {&self, &out});
  return out;
}

namespace {

bool channels_last_kernel(const at::Tensor& t, bool is_3d) {
  return t.suggest_memory_format() == (is_3d ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::ChannelsLast);
}

void cpu_pool_backward_copies(const at::Tensor& grad_output, const at::Tensor& grad_input, bool is_3d) {
  if (channels_last_kernel(grad_output, is_3d)) {
    cpu_pool_copies(grad_output, is_3d, {&grad_input, &grad_output});
  } else {
    cpu_pool_copies(grad_output, is_3d, {&grad_output, &grad_input});
  }
}

// max pooling's backward; the kernel's layout is the output gradient's, or `layout_of`'s where given (adaptive max
// pooling's picks the input gradient's: "grad_output might be NC11").
void cpu_pool_backward_copies(const at::Tensor& grad_output, const at::Tensor& indices, const at::Tensor& grad_input,
                              bool is_3d, const at::Tensor* layout_of = nullptr) {
  const auto& layout = layout_of != nullptr ? *layout_of : grad_output;
  if (channels_last_kernel(layout, is_3d)) {
    cpu_pool_copies(layout, is_3d, {&grad_input, &grad_output, &indices});
  } else {
    cpu_pool_copies(layout, is_3d, {&grad_output, &indices, &grad_input});
  }
}

}  // namespace

at::Tensor avg_pool2d_backward(const at::Tensor& grad_output, const at::Tensor& self, at::IntArrayRef kernel_size,
                               at::IntArrayRef stride, at::IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                               std::optional<int64_t> divisor_override) {
  auto grad_input = at::meta::avg_pool2d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode,
                                                  count_include_pad, divisor_override);
  cpu_pool_backward_copies(grad_output, grad_input, false);
  return grad_input;
}

at::Tensor avg_pool3d_backward(const at::Tensor& grad_output, const at::Tensor& self, at::IntArrayRef kernel_size,
                               at::IntArrayRef stride, at::IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                               std::optional<int64_t> divisor_override) {
  auto grad_input = at::meta::avg_pool3d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode,
                                                  count_include_pad, divisor_override);
  cpu_pool_backward_copies(grad_output, grad_input, true);
  return grad_input;
}

std::tuple<at::Tensor, at::Tensor> max_pool2d_with_indices(const at::Tensor& self, at::IntArrayRef kernel_size,
                                                           at::IntArrayRef stride, at::IntArrayRef padding,
                                                           at::IntArrayRef dilation, bool ceil_mode) {
  auto out = at::meta::max_pool2d_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode);
  cpu_pool_copies(self, false, {&self, &std::get<0>(out), &std::get<1>(out)});
  return out;
}

at::Tensor max_pool2d_with_indices_backward(const at::Tensor& grad_output, const at::Tensor& self,
                                            at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                            at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode,
                                            const at::Tensor& indices) {
  auto grad_input = at::meta::max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride, padding,
                                                               dilation, ceil_mode, indices);
  cpu_pool_backward_copies(grad_output, indices, grad_input, false);
  return grad_input;
}

std::tuple<at::Tensor, at::Tensor> adaptive_max_pool2d(const at::Tensor& self, at::IntArrayRef output_size) {
  auto out = at::meta::adaptive_max_pool2d(self, output_size);
  cpu_pool_copies(self, false, {&self, &std::get<0>(out), &std::get<1>(out)});
  return out;
}

at::Tensor adaptive_max_pool2d_backward(const at::Tensor& grad_output, const at::Tensor& self,
                                        const at::Tensor& indices) {
  auto grad_input = at::meta::adaptive_max_pool2d_backward(grad_output, self, indices);
  cpu_pool_backward_copies(grad_output, indices, grad_input, false, &grad_input);
  return grad_input;
}

// adaptive max pooling in 3-D on the CPU takes no copy of a non-contiguous or channels-last input (tools/conformance.py:
// its samples' forward allocates the outputs alone), and its backward copies the output's gradient alone (contiguous).
at::Tensor adaptive_max_pool3d_backward(const at::Tensor& grad_output, const at::Tensor& self,
                                        const at::Tensor& indices) {
  auto grad_input = at::meta::adaptive_max_pool3d_backward(grad_output, self, indices);
  if (for_cpu()) {
    [[maybe_unused]] const auto grad = grad_output.contiguous();
  }
  return grad_input;
}

// arange into a fresh tensor (at::arange is empty({0}) then arange_out): Meta's resize_ grows a storage by setting its
// size, past the allocator, so positions (a GPT's arange over its sequence) were counted as 0 bytes. Here the result
// takes a storage the allocator counts, as on the device.
at::Tensor& arange_out(const at::Scalar& start, const at::Scalar& end, const at::Scalar& step, at::Tensor& out) {
  const auto n = static_cast<int64_t>(std::ceil((end.to<double>() - start.to<double>()) / step.to<double>()));
  if (out.numel() != n) out.set_(at::empty({std::max<int64_t>(n, 0)}, out.options()));
  return out;
}

// resize_ as the devices run it (2.11's at::native::resize_ on the CPU: maybe_resize_storage_cpu, resize_bytes_cpu in
// ATen/native/Resize.h; resize_cuda_ likewise): a tensor whose new size needs more bytes than its storage holds (and
// has elements) takes a new block of those bytes from the storage's allocator, and its old block is freed after.
// LibTorch's Meta resize_ (resize_bytes_meta) only sets the storage's size, past the allocator: the output of every
// composite that makes an empty tensor and resizes it in an out= kernel (abs, l1_loss, linalg's norms and solvers,
// upsampling's backward) was counted as 0 bytes (tools/conformance.py). The sizes are then LibTorch's Meta kernel's.
const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  const auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  const auto& storage = self.unsafeGetTensorImpl()->unsafe_storage();
  if (storage && c10::multiply_integers(sizes) != 0) {
    const auto bytes = at::detail::computeStorageNbytesContiguous(sizes, self.dtype().itemsize(),
                                                                  static_cast<std::size_t>(self.storage_offset()));
    auto* impl = storage.unsafeGetStorageImpl();
    if (bytes > impl->nbytes() && impl->resizable() && impl->allocator() != nullptr) {
      impl->set_data_ptr_noswap(impl->allocator()->allocate(bytes));
      impl->set_nbytes(bytes);
    }
  }
  return at::native::resize__symint(self, size, memory_format);
}

// The fused optimizers (_fused_adamw_, _fused_adam_, _fused_sgd_: optimizer_impl fused) update their lists in place
// and return nothing; on the CPU and on CUDA they allocate nothing either (one pass over each parameter's tensors), so
// on Meta there is nothing to do but take the arguments off the stack. LibTorch registers no Meta kernel for them
// (Python's are in torch/_meta_registrations.py), and an estimate of a fused fixture failed there.
void fused_optimizer_in_place(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  torch::jit::drop(*stack, op.schema().arguments().size());
}

}  // namespace memgate::meta_kernels
