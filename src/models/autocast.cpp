// The autocast scope and the dtype of a precision.
#include "memgate/models/autocast.h"

#include <ATen/autocast_mode.h>

#include <atomic>

namespace memgate {

torch::Dtype dtype_of(Precision precision) {
  switch (precision) {
    case Precision::kFp16: return torch::kHalf;
    case Precision::kBf16: return torch::kBFloat16;
    case Precision::kFp32: break;
  }
  return torch::kFloat32;
}

namespace {
std::atomic<void (*)()> g_meta_cache_clear{nullptr};
}  // namespace

void set_meta_autocast_cache_clear(void (*clear)()) { g_meta_cache_clear.store(clear); }

AutocastScope::AutocastScope(torch::DeviceType device_type, Precision precision)
    : device_type_(device_type == torch::kMeta ? torch::kPrivateUse1 : device_type) {
  if (precision == Precision::kFp32) return;
  if (device_type == torch::kMeta) include_meta_.emplace(c10::DispatchKey::AutocastPrivateUse1);
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
  if (at::autocast::decrement_nesting() == 0) {
    at::autocast::clear_cache();
    if (const auto clear = g_meta_cache_clear.load()) clear();
  }
  at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
}

}  // namespace memgate
