// Which module's forward allocated what: a probe's per-module breakdown (base/module_breakdown.h), read off the
// counting CPU allocator while a probe runs. A Python fixture's forward hooks name the module that runs
// (enter_module / exit_module, from memgate._modules); what no module's forward allocated is named by the probe's
// phase.
#pragma once

#include "memgate/base/module_breakdown.h"

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace memgate {

/// The module whose forward runs from now on, by its dotted name, inside the one that ran before (forward hooks
/// call these in pairs, the innermost last). Process-wide; cheap; allocates no tensor.
void enter_module(std::string_view name);
void exit_module();

/// Attributes each allocation of the device's allocator, while it lives, to the innermost module entered when it
/// was made (else to the phase set last, in parentheses), and keeps per module the bytes alive now and at the
/// highest total since a peak was reset. On the CPU only (the counting allocator); elsewhere it is inactive and
/// every breakdown is empty.
///
///   ModuleAttribution attribution(device);
///   const auto before = attribution.mark();
///   attribution.reset_peak(ModuleAttribution::kPart);
///   ... forward ...
///   ModuleBytes activations = attribution.since(before);  // sums to the allocator's growth since `before`
class ModuleAttribution {
 public:
  /// The peaks kept: one reset per part of the step (an eval forward, a forward), one over the measured step.
  enum Peak { kPart = 0, kStep = 1 };
  /// Per-name bytes alive at some moment: what since() and peak_since() subtract.
  using Mark = std::vector<std::int64_t>;

  explicit ModuleAttribution(c10::Device device);
  ~ModuleAttribution();
  ModuleAttribution(const ModuleAttribution&) = delete;
  ModuleAttribution& operator=(const ModuleAttribution&) = delete;

  /// Names what runs from now on when no module does ("measured step: backward").
  void set_phase(std::string_view phase);
  [[nodiscard]] Mark mark() const;
  /// The peak `which` starts again from what is alive now, as the allocator's reset_peak does.
  void reset_peak(Peak which);
  /// Per module, what is alive now less what was at `from`: sums to the allocator's current bytes less its bytes
  /// at `from`. No entry of 0.
  [[nodiscard]] ModuleBytes since(const Mark& from) const;
  /// The same at the highest total since reset_peak(which): sums to that peak less the bytes at `from`.
  [[nodiscard]] ModuleBytes peak_since(Peak which, const Mark& from) const;
  /// Whether a module's forward made an allocation while it observed: a model whose modules memgate can name.
  [[nodiscard]] bool saw_modules() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace memgate
