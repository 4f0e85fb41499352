// Autocast for Meta tensors. A Meta tensor carries no autocast dispatch key, so torch's autocast kernels never see
// it, and they would not cast it anyway (they cast tensors of their own device). AutocastScope on the Meta device
// includes AutocastPrivateUse1 in the thread's dispatch keys; this file registers, at that key, one boxed kernel for
// every op the estimate's target autocasts, which casts the op's Meta tensors by the target's policy (the lists
// and rules of ATen/autocast_mode.{h,cpp}) and calls the op with autocast excluded, as torch's kernels do. Casts of
// fp32 leaf weights are cached until the outermost scope ends, as torch caches them.
#include "memgate/estimate/meta_kernels.h"

#include "memgate/estimate/estimate_context.h"
#include "memgate/models/autocast.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/flat_hash_map.h>
#include <torch/library.h>

#include <array>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

namespace memgate {
namespace {

enum class Policy { kLowerPrecision, kFp32, kFp32SetOptDtype, kFp32AppendDtype, kPromote, kBanned };

struct Row {
  const char* op;
  const char* overload;
  Policy policy;
};

// --- the policies of the targets ------------------------------------------------------------------------------
// CUDA's lists come from ATen's own macros, so they are those of the LibTorch memgate builds against.
#define MEMGATE_ROW1(policy, op) Row{#op, "", policy},
#define MEMGATE_ROW2(policy, op, overload) Row{#op, #overload, policy},
#define MEMGATE_PICK(_1, _2, name, ...) name
#define MEMGATE_LOWER(...) MEMGATE_PICK(__VA_ARGS__, MEMGATE_ROW2, MEMGATE_ROW1)(Policy::kLowerPrecision, __VA_ARGS__)
#define MEMGATE_FP32(...) MEMGATE_PICK(__VA_ARGS__, MEMGATE_ROW2, MEMGATE_ROW1)(Policy::kFp32, __VA_ARGS__)
#define MEMGATE_SET_OPT(...) MEMGATE_PICK(__VA_ARGS__, MEMGATE_ROW2, MEMGATE_ROW1)(Policy::kFp32SetOptDtype, __VA_ARGS__)
#define MEMGATE_PROMOTE(...) MEMGATE_PICK(__VA_ARGS__, MEMGATE_ROW2, MEMGATE_ROW1)(Policy::kPromote, __VA_ARGS__)

const std::vector<Row>& cuda_rows() {
  static const std::vector<Row> rows = {
      AT_FORALL_LOWER_PRECISION_FP(MEMGATE_LOWER)  //
      AT_FORALL_FP32(MEMGATE_FP32)                 //
      AT_FORALL_FP32_SET_OPT_DTYPE(MEMGATE_SET_OPT)  //
      AT_FORALL_PROMOTE(MEMGATE_PROMOTE)           //
      Row{"cudnn_convolution", "", Policy::kLowerPrecision},
      Row{"cudnn_convolution_transpose", "", Policy::kLowerPrecision},
      // cudnn/AutocastRNN.cpp: the input, states and weights in fp16 (torch also flattens the weights into one
      // buffer, which this does not).
      Row{"_cudnn_rnn", "", Policy::kLowerPrecision},
      Row{"norm", "Scalar", Policy::kFp32AppendDtype},
      Row{"norm", "ScalarOpt_dim", Policy::kFp32AppendDtype},
      Row{"norm", "names_ScalarOpt_dim", Policy::kFp32AppendDtype},
      Row{"binary_cross_entropy", "", Policy::kBanned},
  };
  return rows;
}

// The CPU's lists live in ATen's autocast_mode.cpp, not in a header: they are written out here, and a test checks
// them against the ops that have a kernel at AutocastCPU in the LibTorch memgate runs on.
const std::vector<Row>& cpu_rows() {
  static const std::vector<Row> rows = [] {
    std::vector<Row> out;
    for (const auto& [op, overload] : std::initializer_list<std::pair<const char*, const char*>>{
             {"conv1d", ""}, {"conv1d", "padding"}, {"conv2d", ""}, {"conv2d", "padding"}, {"conv3d", ""},
             {"conv3d", "padding"}, {"bmm", ""}, {"mm", ""}, {"linalg_vecdot", ""}, {"baddbmm", ""}, {"addmm", ""},
             {"_addmm_activation", ""}, {"addbmm", ""}, {"linear", ""}, {"_convolution", "deprecated"},
             {"matmul", ""}, {"conv_tbc", ""}, {"mkldnn_rnn_layer", ""}, {"conv_transpose1d", ""},
             {"conv_transpose2d", "input"}, {"conv_transpose3d", "input"}, {"prelu", ""},
             {"scaled_dot_product_attention", ""}, {"_native_multi_head_attention", ""}}) {
      out.push_back({op, overload, Policy::kLowerPrecision});
    }
    for (const auto& [op, overload] : std::initializer_list<std::pair<const char*, const char*>>{
             {"avg_pool3d", ""}, {"binary_cross_entropy", ""}, {"grid_sampler", ""}, {"polar", ""}, {"prod", ""},
             {"prod", "dim_int"}, {"prod", "dim_Dimname"}, {"quantile", ""}, {"quantile", "scalar"},
             {"nanquantile", ""}, {"nanquantile", "scalar"}, {"stft", ""}, {"stft", "center"}, {"cdist", ""},
             {"grid_sampler_2d", ""}, {"_grid_sampler_2d_cpu_fallback", ""}, {"grid_sampler_3d", ""}, {"trace", ""},
             {"view_as_complex", ""}, {"cholesky", ""}, {"cholesky_inverse", ""}, {"cholesky_solve", ""},
             {"inverse", ""}, {"lu_solve", ""}, {"orgqr", ""}, {"ormqr", ""}, {"pinverse", ""}, {"max_pool3d", ""},
             {"max_unpool2d", ""}, {"max_unpool3d", ""}, {"adaptive_avg_pool3d", ""}, {"reflection_pad1d", ""},
             {"reflection_pad2d", ""}, {"replication_pad1d", ""}, {"replication_pad2d", ""},
             {"replication_pad3d", ""}, {"mse_loss", ""}, {"cosine_embedding_loss", ""}, {"nll_loss", ""},
             {"nll_loss2d", ""}, {"hinge_embedding_loss", ""}, {"poisson_nll_loss", ""}, {"smooth_l1_loss", ""},
             {"cross_entropy_loss", ""}, {"l1_loss", ""}, {"huber_loss", ""}, {"margin_ranking_loss", ""},
             {"soft_margin_loss", ""}, {"triplet_margin_loss", ""}, {"multi_margin_loss", ""},
             {"ctc_loss", "IntList"}, {"ctc_loss", "Tensor"}, {"kl_div", ""}, {"multilabel_margin_loss", ""},
             {"binary_cross_entropy_with_logits", ""}, {"fft_fft", ""}, {"fft_ifft", ""}, {"fft_fft2", ""},
             {"fft_ifft2", ""}, {"fft_fftn", ""}, {"fft_ifftn", ""}, {"fft_rfft", ""}, {"fft_irfft", ""},
             {"fft_rfft2", ""}, {"fft_irfft2", ""}, {"fft_rfftn", ""}, {"fft_irfftn", ""}, {"fft_hfft", ""},
             {"fft_ihfft", ""}, {"linalg_cond", ""}, {"linalg_cond", "p_str"}, {"linalg_matrix_rank", ""},
             {"linalg_matrix_rank", "tol_tensor"}, {"linalg_matrix_rank", "atol_rtol_tensor"},
             {"linalg_matrix_rank", "atol_rtol_float"}, {"linalg_solve", ""}, {"linalg_cholesky", ""},
             {"linalg_svdvals", ""}, {"linalg_eigvals", ""}, {"linalg_eigvalsh", ""}, {"linalg_inv", ""},
             {"linalg_householder_product", ""}, {"linalg_tensorinv", ""}, {"linalg_tensorsolve", ""},
             {"fake_quantize_per_tensor_affine", ""}, {"geqrf", ""}, {"_lu_with_info", ""}, {"qr", ""}, {"svd", ""},
             {"triangular_solve", ""}, {"fractional_max_pool2d", ""}, {"fractional_max_pool3d", ""},
             {"adaptive_max_pool3d", ""}, {"multilabel_margin_loss_forward", ""}, {"linalg_qr", ""},
             {"linalg_cholesky_ex", ""}, {"linalg_svd", ""}, {"linalg_eig", ""}, {"linalg_eigh", ""},
             {"linalg_lstsq", ""}, {"linalg_inv_ex", ""}}) {
      out.push_back({op, overload, Policy::kFp32});
    }
    for (const auto& [op, overload] : std::initializer_list<std::pair<const char*, const char*>>{
             {"stack", ""}, {"cat", ""}, {"index_copy", ""}, {"index_copy", "dimname"}}) {
      out.push_back({op, overload, Policy::kPromote});
    }
    return out;
  }();
  return rows;
}

std::string key_of(const std::string& op, const std::string& overload) { return overload.empty() ? op : op + "." + overload; }

using PolicyMap = std::unordered_map<std::string, Policy>;

PolicyMap map_of(const std::vector<Row>& rows) {
  PolicyMap out;
  for (const auto& r : rows) out.emplace(key_of(r.op, r.overload), r.policy);
  return out;
}

// The policy of what this thread's estimate is for.
const PolicyMap& policies() {
  static const PolicyMap cpu = map_of(cpu_rows());
  static const PolicyMap cuda = map_of(cuda_rows());
  return estimate_context().target == EstimateTarget::kCpu ? cpu : cuda;
}

// --- casting, as at::autocast::cached_cast does for a device's tensors -----------------------------------------
bool eligible(const at::Tensor& t) {
  return t.defined() && t.is_meta() && t.is_floating_point() && t.scalar_type() != at::kDouble;
}

at::ScalarType lower_precision() { return at::autocast::get_autocast_dtype(at::kPrivateUse1); }

using Cache = ska::flat_hash_map<at::TensorImpl*, std::tuple<c10::weak_intrusive_ptr<at::TensorImpl, at::UndefinedTensorImpl>, at::Tensor>>;
thread_local Cache t_cache;

void clear_cache() { t_cache.clear(); }

at::Tensor cached_cast(at::ScalarType to, const at::Tensor& t) {
  if (!eligible(t) || t.scalar_type() == to) return t;
  // torch caches the lower-precision casts of fp32 leaf weights, for the whole autocast region.
  const bool cache = to == lower_precision() && t.scalar_type() == at::kFloat && t.requires_grad() && t.is_leaf() &&
                     !t.is_view() && at::autocast::is_autocast_cache_enabled();
  if (!cache) return t.to(to);
  if (const auto it = t_cache.find(t.unsafeGetTensorImpl()); it != t_cache.end()) return std::get<1>(it->second);
  auto cast = t.to(to);
  t_cache.emplace(t.unsafeGetTensorImpl(), std::make_tuple(c10::weak_intrusive_ptr<at::TensorImpl, at::UndefinedTensorImpl>(t.getIntrusivePtr()), cast));
  return cast;
}

c10::IValue cast_value(at::ScalarType to, const c10::IValue& v) {
  if (v.isTensor()) return cached_cast(to, v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(cached_cast(to, t));
    return out;
  }
  return v;
}

// promote: fp32 if any eligible tensor is, else the lower precision (at::autocast::prioritize).
at::ScalarType promote_type(c10::ArrayRef<c10::IValue> args) {
  auto current = lower_precision();
  auto visit = [&](const at::Tensor& t) {
    if (!eligible(t)) return;
    const auto next = t.scalar_type();
    if (current == at::kFloat || next == at::kFloat) {
      current = at::kFloat;
    } else {
      TORCH_CHECK(next == current, "Unexpected floating ScalarType in at::autocast::prioritize");
    }
  };
  for (const auto& v : args) {
    if (v.isTensor()) visit(v.toTensor());
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) visit(t);
    }
  }
  return current;
}

