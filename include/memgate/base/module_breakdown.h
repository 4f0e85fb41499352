// Which module holds a component's bytes: a probe's per-module breakdown, kept in its baseline, so that a failing
// component names the modules whose bytes changed ("activations +64.0 KiB: +65,536 B in blocks.0.attn.q_proj").
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace memgate {

/// Bytes by module, by the module's dotted name in the model (`named_modules()`); "(root)" for the model's own
/// forward, and a name in parentheses for what no module's forward allocated: the probe's phase
/// ("(measured step: backward)", "(building the model)"). No entry of 0 bytes.
using ModuleBytes = std::map<std::string, std::int64_t, std::less<>>;

/// The components with a per-module breakdown (activations, forward_peak, eval_peak, step_peak), each splitting
/// exactly its bytes: what is alive where the component is read, by the innermost module whose forward allocated
/// it. Empty where the model has no modules memgate can see (the zoo's C++ models, TorchScript) and off the CPU.
struct ModuleBreakdown {
  std::map<std::string, ModuleBytes, std::less<>> components;

  [[nodiscard]] bool empty() const { return components.empty(); }
  /// The component's breakdown, or nullptr where there is none.
  [[nodiscard]] const ModuleBytes* find(std::string_view component) const;
  bool operator==(const ModuleBreakdown&) const = default;
};

/// The components a breakdown is kept for, in the component table's order.
inline constexpr std::string_view kBrokenDownComponents[] = {"activations", "forward_peak", "eval_peak", "step_peak"};

/// {"<component>": {"<module>": bytes, ...}, ...}, keys sorted.
[[nodiscard]] nlohmann::json module_breakdown_to_json(const ModuleBreakdown& breakdown);
/// Reads what module_breakdown_to_json wrote; `where` names the file and key for errors (memgate::Error naming the
/// key and what was expected).
[[nodiscard]] ModuleBreakdown module_breakdown_from_json(const nlohmann::json& j, const std::string& where);

/// One module's bytes of a component, then and now.
struct ModuleChange {
  std::string module;
  std::int64_t baseline = 0;
  std::int64_t measured = 0;
  [[nodiscard]] std::int64_t difference() const { return measured - baseline; }
};

/// The modules whose bytes differ between two breakdowns of a component, the largest change first (then by name).
[[nodiscard]] std::vector<ModuleChange> module_changes(const ModuleBytes& baseline, const ModuleBytes& measured);

/// "+65,536 B in blocks.0.attn.q_proj; -512 B in head" for the first `most` changes, "and N more modules" after
/// them; empty for none.
[[nodiscard]] std::string describe_module_changes(std::span<const ModuleChange> changes, std::size_t most = 3);

/// Bytes with thousands separators: "65,536", "-1,024".
[[nodiscard]] std::string format_byte_count(std::int64_t bytes);

}  // namespace memgate
