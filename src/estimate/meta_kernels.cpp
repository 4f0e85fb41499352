// Meta kernels for the ops LibTorch's C++ lacks them for (Python registers its own in torch/_meta_registrations.py):
// each returns tensors of the exact shapes and dtypes the target device's kernel returns, allocated in the same
// order, so that the counting Meta allocator sees what that device's allocator would. Registered on first use, for
// the estimate's target.
#include "memgate/estimate/meta_kernels.h"

#include "memgate/estimate/cuda_reduce.h"
#include "memgate/estimate/cudnn_workspace.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/ExpandUtils.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/core/Reduction.h>
#include <ATen/cpu/Utils.h>
#include <ATen/core/grad_mode.h>
#include <ATen/OpMathType.h>
#include <ATen/ScalarOps.h>
#include <ATen/ops/add_meta_dispatch.h>
#include <ATen/ops/div_meta_dispatch.h>
#include <ATen/ops/eq_meta_dispatch.h>
#include <ATen/ops/ge_meta_dispatch.h>
#include <ATen/ops/gt_meta_dispatch.h>
#include <ATen/ops/le_meta_dispatch.h>
#include <ATen/ops/lt_meta_dispatch.h>
#include <ATen/ops/mul_meta_dispatch.h>
#include <ATen/ops/ne_meta_dispatch.h>
#include <ATen/ops/sub_meta_dispatch.h>
#include <ATen/ops/mean_meta_dispatch.h>
#include <ATen/ops/mse_loss_meta_dispatch.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/sum_meta_dispatch.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/function.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdint>
#include <memory>
#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace memgate {
namespace {

std::atomic<EstimateTarget> g_kernels_target{EstimateTarget::kCpu};
std::atomic<CpuKernels> g_cpu_kernels{CpuKernels::kPortable};

bool for_cpu() { return g_kernels_target.load() == EstimateTarget::kCpu; }
// The CPU with its host's kernels: oneDNN where PyTorch picks it.
bool for_cpu_host() { return for_cpu() && g_cpu_kernels.load() == CpuKernels::kHost; }

at::ScalarType accumulate_type(at::ScalarType t) {
  return t == at::kHalf || t == at::kBFloat16 ? at::kFloat : t;
}

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

// A binary TensorIterator op's output: in `self`'s layout at its shape, else contiguous at the broadcast shape.
at::Tensor binary_output_meta(const at::Tensor& self, const at::Tensor& other) {
  const auto shape = at::infer_size(self.sizes(), other.sizes());
  return shape == self.sizes().vec() ? at::empty_like(self) : at::empty(shape, self.options());
}

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

// --- convolution ------------------------------------------------------------------------------------------
// Whether the CPU's oneDNN takes this dtype (ideep's has_bf16_type_support / has_fp16_type_support: an AVX-512 core,
// or AVX512-FP16 for fp16, or AVX-NE-CONVERT for both).
bool cpu_mkldnn_takes(at::ScalarType dtype) {
  static const auto caps = at::cpu::get_cpu_capabilities();
  auto has = [](const char* name) {
    const auto it = caps.find(name);
    return it != caps.end() && it->second.isBool() && it->second.toBool();
  };
  static const bool bf16 = (has("avx512_f") && has("avx512_bw") && has("avx512_vl") && has("avx512_dq")) ||
                           has("avx_ne_convert");
  static const bool fp16 = has("avx512_fp16") || has("avx_ne_convert");
  return dtype == at::kBFloat16 ? bf16 : dtype == at::kHalf ? fp16 : false;
}

// The CPU's choice (ConvParams::use_mkldnn, one thread): oneDNN for bf16/fp16 where it takes them; for fp32 unless a
// 1x1 unit-stride kernel on a small batch, or a single small image through a kernel of at most 3x3; never otherwise.
bool cpu_uses_mkldnn(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                     at::IntArrayRef dilation, int64_t groups) {
  if (!for_cpu_host()) return false;
  const auto dtype = input.scalar_type();
  if (dtype == at::kBFloat16 || dtype == at::kHalf) return cpu_mkldnn_takes(dtype);
  if (dtype != at::kFloat) return false;
  const auto kh = weight.size(2), kw = weight.size(3);
  const bool strided = stride[0] > 1 || stride[stride.size() - 1] > 1;
  const bool dilated = dilation[0] > 1 || dilation[dilation.size() - 1] > 1;
  return (strided || dilated || input.size(0) >= 16 || kw != 1 || kh != 1) &&
         (groups > 1 || (kw > 3 && kh > 3) || input.size(0) > 1 || input.numel() > 20480);
}

// What oneDNN (through ideep, avx512 here: blocks of 16 channels) holds around a convolution on the CPU, as the
// counting allocator sees it on this machine (one thread): layouts and the implementation it picks.
struct OneDnnLayout {
  int64_t in_channels, out_channels, groups, kh, kw;
  bool first_conv;  ///< fewer than 16 input channels, one group: the input is read as it is
  bool depthwise;
  [[nodiscard]] static OneDnnLayout of(const at::Tensor& input, const at::Tensor& weight, int64_t groups) {
    const auto c = input.size(1), o = weight.size(0);
    return {c, o, groups, weight.size(2), weight.size(3), groups == 1 && c < 16, groups > 1 && groups == c && o == c};
  }
  [[nodiscard]] static int64_t blocks(int64_t channels) { return (channels + 15) / 16; }
  [[nodiscard]] static int64_t pad(int64_t channels) { return blocks(channels) * 16; }
  /// Its own kernels (jit) take blocked layouts; a depthwise kernel above 3x3 and a grouped convolution whose
  /// groups are not whole blocks go through GEMM (im2col), which holds a scratchpad instead.
  [[nodiscard]] bool gemm_weights() const {
    if (depthwise) return kh * kw > 9;
    return groups > 1 && ((in_channels / groups) % 16 != 0 || (out_channels / groups) % 16 != 0);
  }
  [[nodiscard]] int64_t forward_weight_elements() const {
    if (depthwise) return pad(out_channels) * kh * kw;
    if (first_conv) return pad(out_channels) * in_channels * kh * kw;
    return groups * pad(out_channels / groups) * pad(in_channels / groups) * kh * kw;
  }
  [[nodiscard]] int64_t backward_data_weight_elements() const {
    if (depthwise) return pad(out_channels) * kh * kw;
    return groups * pad(out_channels / groups) * pad(in_channels / groups) * kh * kw;
  }
};

at::Tensor blocked(const at::TensorOptions& options, int64_t elements) { return at::empty({elements}, options); }

int64_t spatial_numel(const at::Tensor& t) { return t.size(0) * t.size(2) * t.size(3); }

bool unit_1x1(const at::Tensor& weight, at::IntArrayRef stride, at::IntArrayRef padding) {
  const bool unit_stride = std::all_of(stride.begin(), stride.end(), [](int64_t v) { return v == 1; });
  const bool no_padding = std::all_of(padding.begin(), padding.end(), [](int64_t v) { return v == 0; });
  return weight.size(2) == 1 && weight.size(3) == 1 && unit_stride && no_padding;
}

// --- the CPU's convolutions without oneDNN: Slow2d, SlowDilated2d, SlowTranspose2d ----------------------------------
// _convolution and convolution_backward (Convolution.cpp) make the input and the weight contiguous in the backend's
// format first (determine_backend_memory_format: channels last for Slow2d/SlowDilated2d where
// thnn_conv_use_channels_last, the input's or the weight's suggested format being so; contiguous for
// SlowTranspose2d), alive until they return: a channels-last input (ConvNeXt's downsampling after its LayerNorm2d)
// has the weight copied to channels last. These backends lack groups: a grouped convolution runs one group at a
// time, for each group its slices through subtensor (narrow(...).contiguous(format): a copy of the input's and the
// output gradient's channels, none for a weight's or bias's leading rows), the backend on them, each group's results
// kept in a vector until at::cat joins them. A depthwise convolution (groups = channels) takes the same loop: on the
// CPU no other backend serves it without oneDNN (the depthwise kernels are CUDA's; Winograd3x3Depthwise is ARM's and
// inference's). The slices and the cat run here as ATen's Meta ops, which allocate what the CPU's do. Measured
// against the CPU (torch 2.11, portable kernels): timm's ConvNeXt's forward_peak was 3.0% low at batch 2 (the
// downsampling's weight copy), a ResNeXt/MobileNet-style net's step_peak 6.8-7.1% low (the groups' copies and cat).
at::MemoryFormat meta_conv_group_format(const at::Tensor& input, const at::Tensor& weight, bool transposed) {
  if (transposed) return at::MemoryFormat::Contiguous;
  return input.suggest_memory_format() == at::MemoryFormat::ChannelsLast ||
                 weight.suggest_memory_format() == at::MemoryFormat::ChannelsLast
             ? at::MemoryFormat::ChannelsLast
             : at::MemoryFormat::Contiguous;
}

// subtensor (Convolution.cpp): group g of `groups` along dim, made contiguous in the tensor's suggested format (a
// channels-last weight's leading rows are so already, a channels-last input's channels are not).
at::Tensor meta_conv_group_slice(const at::Tensor& t, int64_t dim, int64_t groups, int64_t g) {
  if (!t.defined()) return t;
  const auto n = t.size(dim) / groups;
  return t.narrow(dim, n * g, n).contiguous(t.suggest_memory_format());
}

// The CPU's backend without oneDNN (_select_conv_backend): SlowTranspose2d, SlowDilated2d, else Slow2d.
enum class MetaSlowConv { kSlow2d, kDilated2d, kTranspose2d };

MetaSlowConv meta_slow_conv_backend(at::IntArrayRef dilation, bool transposed) {
  if (transposed) return MetaSlowConv::kTranspose2d;
  return std::any_of(dilation.begin(), dilation.end(), [](int64_t d) { return d != 1; }) ? MetaSlowConv::kDilated2d
                                                                                        : MetaSlowConv::kSlow2d;
}

// _convolution_nogroup_backend on one group (or the whole convolution):
// - Slow2d: thnn_conv2d -> _slow_conv2d_forward (ConvolutionMM2d.cpp): compute_columns2d's columns of every image
//   (none for a 1x1 kernel at unit stride without padding: a view of the input), then the output in the format of
//   thnn_conv_use_channels_last; the columns freed on return.
// - SlowDilated2d: slow_conv_dilated2d (NaiveDilatedConvolution.cpp): the output, then the columns of one image
//   (slow_conv_dilated_all_cpu_template resizes one buffer and reuses it for every image).
// - SlowTranspose2d: slow_conv_transpose2d (NaiveConvolutionTranspose2d.cpp, slow_conv_transpose2d_out_cpu_template):
//   the structured op's output, then the columns of every image (C_out x kh x kw rows, a column per input pixel).
at::Tensor meta_conv_group_forward(const at::Tensor& input, const at::Tensor& weight, std::vector<int64_t> shape,
                                   at::IntArrayRef stride, at::IntArrayRef padding, MetaSlowConv backend) {
  const auto kh = weight.size(2), kw = weight.size(3);
  const auto options = input.options().memory_format(meta_conv_group_format(input, weight, false));
  if (backend == MetaSlowConv::kTranspose2d) {
    auto out = at::empty(shape, options);
    auto columns = at::empty({input.size(0), weight.size(1) * kh * kw, input.size(2) * input.size(3)}, input.options());
    return out;
  }
  if (backend == MetaSlowConv::kDilated2d) {
    auto out = at::empty(shape, options);
    auto columns = at::empty({input.size(1) * kh * kw, shape[2] * shape[3]}, input.options());
    return out;
  }
  const auto finput = unit_1x1(weight, stride, padding)
                          ? at::Tensor()
                          : at::empty({input.size(0), input.size(1) * kh * kw, shape[2] * shape[3]}, input.options());
  return at::empty(shape, options);
}

at::Tensor meta_conv_slow_forward(const at::Tensor& input, const at::Tensor& weight,
                                  const std::optional<at::Tensor>& bias, std::vector<int64_t> shape,
                                  at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                                  bool transposed, int64_t groups) {
  const auto backend = meta_slow_conv_backend(dilation, transposed);
  const auto format = meta_conv_group_format(input, weight, transposed);
  const auto in = input.contiguous(format);
  const auto w = weight.contiguous(format);
  if (groups == 1) return meta_conv_group_forward(in, w, shape, stride, padding, backend);
  shape[1] /= groups;
  std::vector<at::Tensor> outputs;
  outputs.reserve(static_cast<std::size_t>(groups));
  for (int64_t g = 0; g < groups; ++g) {
    const auto input_g = meta_conv_group_slice(in, 1, groups, g);
    const auto weight_g = meta_conv_group_slice(w, 0, groups, g);
    const auto bias_g = bias.has_value() ? meta_conv_group_slice(*bias, 0, groups, g) : at::Tensor();
    outputs.push_back(meta_conv_group_forward(input_g, weight_g, shape, stride, padding, backend));
  }
  return at::cat(outputs, 1);
}

// _convolution_backward_nogroup_backend on one group (or the whole convolution):
// - Slow2d: _slow_conv2d_backward's slow_conv2d_backward_out_cpu (ConvolutionMM2d.cpp), in its order: the input's
//   gradient (after grad_output.contiguous(format), the format channels last where the input or the weight is: a copy
//   where it is not so already, e.g. a ViT's patch embedding gets its gradient through flatten(2).transpose(1, 2),
//   freed when that gradient is done (step_peak 1.1-2.4% low without it); its columns per image are a
//   std::unique_ptr, not the allocator's), the bias's (sum_out), the weight's (in the weight's suggested format;
//   grad_output made contiguous again, and compute_columns2d's columns of every image, freed on return).
// - SlowDilated2d: slow_conv_dilated2d_backward_cpu: grad_output made contiguous, the three gradients allocated up
//   front, then the columns of one image (for the input's or the weight's gradient), and for the bias's a sum of each
//   image's grad_output, added and freed.
// - SlowTranspose2d: slow_conv_transpose2d_backward_cpu: the input's gradient and one image's columns (the output
//   gradient unfolded: C_out x kh x kw rows, a column per input pixel; none for a 1x1 kernel at unit stride without
//   padding or dilation), freed; the bias's (sum_out); the weight's and the same columns again
//   (slow_conv_transpose2d_acc_grad_parameters_cpu). Each part reads grad_output.contiguous(format).
std::tuple<at::Tensor, at::Tensor, at::Tensor> meta_conv_group_backward(const at::Tensor& grad_output,
                                                                       const at::Tensor& input,
                                                                       const at::Tensor& weight,
                                                                       at::IntArrayRef stride,
                                                                       at::IntArrayRef padding,
                                                                       at::IntArrayRef dilation, MetaSlowConv backend,
                                                                       std::array<bool, 3> mask) {
  at::Tensor gi, gw, gb;
  const auto kh = weight.size(2), kw = weight.size(3);
  const auto format = meta_conv_group_format(input, weight, false);
  if (backend == MetaSlowConv::kTranspose2d) {
    const bool need_columns = !unit_1x1(weight, stride, padding) ||
                              std::any_of(dilation.begin(), dilation.end(), [](int64_t d) { return d != 1; });
    auto columns = [&] {
      const auto gy = grad_output.contiguous(format);
      if (need_columns) at::empty({weight.size(1) * kh * kw, input.size(2) * input.size(3)}, input.options());
    };
    if (mask[0]) {
      gi = at::empty(input.sizes(), input.options().memory_format(format));
      columns();
    }
    if (mask[2]) gb = at::empty({grad_output.size(1)}, grad_output.options());
    if (mask[1]) {
      gw = at::empty(weight.sizes(), weight.options().memory_format(weight.suggest_memory_format()));
      columns();
    }
    return {gi, gw, gb};
  }
  if (backend == MetaSlowConv::kDilated2d) {
    const auto gy = grad_output.contiguous(format);
    if (mask[0]) gi = at::empty(input.sizes(), input.options().memory_format(format));
    if (mask[1]) gw = at::empty(weight.sizes(), weight.options().memory_format(format));
    if (mask[2]) gb = at::empty({weight.size(0)}, weight.options());
    const auto columns = mask[0] || mask[1]
                             ? at::empty({input.size(1) * kh * kw, grad_output.size(2) * grad_output.size(3)},
                                         input.options())
                             : at::Tensor();
    if (mask[2]) {
      [[maybe_unused]] const auto image_sum = at::empty({weight.size(0)}, weight.options());
    }
    return {gi, gw, gb};
  }
  if (mask[0]) {
    const auto gy = grad_output.contiguous(format);
    gi = at::empty(input.sizes(), input.options().memory_format(format));
  }
  if (mask[2]) gb = at::empty({grad_output.size(1)}, grad_output.options());
  if (mask[1]) {
    gw = at::empty(weight.sizes(), weight.options().memory_format(weight.suggest_memory_format()));
    const auto gy = grad_output.contiguous(format);
    if (!unit_1x1(weight, stride, padding)) {
      auto columns = at::empty({input.size(0), input.size(1) * kh * kw, grad_output.size(2) * grad_output.size(3)},
                               input.options());
    }
  }
  return {gi, gw, gb};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> meta_conv_slow_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
    at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed, int64_t groups, std::array<bool, 3> mask) {
  const auto backend = meta_slow_conv_backend(dilation, transposed);
  const auto format = meta_conv_group_format(input, weight, transposed);
  const auto in = input.contiguous(format);
  const auto w = weight.contiguous(format);
  if (groups == 1) return meta_conv_group_backward(grad_output, in, w, stride, padding, dilation, backend, mask);
  std::vector<at::Tensor> gis, gws, gbs;
  for (int64_t g = 0; g < groups; ++g) {
    const auto grad_output_g = meta_conv_group_slice(grad_output, 1, groups, g);
    const auto input_g = meta_conv_group_slice(in, 1, groups, g);
    const auto weight_g = meta_conv_group_slice(w, 0, groups, g);
    auto [gi, gw, gb] = meta_conv_group_backward(grad_output_g, input_g, weight_g, stride, padding, dilation,
                                                 backend, mask);
    gis.push_back(std::move(gi));
    gws.push_back(std::move(gw));
    gbs.push_back(std::move(gb));
  }
  at::Tensor gi, gw, gb;
  if (mask[0]) gi = at::cat(gis, 1);
  if (mask[1]) gw = at::cat(gws, 0);
  if (mask[2]) gb = at::cat(gbs, 0);
  return {gi, gw, gb};
}

// --- CUDA's convolutions through cuDNN ----------------------------------------------------------------------------
// Where PyTorch 2.11 runs a CUDA convolution with cuDNN (select_conv_backend in aten/src/ATen/native/Convolution.cpp:
// every 1-D, 2-D and 3-D convolution of fp32, fp16, bf16 or fp64, transposed ones too, but a depthwise one in
// channels-first layout, which goes to CUDA's own depthwise kernels, and one whose output padding is not below its
// stride), each of cuDNN's passes takes a workspace from the caching allocator for that call (run_conv_plan in
// aten/src/ATen/native/cudnn/Conv_v8.cpp: allocate(plan.getWorkspaceSize()), nothing for 0 bytes) and frees it when
// the pass returns, after the pass's output was allocated. cudnn_workspace_bytes asks cuDNN which plan ATen runs and
// the workspace it takes, for the GPU the estimate speaks for. Left out: fp16 depthwise convolutions that
// use_cudnn_depthwise sends to cuDNN in channels-first layout, the inputs' copies where a tensor is not yet in the
// convolution's memory format, and the batch splits of a convolution too large for 32-bit indexing.
struct CudnnGeometry {
  bool channels_last = false;
  std::vector<int64_t> stride, padding, dilation;
  bool one_dimensional = false;  ///< viewed as 2-D (view1d_as_2d): a spatial dim of 1 in front
};

// cudnn_conv_suggest_memory_format (ConvUtils.h): channels last where the input or the weight is, for 4-D and 5-D
// weights; fp64 always channels first.
bool cudnn_channels_last(const at::Tensor& input, const at::Tensor& weight) {
  if (input.scalar_type() == at::kDouble || weight.scalar_type() == at::kDouble) return false;
  if (weight.dim() == 4) {
    return input.suggest_memory_format() == at::MemoryFormat::ChannelsLast ||
           weight.suggest_memory_format() == at::MemoryFormat::ChannelsLast;
  }
  if (weight.dim() == 5) {
    return input.suggest_memory_format() == at::MemoryFormat::ChannelsLast3d ||
           weight.suggest_memory_format() == at::MemoryFormat::ChannelsLast3d;
  }
  return false;
}

std::optional<CudnnGeometry> cuda_cudnn_geometry(const at::Tensor& input, const at::Tensor& weight,
                                                 at::IntArrayRef stride, at::IntArrayRef padding,
                                                 at::IntArrayRef dilation, bool transposed,
                                                 at::IntArrayRef output_padding, int64_t groups) {
  if (for_cpu() || input.dim() < 3 || input.dim() > 5) return std::nullopt;
  const auto t = input.scalar_type();
  if (t != at::kFloat && t != at::kHalf && t != at::kBFloat16 && t != at::kDouble) return std::nullopt;
  CudnnGeometry g;
  g.one_dimensional = input.dim() == 3;
  const auto spatial = input.dim() - 2;
  auto at_or_first = [](at::IntArrayRef a, int64_t i) { return a.size() == 1 ? a[0] : a[i]; };
  if (g.one_dimensional) {
    g.stride.push_back(1);
    g.padding.push_back(0);
    g.dilation.push_back(1);
  }
  for (int64_t i = 0; i < spatial; ++i) {
    g.stride.push_back(at_or_first(stride, i));
    g.padding.push_back(at_or_first(padding, i));
    g.dilation.push_back(at_or_first(dilation, i));
    if (transposed && !output_padding.empty() && at_or_first(output_padding, i) >= at_or_first(stride, i)) {
      return std::nullopt;  // is_output_padding_big: the slow transposed kernels
    }
  }
  g.channels_last = !g.one_dimensional && cudnn_channels_last(input, weight);
  const bool depthwise = !transposed && (input.dim() == 4 || input.dim() == 5) && input.size(1) == groups &&
                         groups > 1 && weight.size(0) % input.size(1) == 0;
  if (depthwise && !g.channels_last) return std::nullopt;  // CudaDepthwise2d / 3d
  return g;
}

std::vector<int64_t> as_2d(at::IntArrayRef sizes, bool one_dimensional) {
  std::vector<int64_t> v(sizes.begin(), sizes.end());
  if (one_dimensional) v.insert(v.begin() + 2, 1);
  return v;
}

// The strides of a tensor of `sizes` contiguous in the convolution's memory format (ATen makes each operand so).
std::vector<int64_t> dense_strides(const std::vector<int64_t>& sizes, bool channels_last) {
  const auto dims = static_cast<int64_t>(sizes.size());
  std::vector<int64_t> order;  // innermost first
  if (channels_last) order.push_back(1);
  for (int64_t d = dims - 1; d > 1; --d) order.push_back(d);
  if (!channels_last) order.push_back(1);
  order.push_back(0);
  std::vector<int64_t> strides(sizes.size());
  int64_t inner = 1;
  for (const auto d : order) {
    strides[d] = inner;
    inner *= std::max<int64_t>(sizes[d], 1);
  }
  return strides;
}

// One of cuDNN's passes, run after its output was allocated: its workspace, allocated and freed.
void cudnn_pass_workspace(ConvolutionPass pass, const CudnnGeometry& g, at::ScalarType dtype, at::IntArrayRef x,
                          at::IntArrayRef w, at::IntArrayRef y, const at::TensorOptions& options) {
  CudnnConvolution c;
  c.pass = pass;
  c.dtype = dtype;
  c.channels_last = g.channels_last;
  c.x_sizes = as_2d(x, g.one_dimensional);
  c.w_sizes = as_2d(w, g.one_dimensional);
  c.y_sizes = as_2d(y, g.one_dimensional);
  for (const auto& s : {c.x_sizes, c.w_sizes, c.y_sizes}) {
    if (std::any_of(s.begin(), s.end(), [](int64_t n) { return n == 0; })) return;  // numel() == 0: no call
  }
  c.x_strides = dense_strides(c.x_sizes, g.channels_last);
  c.w_strides = dense_strides(c.w_sizes, g.channels_last);
  c.y_strides = dense_strides(c.y_sizes, g.channels_last);
  c.stride = g.stride;
  c.padding = g.padding;
  c.dilation = g.dilation;
  // The settings ATen's filter reads, as the probe set them (configure_determinism: a fixture's `deterministic`).
  c.deterministic = at::globalContext().deterministicCuDNN();
  c.allow_tf32 = at::globalContext().allowTF32CuDNN(at::Float32Op::CONV);
  const auto bytes = cudnn_workspace_bytes(c, estimated_cudnn_device_json());
  if (bytes > 0) auto workspace = at::empty({bytes}, options.dtype(at::kByte).memory_format(at::MemoryFormat::Contiguous));
}

// On the Meta device _convolution picks the "overrideable" backend; the output's spatial sizes follow the
// convolution arithmetic, its layout the input's.
at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                       at::IntArrayRef output_padding, int64_t groups) {
  const auto spatial = input.dim() - 2;
  std::vector<int64_t> shape{input.size(0), transposed ? weight.size(1) * groups : weight.size(0)};
  auto at_or_first = [](at::IntArrayRef a, int64_t i) { return a.size() == 1 ? a[0] : a[i]; };
  for (int64_t i = 0; i < spatial; ++i) {
    const auto in = input.size(i + 2), k = weight.size(i + 2);
    const auto s = at_or_first(stride, i), p = at_or_first(padding, i), d = at_or_first(dilation, i);
    shape.push_back(transposed ? (in - 1) * s - 2 * p + d * (k - 1) + at_or_first(output_padding, i) + 1
                               : (in + 2 * p - d * (k - 1) - 1) / s + 1);
  }
  const auto options = input.options().memory_format(input.suggest_memory_format());
  if (const auto cudnn = cuda_cudnn_geometry(input, weight, stride, padding, dilation, transposed, output_padding, groups)) {
    // cudnn_convolution allocates the output in the convolution's memory format, then runs the forward pass; a
    // transposed one (cudnn_convolution_transpose) runs the backward-data pass with the output as dx, the input as dy.
    const auto format = !cudnn->channels_last ? at::MemoryFormat::Contiguous
                        : input.dim() == 5    ? at::MemoryFormat::ChannelsLast3d
                                              : at::MemoryFormat::ChannelsLast;
    auto out = at::empty(shape, input.options().memory_format(format));
    if (transposed) {
      cudnn_pass_workspace(ConvolutionPass::kBackwardData, *cudnn, input.scalar_type(), out.sizes(), weight.sizes(),
                           input.sizes(), input.options());
    } else {
      cudnn_pass_workspace(ConvolutionPass::kForward, *cudnn, input.scalar_type(), input.sizes(), weight.sizes(),
                           out.sizes(), input.options());
    }
    return out;
  }
  if (!for_cpu() || spatial != 2) return at::empty(shape, options);
  if (!cpu_uses_mkldnn(input, weight, stride, dilation, groups)) {
    return meta_conv_slow_forward(input, weight, bias, shape, stride, padding, dilation, transposed, groups);
  }
  // oneDNN's (the host's kernels). It takes a contiguous input: a strided one (a permuted view) is copied first, and
  // the copy lives until the convolution returns.
  auto contiguous = input.is_contiguous(input.suggest_memory_format()) ? at::Tensor() : at::empty_like(input, input.suggest_memory_format());
  if (!transposed) {
    // oneDNN (ideep) reorders the input into its blocked layout (channels padded to 16; not for a first layer of
    // fewer than 16 channels, read as it is), and the weight, computes into a blocked buffer of the output, then
    // reorders that into the output: all but the output are freed when it returns.
    const auto layout = OneDnnLayout::of(input, weight, groups);
    if (layout.depthwise && input.suggest_memory_format() == at::MemoryFormat::ChannelsLast) {
      // Channels last is oneDNN's own layout: the output is computed in place, only the weight is reordered.
      auto out = at::empty(shape, options);
      auto w = blocked(input.options(), layout.forward_weight_elements());
      return out;
    }
    auto x = layout.first_conv ? at::Tensor() : blocked(input.options(), layout.pad(input.size(1)) * spatial_numel(input));
    auto w = blocked(input.options(), layout.forward_weight_elements());
    auto buffer = blocked(input.options(), layout.pad(shape[1]) * shape[0] * shape[2] * shape[3]);
    w.reset();
    x.reset();
    auto out = at::empty(shape, options);
    return out;
  }
  const auto kh = weight.size(2), kw = weight.size(3);
  {
    if (input.scalar_type() == at::kBFloat16) {
      // oneDNN's brgemm deconvolution in bf16: a scratchpad (a 32 KiB batch buffer, and one output row with its
      // channels padded to 16), the input and the padded weight reordered, the output computed in place; then
      // two output-sized copies on the way out. Channels last is its own layout: no reorder of the input, no copies.
      const auto padded_out = OneDnnLayout::pad(shape[1]);
      const auto row = (shape[3] * padded_out * input.element_size() + 255) / 256 * 256;
      const auto scratch_bytes = 32768 + 152 + row;
      const auto w_elements = padded_out * input.size(1) * kh * kw;
      if (input.suggest_memory_format() == at::MemoryFormat::ChannelsLast) {
        auto out = at::empty(shape, options);
        auto scratch = at::empty({scratch_bytes}, input.options().dtype(at::kByte));
        auto w = blocked(input.options(), w_elements);
        return out;
      }
      auto scratch = at::empty({scratch_bytes}, input.options().dtype(at::kByte));
      auto x = blocked(input.options(), input.numel());
      auto w = blocked(input.options(), w_elements);
      auto out = at::empty(shape, options);
      w.reset();
      x.reset();
      scratch.reset();
      auto first = at::empty(shape, options);
      auto second = at::empty(shape, options);
      return out;
    }
    auto reordered = at::empty_like(weight);
    auto buffer = at::empty(shape, options);
    return at::empty(shape, options);
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
    at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed, at::IntArrayRef output_padding, int64_t groups,
    std::array<bool, 3> mask) {
  at::Tensor gi, gw, gb;
  if (for_cpu() && input.dim() == 4 && !cpu_uses_mkldnn(input, weight, stride, dilation, groups)) {
    return meta_conv_slow_backward(grad_output, input, weight, stride, padding, dilation, transposed, groups, mask);
  }
  const bool cpu_2d = for_cpu() && input.dim() == 4 && !transposed;
  if (cpu_2d && cpu_uses_mkldnn(input, weight, stride, dilation, groups)) {
    const auto layout = OneDnnLayout::of(input, weight, groups);
    const auto o = input.options();
    if (layout.depthwise && input.suggest_memory_format() == at::MemoryFormat::ChannelsLast) {
      // Channels last: the input's gradient computed in place, the weight reordered for it; the weight's gradient
      // through GEMM above 3x3, whose scratchpad holds im2col columns for 256 output pixels at a time, computed in
      // oneDNN's layout and reordered into the dense gradient.
      if (mask[0]) {
        gi = at::empty_like(input, at::MemoryFormat::ChannelsLast);
        auto w = blocked(o, layout.backward_data_weight_elements());
      }
      if (mask[1] || mask[2]) {
        auto scratch = layout.gemm_weights() ? blocked(o, input.size(1) * layout.kh * layout.kw * 256) : at::Tensor();
        if (mask[2]) gb = at::empty({grad_output.size(1)}, grad_output.options());
        auto gw_blocked = blocked(o, weight.numel());
        if (mask[1]) gw = at::empty_like(weight, weight.suggest_memory_format());
      }
      return {gi, gw, gb};
    }
    const auto y_blocked = layout.pad(grad_output.size(1)) * spatial_numel(grad_output);
    const auto x_blocked = layout.pad(input.size(1)) * spatial_numel(input);
    if (mask[0]) {
      // Data: the output's gradient and the weight reordered, the input's gradient computed blocked, then
      // reordered into the dense gradient.
      auto gy = blocked(o, y_blocked);
      auto w = blocked(o, layout.backward_data_weight_elements());
      auto gx = blocked(o, x_blocked);
      w.reset();
      gy.reset();
      gi = at::empty_like(input, input.suggest_memory_format());
    }
    if (mask[1] || mask[2]) {
      at::Tensor gw_blocked;
      if (layout.gemm_weights()) {
        // GEMM: the weight's gradient, and a scratchpad of one group's im2col columns, four weight-sized
        // reduction buffers and an alignment page.
        gw_blocked = blocked(o, weight.numel());
        const auto columns = input.size(1) / groups * layout.kh * layout.kw * grad_output.size(2) * grad_output.size(3);
        auto scratch = at::empty({static_cast<int64_t>(columns * input.element_size() + 4 * weight.nbytes() + 256)},
                                 o.dtype(at::kByte));
      } else {
        // jit: the output's gradient and the input reordered (a first layer reads its input as it is), the
        // weight's gradient computed blocked.
        auto gy = blocked(o, y_blocked);
        auto x = layout.first_conv ? at::Tensor() : blocked(o, x_blocked);
        gw_blocked = blocked(o, layout.first_conv ? layout.forward_weight_elements() : layout.backward_data_weight_elements());
        if (input.scalar_type() == at::kBFloat16 && !(layout.kh == 1 && layout.kw == 1)) {
          // jit_bf16's scratchpad: the input transposed row by row (not for a first layer), the output's gradient
          // transposed, an fp32 accumulator of the weight's gradient (and the bias's), and 8580 bytes of guards
          // and barriers (jit_avx512_core_bf16_conv_bwd_weights_kernel_f32::init_scratchpad, one thread).
          const auto ih = input.size(2), iw = input.size(3), oh = grad_output.size(2), ow = grad_output.size(3);
          const auto sw = stride[stride.size() - 1], pw = padding[padding.size() - 1];
          const auto r_pad = std::max<int64_t>((ow - 1) * sw + (layout.kw - 1) * dilation[dilation.size() - 1] + 1 - iw - pw, 0);
          const auto tr_iw = (iw + pw + r_pad + 2 * sw - 1) / (2 * sw) * (2 * sw);
          const auto tr_ow = (ow + 1) / 2 * 2;
          const auto tr_src = layout.first_conv ? 0 : 16 * 2 * ih * tr_iw * OneDnnLayout::blocks(input.size(1));
          const auto tr_diff_dst = 16 * 2 * oh * tr_ow * OneDnnLayout::blocks(grad_output.size(1));
          const auto accumulator = (weight.numel() + (mask[2] ? grad_output.size(1) : 0)) * 4;
          auto scratch = at::empty({tr_src + tr_diff_dst + accumulator + 8580 + (layout.first_conv ? 4 : 0)},
                                   o.dtype(at::kByte));
        }
      }
      if (mask[1]) gw = at::empty_like(weight, weight.suggest_memory_format());
      if (mask[2]) gb = at::empty({grad_output.size(1)}, grad_output.options());
    }
    return {gi, gw, gb};
  }
  // The CPU's convolutions without oneDNN are meta_conv_slow_backward's, above; its transposed ones, and CUDA's
  // (cuDNN): the gradients.
  const auto cudnn =
      cuda_cudnn_geometry(input, weight, stride, padding, dilation, transposed, output_padding, groups);
  if (mask[0]) {
    gi = at::empty_like(input, input.suggest_memory_format());
    // cudnn_convolution_backward: the input's gradient (backward data: dx the input's gradient, dy the output's), then
    // cudnn_convolution_transpose_backward: a forward pass of the output's gradient.
    if (cudnn && input.numel() > 0) {
      if (transposed) {
        cudnn_pass_workspace(ConvolutionPass::kForward, *cudnn, input.scalar_type(), grad_output.sizes(),
                             weight.sizes(), input.sizes(), input.options());
      } else {
        cudnn_pass_workspace(ConvolutionPass::kBackwardData, *cudnn, input.scalar_type(), input.sizes(),
                             weight.sizes(), grad_output.sizes(), input.options());
      }
    }
  }
  if (mask[1]) {
    gw = at::empty_like(weight, weight.suggest_memory_format());
    if (cudnn && input.numel() > 0) {
      // cudnn_convolution_backward_weight: its memory format is the input's and the output gradient's, which
      // cudnn_convolution_backward first brought to the input's: the weight's own is not asked. For a transposed
      // convolution the two swap roles.
      auto filter = *cudnn;
      const auto& x = transposed ? grad_output : input;
      const auto& dy = transposed ? input : grad_output;
      filter.channels_last = !cudnn->one_dimensional && input.scalar_type() != at::kDouble &&
                             input.suggest_memory_format() != at::MemoryFormat::Contiguous;
      cudnn_pass_workspace(ConvolutionPass::kBackwardFilter, filter, input.scalar_type(), x.sizes(), weight.sizes(),
                           dy.sizes(), input.options());
    }
  }
  if (mask[2]) {
    // On CUDA the bias's gradient is grad_output.sum over all dims but the channels (convolution_backward, after
    // cuDNN's data and weight gradients), grad_output as it came: channels last where the layer's output was.
    gb = at::empty({grad_output.size(1)}, grad_output.options());
    std::vector<int64_t> dims{0};
    for (int64_t d = 2; d < grad_output.dim(); ++d) dims.push_back(d);
    cuda_reduction_buffers(grad_output, dims, grad_output.scalar_type());
  }
  return {gi, gw, gb};
}

// --- embedding -----------------------------------------------------------------------------------------------
at::Tensor index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  auto sizes = self.sizes().vec();
  if (!sizes.empty()) sizes[at::maybe_wrap_dim(dim, self.dim())] = index.numel();
  return at::empty(sizes, self.options());
}

