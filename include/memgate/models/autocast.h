// Mixed precision as torch.autocast runs it: the precision of a training setup, its dtype, and a scope.
#pragma once

#include "memgate/base/enum_names.h"

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/types.h>

#include <optional>

namespace memgate {

/// The dtype autocast computes in (fp32: no autocast), or the dtype frozen weights are kept in.
enum class Precision { kFp32, kFp16, kBf16 };

/// The words of Precision.
inline constexpr EnumNames<Precision, 3> kPrecisionNames{
    {{Precision::kFp32, "fp32"}, {Precision::kFp16, "fp16"}, {Precision::kBf16, "bf16"}}};

/// The torch dtype of a precision.
[[nodiscard]] torch::Dtype dtype_of(Precision precision);

/// Autocast on `device_type` in `precision` for its lifetime (no-op for fp32); restores the previous state.
/// Meta tensors carry no autocast key: on the Meta device the scope includes AutocastPrivateUse1 in the thread's
/// dispatch keys and enables it, where an estimate registers kernels that cast Meta tensors by its target's policy
/// (memgate::register_meta_autocast; the target is the thread's EstimateContext); without them, ops on Meta run
/// uncast.
class AutocastScope {
 public:
  AutocastScope(torch::DeviceType device_type, Precision precision);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  torch::DeviceType device_type_;
  std::optional<c10::impl::IncludeDispatchKeyGuard> include_meta_;
  bool active_ = false;
  bool previous_enabled_ = false;
  torch::ScalarType previous_dtype_ = torch::kFloat32;
};

/// The function that drops the Meta autocast's cache of casted weights, called when the outermost scope ends (as
/// at::autocast::clear_cache is); set by the Meta autocast when it registers.
void set_meta_autocast_cache_clear(void (*clear)());

}  // namespace memgate
