// Meta kernels for scaled-dot-product attention: the kernel the target picks (PyTorch 2.11's sdp_utils), and what
// the CPU's flash attention and CUDA's flash and memory-efficient attention allocate, forward and backward; and the
// fused ops of nn.MultiheadAttention's and nn.TransformerEncoderLayer's fast path (their inference).
#include "meta_kernels_internal.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/_native_multi_head_attention_native.h>
#include <ATen/ops/_transformer_encoder_layer_fwd_native.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>

namespace memgate::meta_kernels {
namespace {

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

}  // namespace


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

namespace {


// The CPU flash attention kernel's blocks: rows of queries and columns of keys it works on at a time.
struct FlashBlocks {
  int64_t q, kv;
};
FlashBlocks flash_blocks(const at::Tensor& query, const at::Tensor& key) {
  const auto l = query.size(2);
  const int64_t q_split = l >= 768 ? 256 : (l >= 192 ? 64 : 32);
  return {std::min(q_split, l), std::min<int64_t>(512, key.size(2))};
}

}  // namespace


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

// --- nn.MultiheadAttention's and nn.TransformerEncoderLayer's fast path ---------------------------------------------
// In inference (eval, no gradient needed, batch first, ... : torch/nn/modules/activation.py and transformer.py decide,
// and memgate._meta lets them decide so for Meta tensors as for the target's), nn.TransformerEncoderLayer calls
// _transformer_encoder_layer_fwd and nn.MultiheadAttention _native_multi_head_attention. Both are ATen's own
// composites of other ops (transformer.cpp's transformer_encoder_layer_forward, attention.cpp's
// native_multi_head_attention_cpu), registered here for the Meta device as they are: their parts run on Meta and
// allocate what the CPU's do, down to the two kernels that compute from data, whose Meta kernels follow.

// _transform_bias_rescale_qkv (attention.cpp's transform_bias_rescale_qkv_cpu): q, k and v as one [3, B, heads, T,
// head dim] tensor, split; the projection and the bias read contiguous (expect_contiguous: a copy where they are not,
// freed on return).
std::tuple<at::Tensor, at::Tensor, at::Tensor> transform_bias_rescale_qkv(const at::Tensor& qkv,
                                                                          const at::Tensor& qkv_bias,
                                                                          int64_t num_head) {
  TORCH_CHECK(!qkv.is_nested(), "memgate's Meta kernel of _transform_bias_rescale_qkv takes no nested tensor");
  const auto b = qkv.size(0), t = qkv.size(1), three_d = qkv.size(2);
  const auto d = three_d / 3;
  TORCH_CHECK(d % num_head == 0);
  TORCH_CHECK(three_d % 3 == 0);
  const auto dim_per_head = d / num_head;
  auto q_k_v = at::empty({3, b, num_head, t, dim_per_head}, qkv.options());
  {
    const auto qkv_contiguous = qkv.expect_contiguous();
    const auto bias_contiguous = qkv_bias.expect_contiguous();
  }
  auto s = q_k_v.view({3 * b, num_head, t, dim_per_head}).split(b, 0);
  return {s[0], s[1], s[2]};
}

// _masked_softmax (SoftMax.cpp's masked_softmax_cpu): the mask made contiguous (a copy where it is not), expanded to
// the scores' shape and made contiguous where a padding (1) or an attention (0) mask is not applied along the last
// dimension, then the output (empty_like) and the input made contiguous, freed on return.
at::Tensor masked_softmax(const at::Tensor& input, const at::Tensor& mask_in, std::optional<int64_t> dim,
                          std::optional<int64_t> mask_type_in) {
  auto mask = mask_in.contiguous();
  auto mask_type = mask_type_in;
  TORCH_CHECK(mask_in.scalar_type() == at::ScalarType::Bool, "Mask should be a boolean tensor");
  if (mask.dim() != 2 || input.dim() != 4) mask_type = 2;
  if (mask_type == 2) {
    TORCH_CHECK(input.sizes() == mask.sizes(), "For mask_type == 2 mask shape should match input shape");
  } else if (mask_type == 1) {
    TORCH_CHECK(input.size(0) == mask.size(0) && input.size(2) == mask.size(1),
                "For mask_type == 1 mask shape should be (B, L)");
    if (dim != input.dim() - 1) {
      mask = mask_in.view({input.size(0), 1, 1, input.size(2)}).expand(input.sizes()).contiguous();
    }
  } else if (mask_type == 0) {
    TORCH_CHECK(mask.dim() == 2 && input.size(2) == mask.size(0) && input.size(2) == mask.size(1),
                "For mask_type == 0 mask shape should be (L, L)");
    if (dim != input.dim() - 1) mask = mask.view({1, 1, input.size(2), input.size(2)}).expand(input.sizes()).contiguous();
  }
  auto output = at::empty_like(input, input.options());
  const auto contiguous = input.contiguous();
  return output;
}

// _native_multi_head_attention. For the CPU, attention.cpp's native_multi_head_attention_cpu itself: the projection
// (qkv_projection), _transform_bias_rescale_qkv, q k^T by bmm, the masked softmax (a mask of another type made boolean
// first), its product with v into q's storage, and the output projection after the heads are made contiguous. For
// CUDA (native_multi_head_attention_cuda), self-attention without weights, without a mask and with a head dim a
// multiple of 8 that CUDA's choice sends to flash or memory-efficient attention projects with linear, attends by
// scaled_dot_product_attention over views of the three chunks, and projects the heads reshaped back; any other call
// runs as the CPU's does.
std::tuple<at::Tensor, at::Tensor> native_multi_head_attention(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, int64_t embed_dim, int64_t num_head,
    const at::Tensor& qkv_weight, const at::Tensor& qkv_bias, const at::Tensor& proj_weight,
    const at::Tensor& proj_bias, const std::optional<at::Tensor>& mask, bool need_weights, bool average_attn_weights,
    std::optional<int64_t> mask_type) {
  const auto dim_per_head = num_head > 0 ? embed_dim / num_head : 0;
  const bool masked = mask.has_value() && mask->defined();
  if (!for_cpu() && !query.is_nested() && query.dim() == 3 && query.is_same(key) && key.is_same(value) &&
      dim_per_head % 8 == 0 && !need_weights && !masked) {
    const auto b = query.size(0);
    const auto q = query.view({b, -1, num_head, dim_per_head}).transpose(1, 2);
    const auto choice = sdp_choice(q);
    if (choice == Sdp::kFlash || choice == Sdp::kEfficient) {
      auto x = at::linear(query, qkv_weight, qkv_bias);
      auto chunks = x.chunk(3, -1);
      for (auto& chunk : chunks) chunk = chunk.view({b, -1, num_head, dim_per_head}).transpose(1, 2);
      // x, its chunks and y live until the function returns, past the output projection.
      const auto y = meta_attention(chunks[0], chunks[1], chunks[2], std::nullopt, 0.0, false, std::nullopt, false);
      const auto heads = y.transpose(1, 2).reshape({b, -1, embed_dim});
      return {at::linear(heads, proj_weight, proj_bias), at::Tensor()};
    }
  }
  return at::native::native_multi_head_attention_cpu(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias,
                                                     proj_weight, proj_bias, mask, need_weights, average_attn_weights,
                                                     mask_type);
}

// _transformer_encoder_layer_fwd: transformer.cpp's transformer_encoder_layer_forward, for either target (its
// attention is _native_multi_head_attention's, above; layer norms and the feed-forward's addmm and _addmm_activation
// are LibTorch's Meta kernels).
at::Tensor transformer_encoder_layer(const at::Tensor& src, int64_t embed_dim, int64_t num_heads,
                                     const at::Tensor& qkv_weight, const at::Tensor& qkv_bias,
                                     const at::Tensor& proj_weight, const at::Tensor& proj_bias, bool use_gelu,
                                     bool norm_first, double eps, const at::Tensor& norm_weight_1,
                                     const at::Tensor& norm_bias_1, const at::Tensor& norm_weight_2,
                                     const at::Tensor& norm_bias_2, const at::Tensor& ffn_weight_1,
                                     const at::Tensor& ffn_bias_1, const at::Tensor& ffn_weight_2,
                                     const at::Tensor& ffn_bias_2, const std::optional<at::Tensor>& mask,
                                     std::optional<int64_t> mask_type) {
  return at::native::transformer_encoder_layer_forward(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                                                       proj_bias, use_gelu, norm_first, eps, norm_weight_1,
                                                       norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1,
                                                       ffn_bias_1, ffn_weight_2, ffn_bias_2, mask, mask_type);
}

}  // namespace memgate::meta_kernels