at::Tensor embedding_dense_backward(const at::Tensor& grad_output, const at::Tensor& /*indices*/, int64_t num_weights,
                                   int64_t /*padding_idx*/, bool /*scale_grad_by_freq*/) {
  return at::zeros({num_weights, grad_output.size(-1)}, grad_output.options());
}

// --- layer norm ----------------------------------------------------------------------------------------------
// The CPU's layer norm, forward and backward (layer_norm_cpu, layer_norm_backward_cpu), first takes contiguous copies
// of its input, weight and bias where they are not (expect_contiguous: a permuted input, as ConvNeXt's and Swin's
// norms over channels last get), held until it returns (for the CPU only: CUDA's are not modelled here).
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

// --- scaled dot-product attention ----------------------------------------------------------------------------
// Which kernel the target picks (sdp::SDPBackend). On the CPU, PyTorch 2.11's select_sdp_backend_cpp
// (sdp_utils_cpp.cpp): flash attention unless one of use_flash_attention_cpp's checks fails, else the math path.
// On CUDA: flash attention for 16-bit inputs and memory-efficient attention otherwise (head dims a multiple of 8;
// else the math path), without a mask or dropout.
enum class Sdp { kMath, kFlash, kEfficient };

// use_flash_attention_cpp's checks, in its order (sdp_utils_cpp.h), for dense inputs: flash attention not turned
// off (torch.backends.cuda.enable_flash_sdp(False), sdpa_kernel), no dropout, 4-D query, key and value, one batch size
// and one head count (grouped-query attention: key and value alike, query's heads a multiple of theirs), a mask
// (check_attn_mask_shape) that does not require grad, whose last two sizes are the query's and the key's length or
// 1, 2-D or 4-D with a batch of 1 or the query's and heads of 1 or the query's (a 3-D mask takes the math path),
// one head dim, no empty sequence, unit strides along the head dim, and one floating type among float, double,
// bf16 and fp16.
bool cpu_flash_takes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const std::optional<at::Tensor>& mask, double dropout_p, bool enable_gqa) {
  if (!at::globalContext().userEnabledFlashSDP()) return false;
  if (q.is_nested() || k.is_nested() || v.is_nested()) return false;
  if (dropout_p > 0.0) return false;
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return false;
  if (q.size(0) != k.size(0) || q.size(0) != v.size(0)) return false;
  if (enable_gqa) {
    if (k.size(1) != v.size(1) || k.size(1) == 0 || q.size(1) % k.size(1) != 0) return false;
  } else if (q.size(1) != k.size(1) || q.size(1) != v.size(1)) {
    return false;
  }
  if (mask && mask->defined()) {
    const auto& m = *mask;
    if (m.requires_grad() || m.dim() < 2) return false;
    if (m.size(-2) != q.size(2) && m.size(-2) != 1) return false;
    if (m.size(-1) != k.size(2) && m.size(-1) != 1) return false;
    const bool four = m.dim() == 4 && (m.size(0) == 1 || m.size(0) == q.size(0)) &&
                      (m.size(1) == 1 || m.size(1) == q.size(1));
    if (m.dim() != 2 && !four) return false;
  }
  if (q.size(-1) != k.size(-1) || q.size(-1) != v.size(-1)) return false;
  if (q.size(-2) == 0 || k.size(-2) == 0) return false;
  if (q.stride(-1) != 1 || k.stride(-1) != 1 || v.stride(-1) != 1) return false;
  const auto t = q.scalar_type();
  return t == k.scalar_type() && t == v.scalar_type() &&
         (t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf);
}