void autocast_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto it = policies().find(key_of(schema.name().substr(schema.name().find("::") + 2), schema.overload_name()));
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastPrivateUse1);
  if (it == policies().end()) {  // the target does not autocast this op
    op.callBoxed(stack);
    return;
  }
  const auto n = schema.arguments().size();
  auto args = torch::jit::last(*stack, n);
  const bool first_eligible = n > 0 && args[0].isTensor() && eligible(args[0].toTensor());
  switch (it->second) {
    case Policy::kLowerPrecision:
    case Policy::kFp32:
    case Policy::kPromote: {
      const auto to = it->second == Policy::kLowerPrecision ? lower_precision()
                      : it->second == Policy::kFp32         ? at::kFloat
                                                            : promote_type(args);
      // Last argument first: torch's autocast wrappers cast `cached_cast(args)...` as one call's arguments, which the
      // GCC that builds torch evaluates right to left (a linear's bias, then its weight, then its input). The order
      // decides which cast is made first and so which ToCopyBackward the engine runs first in backward.
      for (std::size_t i = stack->size(); i-- > stack->size() - n;) (*stack)[i] = cast_value(to, (*stack)[i]);
      break;
    }
    case Policy::kFp32SetOptDtype:
      // An explicit dtype is respected; an absent one becomes fp32 when the first argument is eligible.
      if (first_eligible) {
        for (std::size_t i = 0; i < n; ++i) {
          const auto& type = schema.arguments()[i].type();
          auto& v = (*stack)[stack->size() - n + i];
          if (v.isNone() && type->kind() == c10::TypeKind::OptionalType &&
              type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::ScalarTypeType) {
            v = static_cast<int64_t>(at::kFloat);
          }
        }
      }
      break;
    case Policy::kFp32AppendDtype: {
      // norm: redispatched to its overload with a dtype, fp32 when the input is eligible (else the input's).
      const auto dtype = first_eligible ? at::kFloat : args[0].toTensor().scalar_type();
      const auto target = schema.overload_name() == "Scalar" ? "ScalarOpt_dtype" : schema.overload_name() + "_dtype";
      const auto handle = c10::Dispatcher::singleton().findSchemaOrThrow("aten::norm", target.c_str());
      stack->emplace_back(static_cast<int64_t>(dtype));
      handle.callBoxed(stack);
      return;
    }
    case Policy::kBanned:
      TORCH_CHECK(false, "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast: "
                         "use binary_cross_entropy_with_logits");
  }
  op.callBoxed(stack);
}

}  // namespace

