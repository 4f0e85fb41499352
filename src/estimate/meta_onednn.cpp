// What oneDNN holds on the CPU (the host's kernels): whether PyTorch picks it, and the blocked layouts, reorders and
// scratchpads of its convolutions and bf16 matmuls, as the counting allocator sees them (one thread, AVX-512).
#include "meta_kernels_internal.h"

#include <ATen/ATen.h>
#include <ATen/cpu/Utils.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

namespace memgate::meta_kernels {

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

namespace {


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

}  // namespace

// The forward of a 2-D convolution that cpu_uses_mkldnn sends to oneDNN (convolution, meta_convolution.cpp).
at::Tensor onednn_convolution(const at::Tensor& input, const at::Tensor& weight, const std::vector<int64_t>& shape,
                              const at::TensorOptions& options, bool transposed, int64_t groups) {
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

// The backward of a 2-D convolution, not transposed, that cpu_uses_mkldnn sends to oneDNN.
std::tuple<at::Tensor, at::Tensor, at::Tensor> onednn_convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
    at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups, std::array<bool, 3> mask) {
  at::Tensor gi, gw, gb;
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

}  // namespace memgate::meta_kernels