Sdp sdp_choice(const at::Tensor& query) {
  const auto t = query.scalar_type();
  if (query.dim() != 4) return Sdp::kMath;
  const auto head_dim = query.size(-1);
  if ((t == at::kHalf || t == at::kBFloat16) && head_dim % 8 == 0 && head_dim <= 256) return Sdp::kFlash;
  if (head_dim % 8 == 0) return Sdp::kEfficient;
  return Sdp::kMath;
}

// A boolean mask made additive, as attention.cpp's convert_boolean_attn_mask does before every kernel (the math
// path's too): where with two 0-dim scalars, of the query's type. Any other mask is used as it is.
std::optional<at::Tensor> additive_mask(const std::optional<at::Tensor>& mask, const at::Tensor& q) {
  if (!mask || !mask->defined() || mask->scalar_type() != at::kBool) return mask;
  const auto zero = at::scalar_tensor(0.0, q.options());
  const auto minus_infinity = at::scalar_tensor(-std::numeric_limits<double>::infinity(), q.options());
  return at::where(*mask, zero, minus_infinity);
}

// scaled_dot_product_attention on Meta, registered at AutogradMeta (ahead of its CompositeImplicit decomposition,
// which picks its kernel by device and takes the math path on Meta): the kernel the target would run, whose own
// autograd then saves what that kernel's does.
at::Tensor meta_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const std::optional<at::Tensor>& attn_mask, double dropout_p, bool causal,
                          std::optional<double> scale, bool enable_gqa) {
  const bool masked = attn_mask && attn_mask->defined();
  if (for_cpu()) {
    // The CPU's flash attention takes a mask too (a sliding window's, a padded batch's): a boolean one converted
    // first, which the kernel's autograd saves for its backward. A mask that requires grad (a learned bias added as
    // the mask) takes the math path, whose autograd gives it its gradient.
    const auto mask = additive_mask(attn_mask, q);
    if (cpu_flash_takes(q, k, v, attn_mask, dropout_p, enable_gqa)) {
      return std::get<0>(at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, mask, scale));
    }
    return std::get<0>(
        at::_scaled_dot_product_attention_math(q, k, v, mask, dropout_p, causal, std::nullopt, scale, enable_gqa));
  }
  const bool plain = !masked && dropout_p == 0.0 && !enable_gqa;
  switch (plain ? sdp_choice(q) : Sdp::kMath) {
    case Sdp::kFlash:
      return std::get<0>(at::_scaled_dot_product_flash_attention(q, k, v, 0.0, causal, false, scale));
    case Sdp::kEfficient: {
      const bool grad = at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
      return std::get<0>(at::_scaled_dot_product_efficient_attention(q, k, v, std::nullopt, grad, 0.0, causal, scale));
    }
    case Sdp::kMath:
      break;
  }
  return std::get<0>(at::_scaled_dot_product_attention_math(q, k, v, attn_mask, dropout_p, causal, std::nullopt, scale,
                                                             enable_gqa));
}

