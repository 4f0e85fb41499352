// The autocast scope and the dtype of a precision.
#include "memgate/models/autocast.h"

#include <ATen/autocast_mode.h>

namespace memgate {

torch::Dtype dtype_of(Precision precision) {
  switch (precision) {
    case Precision::kFp16: return torch::kHalf;
    case Precision::kBf16: return torch::kBFloat16;
    case Precision::kFp32: break;
  }
  return torch::kFloat32;
}

AutocastScope::AutocastScope(torch::DeviceType device_type, Precision precision) : device_type_(device_type) {
  if (precision == Precision::kFp32) return;
  active_ = true;
  previous_enabled_ = at::autocast::is_autocast_enabled(device_type_);
  previous_dtype_ = at::autocast::get_autocast_dtype(device_type_);
  at::autocast::set_autocast_enabled(device_type_, true);
  at::autocast::set_autocast_dtype(device_type_, dtype_of(precision));
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  // Leaving the outermost scope drops autocast's cache of casted weights, as torch.autocast does.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
}

}  // namespace memgate
