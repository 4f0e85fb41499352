// Meta kernels for convolution: the CPU's backends without oneDNN (Slow2d, SlowDilated2d, SlowTranspose2d, their
// groups one at a time), oneDNN's where the CPU picks it (meta_onednn.cpp), and CUDA's cuDNN with its workspaces.
#include "meta_kernels_internal.h"

#include "memgate/estimate/cudnn_workspace.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

namespace memgate::meta_kernels {
namespace {

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

// The product of a tensor's sizes from dim 2 on: a kernel's or an image's spatial size, 2-D or 3-D.
int64_t spatial_numel(at::IntArrayRef sizes) {
  int64_t n = 1;
  for (std::size_t d = 2; d < sizes.size(); ++d) n *= sizes[d];
  return n;
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
                                   at::IntArrayRef stride, at::IntArrayRef padding, MetaSlowConv backend,
                                   bool has_bias) {
  const auto kh = weight.size(2), kw = weight.size(3);
  const auto options = input.options().memory_format(meta_conv_group_format(input, weight, false));
  if (backend == MetaSlowConv::kTranspose2d && input.dim() == 5) {
    // SlowTranspose3d: slow_conv_transpose3d_cpu (NaiveConvolutionTranspose3d.cpp) makes the output as
    // empty_like(input) and resizes it; then one image's columns [C_out * kd * kh * kw, iD * iH * iW] and, with a
    // bias, ones of the output's spatial size; both freed on return.
    auto out = at::empty(input.sizes(), input.options().memory_format(at::MemoryFormat::Contiguous));
    out.resize_(shape);
    const auto columns =
        at::empty({weight.size(1) * spatial_numel(weight.sizes()), spatial_numel(input.sizes())}, input.options());
    const auto ones = has_bias ? at::empty(at::IntArrayRef(shape).slice(2), input.options()) : at::Tensor();
    return out;
  }
  if (backend == MetaSlowConv::kTranspose2d) {
    auto out = at::empty(shape, options);
    auto columns = at::empty({input.size(0), weight.size(1) * kh * kw, input.size(2) * input.size(3)}, input.options());
    return out;
  }
  if (backend == MetaSlowConv::kDilated2d) {
    auto out = at::empty(shape, options);
    auto columns = at::empty({input.size(1) * spatial_numel(weight.sizes()), spatial_numel(shape)}, input.options());
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
  const bool has_bias = bias.has_value() && bias->defined();
  if (groups == 1) return meta_conv_group_forward(in, w, shape, stride, padding, backend, has_bias);
  shape[1] /= groups;
  std::vector<at::Tensor> outputs;
  outputs.reserve(static_cast<std::size_t>(groups));
  for (int64_t g = 0; g < groups; ++g) {
    const auto input_g = meta_conv_group_slice(in, 1, groups, g);
    const auto weight_g = meta_conv_group_slice(w, 0, groups, g);
    const auto bias_g = bias.has_value() ? meta_conv_group_slice(*bias, 0, groups, g) : at::Tensor();
    outputs.push_back(meta_conv_group_forward(input_g, weight_g, shape, stride, padding, backend, bias_g.defined()));
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
  if (backend == MetaSlowConv::kTranspose2d && input.dim() == 5) {
    // SlowTranspose3d's backward (slow_conv_transpose3d_backward_cpu): the input's gradient (the output gradient made
    // contiguous, the gradient, one image's columns where the kernel is not 1x1x1 at unit stride without padding or
    // dilation); the weight's and the bias's allocated; then slow_conv_transpose3d_acc_grad_parameters_cpu (the output
    // gradient made contiguous again, the same columns; the bias's a sum_out).
    const bool need_columns = spatial_numel(weight.sizes()) != 1 ||
                              std::any_of(stride.begin(), stride.end(), [](int64_t v) { return v != 1; }) ||
                              std::any_of(padding.begin(), padding.end(), [](int64_t v) { return v != 0; }) ||
                              std::any_of(dilation.begin(), dilation.end(), [](int64_t d) { return d != 1; });
    auto columns = [&] {
      return need_columns ? at::empty({weight.size(1) * spatial_numel(weight.sizes()), spatial_numel(input.sizes())},
                                      input.options())
                          : at::Tensor();
    };
    if (mask[0]) {
      const auto gy = grad_output.contiguous();
      gi = at::empty(input.sizes(), input.options().memory_format(at::MemoryFormat::Contiguous));
      const auto grad_columns = columns();
    }
    if (mask[1]) gw = at::empty(weight.sizes(), weight.options().memory_format(at::MemoryFormat::Contiguous));
    if (mask[2]) gb = at::empty({weight.size(1)}, weight.options());
    if (mask[1] || mask[2]) {
      const auto gy = grad_output.contiguous();
      const auto acc_columns = columns();
    }
    return {gi, gw, gb};
  }
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
                             ? at::empty({input.size(1) * spatial_numel(weight.sizes()),
                                          spatial_numel(grad_output.sizes())},
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

// --- the CPU's 3-D convolution without oneDNN: Slow3d ------------------------------------------------------------
// select_conv_backend (Convolution.cpp) sends a 3-D convolution that is neither transposed nor dilated to Slow3d on
// the CPU without oneDNN; it takes groups itself (gemm_batched_with_stride), so _convolution calls at::slow_conv3d on
// the input as it is. ConvolutionMM3d.cpp, in its order:
// - forward (slow_conv3d_forward_out_cpu): the output as an empty tensor of 0 bytes, the input and the weight made
//   contiguous (view_weight_2d), compute_columns3d's columns of every image ([B, C_in * kd * kh * kw, oD * oH * oW];
//   a view of the input for a 1x1x1 kernel at unit stride without padding and one group), then the output resized;
//   the columns and the copies freed on return.
// - backward (slow_conv3d_backward_cpu): the input's gradient (slow_conv3d_backward_out_cpu_template: the weight and
//   the output gradient made contiguous, the gradient resized as the input, then fgrad_input, the columns' shape, freed
//   with the copies); the bias's (sum_out over {0, 2, 3, 4}); the weight's (resized as the weight, then
//   slow_conv3d_backward_parameters_out_cpu_template: the output gradient made contiguous again and the columns
//   computed anew, freed on return).
// Before, the estimate allocated a 3-D convolution's output alone: torchvision's R(2+1)D-18 (video) was estimated
// 47% low in forward_peak and 1.4-2.7% low in eval_peak against the CPU's measurement.
bool meta_slow3d(const at::Tensor& input, at::IntArrayRef dilation, bool transposed) {
  return for_cpu() && !for_cpu_host() && input.dim() == 5 && !transposed &&
         std::all_of(dilation.begin(), dilation.end(), [](int64_t d) { return d == 1; });
}

// SlowDilated3d (a dilated 3-D convolution, portable kernels): NaiveDilatedConvolution.cpp's template is the 2-D one's
// for three spatial dims (the output, then one image's columns; its groups one at a time, in contiguous format), so it
// runs SlowDilated2d's steps above with the kernel's and the image's spatial sizes as products.
bool meta_dilated3d(const at::Tensor& input, bool transposed) {
  return for_cpu() && !for_cpu_host() && input.dim() == 5 && !transposed;
}

// SlowTranspose3d (a transposed 3-D convolution, portable kernels): its groups one at a time in contiguous format, as
// SlowTranspose2d's, each group allocating as NaiveConvolutionTranspose3d.cpp does (meta_conv_group_forward/_backward).
bool meta_transposed3d(const at::Tensor& input, bool transposed) {
  return for_cpu() && !for_cpu_host() && input.dim() == 5 && transposed;
}

bool unit_1x1x1(const at::Tensor& weight, at::IntArrayRef stride, at::IntArrayRef padding, int64_t groups) {
  const bool unit_stride = std::all_of(stride.begin(), stride.end(), [](int64_t v) { return v == 1; });
  const bool no_padding = std::all_of(padding.begin(), padding.end(), [](int64_t v) { return v == 0; });
  return weight.size(2) == 1 && weight.size(3) == 1 && weight.size(4) == 1 && unit_stride && no_padding &&
         groups == 1;
}

// compute_columns3d: the input made contiguous (a copy held by the caller where it is not), then its columns.
at::Tensor meta_columns3d(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef out_spatial,
                          at::IntArrayRef stride, at::IntArrayRef padding, int64_t groups) {
  if (unit_1x1x1(weight, stride, padding, groups)) return at::Tensor();
  const auto k = weight.size(2) * weight.size(3) * weight.size(4);
  return at::empty({input.size(0), input.size(1) * k, out_spatial[0] * out_spatial[1] * out_spatial[2]},
                   input.options().memory_format(at::MemoryFormat::Contiguous));
}

at::Tensor meta_slow3d_forward(const at::Tensor& input, const at::Tensor& weight, const std::vector<int64_t>& shape,
                               at::IntArrayRef stride, at::IntArrayRef padding, int64_t groups) {
  const auto in = input.contiguous();
  const auto w = weight.contiguous();
  const auto columns = meta_columns3d(in, w, at::IntArrayRef(shape).slice(2), stride, padding, groups);
  return at::empty(shape, input.options().memory_format(at::MemoryFormat::Contiguous));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> meta_slow3d_backward(const at::Tensor& grad_output,
                                                                   const at::Tensor& input, const at::Tensor& weight,
                                                                   at::IntArrayRef stride, at::IntArrayRef padding,
                                                                   int64_t groups, std::array<bool, 3> mask) {
  at::Tensor gi, gw, gb;
  const auto contiguous = input.options().memory_format(at::MemoryFormat::Contiguous);
  const auto out_spatial = grad_output.sizes().slice(2);
  if (mask[0]) {
    const auto w = weight.contiguous();
    const auto gy = grad_output.contiguous();
    gi = at::empty(input.sizes(), contiguous);
    const auto k = weight.size(2) * weight.size(3) * weight.size(4);
    const auto fgrad_input =
        at::empty({input.size(0), input.size(1) * k, out_spatial[0] * out_spatial[1] * out_spatial[2]}, contiguous);
  }
  if (mask[2]) gb = at::empty({grad_output.size(1)}, grad_output.options());
  if (mask[1]) {
    gw = at::empty(weight.sizes(), weight.options().memory_format(at::MemoryFormat::Contiguous));
    const auto gy = grad_output.contiguous();
    const auto in = input.contiguous();
    const auto columns = meta_columns3d(in, weight, out_spatial, stride, padding, groups);
  }
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

}  // namespace

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
  if (meta_slow3d(input, dilation, transposed)) {
    return meta_slow3d_forward(input, weight, shape, stride, padding, groups);
  }
  if (meta_dilated3d(input, transposed) || meta_transposed3d(input, transposed)) {
    return meta_conv_slow_forward(input, weight, bias, shape, stride, padding, dilation, transposed, groups);
  }
  if (!for_cpu() || spatial != 2) return at::empty(shape, options);
  if (!cpu_uses_mkldnn(input, weight, stride, dilation, groups)) {
    return meta_conv_slow_forward(input, weight, bias, shape, stride, padding, dilation, transposed, groups);
  }
  return onednn_convolution(input, weight, shape, options, transposed, groups);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
    at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed, at::IntArrayRef output_padding, int64_t groups,
    std::array<bool, 3> mask) {
  at::Tensor gi, gw, gb;
  if (meta_slow3d(input, dilation, transposed)) {
    return meta_slow3d_backward(grad_output, input, weight, stride, padding, groups, mask);
  }
  if (meta_dilated3d(input, transposed) || meta_transposed3d(input, transposed)) {
    return meta_conv_slow_backward(grad_output, input, weight, stride, padding, dilation, transposed, groups, mask);
  }
  if (for_cpu() && input.dim() == 4 && !cpu_uses_mkldnn(input, weight, stride, dilation, groups)) {
    return meta_conv_slow_backward(grad_output, input, weight, stride, padding, dilation, transposed, groups, mask);
  }
  const bool cpu_2d = for_cpu() && input.dim() == 4 && !transposed;
  if (cpu_2d && cpu_uses_mkldnn(input, weight, stride, dilation, groups)) {
    return onednn_convolution_backward(grad_output, input, weight, stride, padding, dilation, groups, mask);
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

}  // namespace memgate::meta_kernels