at::Tensor relu(const at::Tensor& self) { return at::empty_like(self); }

// flip (an augmentation's horizontal flip, and its own backward): a new tensor of the input's shape and layout, as
// the CPU's and CUDA's TensorIterator output (empty_like, preserving the strides).
at::Tensor flip(const at::Tensor& self, at::IntArrayRef /*dims*/) { return at::empty_like(self); }

// --- matmul --------------------------------------------------------------------------------------------------
// A bf16 matmul on the CPU goes to oneDNN's brgemm above 16x16x16: the output, then a scratchpad freed on return:
// 1 KiB, B packed in blocks of 64 columns (k rounded up to 32, two bytes each), and an fp32 accumulator of one
// block of rows (up to 256, else halved) by one of at most 64 columns.
// Returns whether oneDNN took the product.
bool cpu_bf16_matmul_scratch(const at::Tensor& a, int64_t n) {
  if (!for_cpu_host() || a.scalar_type() != at::kBFloat16 || !cpu_mkldnn_takes(at::kBFloat16)) return false;
  const auto m = a.size(0), k = a.size(1);
  if (m * k * n <= 16 * 16 * 16) return false;
  const auto m_blocks = (m + 255) / 256;
  const auto m_block = (m + m_blocks - 1) / m_blocks;
  const auto n_block = std::min<int64_t>(n, 64);
  auto scratch = at::empty({1024 + (k + 31) / 32 * 32 * 64 * 2 + m_block * n_block * 4}, a.options().dtype(at::kByte));
  return true;
}

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