std::vector<std::string> meta_autocast_ops(EstimateTarget target) {
  std::vector<std::string> out;
  for (const auto& r : target == EstimateTarget::kCpu ? cpu_rows() : cuda_rows()) out.push_back(key_of(r.op, r.overload));
  return out;
}

void register_meta_autocast() {
  static std::once_flag once;
  std::call_once(once, [] {
    set_meta_autocast_cache_clear(&clear_cache);
    // LibTorch registers nothing at AutocastPrivateUse1 (a backend extension would): every other op falls through.
    static torch::Library fallback(torch::Library::IMPL, "_", c10::DispatchKey::AutocastPrivateUse1, __FILE__, __LINE__);
    fallback.fallback(torch::CppFunction::makeFallthrough());
    static torch::Library lib(torch::Library::IMPL, "aten", c10::DispatchKey::AutocastPrivateUse1, __FILE__, __LINE__);
    std::unordered_set<std::string> seen;
    for (const auto* rows : {&cpu_rows(), &cuda_rows()}) {
      for (const auto& r : *rows) {
        const auto name = key_of(r.op, r.overload);
        if (seen.insert(name).second && c10::Dispatcher::singleton().findOp({std::string("aten::") + r.op, r.overload})) {
          lib.impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&autocast_kernel>());
        }
      }
    }
  });
}

}  // namespace memgate