// The CPU flash attention kernel's blocks: rows of queries and columns of keys it works on at a time.
struct FlashBlocks {
  int64_t q, kv;
};
FlashBlocks flash_blocks(const at::Tensor& query, const at::Tensor& key) {
  const auto l = query.size(2);
  const int64_t q_split = l >= 768 ? 256 : (l >= 192 ? 64 : 32);
  return {std::min(q_split, l), std::min<int64_t>(512, key.size(2))};
}

std::tuple<at::Tensor, at::Tensor> flash_attention_cpu(const at::Tensor& query, const at::Tensor& key,
                                                       const at::Tensor&, double, bool,
                                                       const std::optional<at::Tensor>& mask, std::optional<double>) {
  const auto b = query.size(0), h = query.size(1), l = query.size(2), e = query.size(3);
  TORCH_CHECK(!mask || !mask->defined() || mask->scalar_type() == at::kFloat ||
                  mask->scalar_type() == query.scalar_type(),
              "scaled_dot_product_attention_flash_attention: Attention mask is the same data type as query");
  TORCH_CHECK(!mask || !mask->defined() || mask->dim() == 2 || mask->dim() == 4,
              "scaled_dot_product_attention_flash_attention: Attention mask dim in {2, 4}");
  const auto acc = query.options().dtype(accumulate_type(query.scalar_type()));
  // The output is laid out as the query is (attention.cpp: empty_like(query), which keeps a dense query's strides
  // and a strided one's order of dimensions): [B, H, L, D] for a contiguous query, [B, L, H, D] for one viewed from
  // [B, L, H, D] (nn.MultiheadAttention's, timm's); a later .contiguous() copies for one and not the other.
  auto out = at::empty_like(query);
  auto lse = at::empty({b, l, h}, acc);
  // The kernel's per-thread scratch (one thread, cpu_flash_attention): q-block x kv-block scores, max and sum, and a
  // q-block output in the accumulation type; for bf16 and fp16 also the scores in the input's type (buf_reduced).
  const auto [qs, ks] = flash_blocks(query, key);
  auto buf = at::empty({1, qs * ks + qs + qs + qs * e}, acc);
  const bool reduced = accumulate_type(query.scalar_type()) != query.scalar_type();  // bf16, fp16
  auto buf_reduced = at::empty({1, qs, reduced ? ks : 0}, query.options());
  return {out, lse.transpose(1, 2)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_attention_cpu_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor&, const at::Tensor&, double, bool, const std::optional<at::Tensor>&, std::optional<double>) {
  auto gq = at::empty({query.size(0), query.size(2), query.size(1), query.size(3)}, query.options());
  auto gk = at::empty({key.size(0), key.size(2), key.size(1), key.size(3)}, key.options());
  auto gv = at::empty({value.size(0), value.size(2), value.size(1), value.size(3)}, value.options());
  // The output's gradient as [B, L, H, D], made contiguous where it is not (flash_attention_backward_kernel_impl:
  // grad_out.contiguous(), held until the kernel returns): a copy where the output was laid out otherwise (a query
  // viewed from [L, B, H, D] or made contiguous as [B, H, L, D]) or its gradient broadcast.
  const auto grad_out_contiguous = grad_out.transpose(1, 2).contiguous();
  // Its scratch (cpu_flash_attention_backward, one thread): the attention and its gradient for a block in the
  // accumulation type, the same two in the input's type for bf16 and fp16 (buf_reduced), and a q-block's row sums.
  const auto [qs, ks] = flash_blocks(query, key);
  const auto acc = query.options().dtype(accumulate_type(query.scalar_type()));
  const bool reduced = accumulate_type(query.scalar_type()) != query.scalar_type();  // bf16, fp16
  auto buf = at::empty({1, 2 * qs * ks}, acc);
  auto buf_reduced = at::empty({1, reduced ? 2 * qs * ks : 0}, query.options());
  auto dsum = at::empty({qs}, acc);
  return {gq.transpose(1, 2), gk.transpose(1, 2), gv.transpose(1, 2)};
}

// CUDA's flash attention: (out, logsumexp [B, H, L] fp32, cum_seq_q, cum_seq_k, max_q, max_k, rng_state, unused,
// debug mask).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor, at::Tensor, at::Tensor>
flash_attention_cuda(const at::Tensor& query, const at::Tensor& key, const at::Tensor&, double, bool, bool,
                     std::optional<double>) {
  const auto b = query.size(0), h = query.size(1), l = query.size(2), e = query.size(3);
  auto out = at::empty({b, l, h, e}, query.options()).transpose(1, 2);
  auto lse = at::empty({b, h, l}, query.options().dtype(at::kFloat));
  auto rng = at::empty({2}, query.options().dtype(at::kLong));
  return {out,    lse, at::Tensor(), at::Tensor(), c10::SymInt(l), c10::SymInt(key.size(2)), rng, at::empty({0}, query.options().dtype(at::kLong)),
          at::empty({0}, query.options())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_attention_cuda_backward(
    const at::Tensor&, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor&,
    const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, int64_t, double, bool, const at::Tensor&,
    const at::Tensor&, std::optional<double>) {
  return {at::empty_like(query), at::empty_like(key), at::empty_like(value)};
}

// CUDA's memory-efficient attention: (out, logsumexp [B, H, ceil(L / 32) x 32] fp32, seed, offset).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> efficient_attention_cuda(
    const at::Tensor& query, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, bool compute_lse,
    double, bool, std::optional<double>) {
  const auto b = query.size(0), h = query.size(1), l = query.size(2), e = query.size(3);
  auto out = at::empty({b, l, h, e}, query.options()).transpose(1, 2);
  auto lse = at::empty({b, h, compute_lse ? (l + 31) / 32 * 32 : 0}, query.options().dtype(at::kFloat));
  auto seed = at::empty({}, query.options().dtype(at::kLong));
  auto offset = at::empty({}, query.options().dtype(at::kLong));
  return {out, lse, seed, offset};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> efficient_attention_cuda_backward(
    const at::Tensor&, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& bias,
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double, std::array<bool, 4> mask, bool,
    std::optional<double>) {
  auto gq = at::empty_like(query), gk = at::empty_like(key), gv = at::empty_like(value);
  at::Tensor gb;
  if (mask[3] && bias.defined()) gb = at::empty_like(bias);
  return {gq, gk, gv, gb};
}

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

}  // namespace

EstimateTarget meta_kernels_target() { return g_kernels_target.load(); }

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

void use_meta_kernels_for(EstimateTarget target, CpuKernels cpu_kernels) {
  g_kernels_target.store(target);
  g_cpu_kernels.store(cpu_kernels);
  use_meta_autocast_for(target);
  static std::once_flag once;
  std::call_once(once, [] {
    static torch::Library autograd(torch::Library::IMPL, "aten", c10::DispatchKey::AutogradMeta, __FILE__, __LINE__);
    autograd.impl("scaled_dot_product_attention", TORCH_FN(meta_attention));
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
    lib.impl("arange.start_out", TORCH_FN(arange_out));
    lib.impl("resize_", TORCH_FN(resize_));
    for (const auto* op : {"_fused_adamw_", "_fused_adamw_.tensor_lr", "_fused_adam_", "_fused_adam_.tensor_lr",
                           "_fused_sgd_", "_fused_sgd_.tensor_lr"}) {
      lib.impl(op, torch::CppFunction::makeFromBoxedFunction<&fused_optimizer_in_place>());
    }
    at::addGlobalCallback(at::RecordFunctionCallback(&enter_backward_function, &exit_backward_function)
                              .scopes({at::RecordScope::BACKWARD_FUNCTION}));
  });
}

}  // namespace memgate
