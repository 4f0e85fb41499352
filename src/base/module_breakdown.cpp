// A probe's per-module breakdown: JSON, and the modules that changed against a baseline's.
#include "memgate/base/module_breakdown.h"

#include "memgate/base/error.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>

namespace memgate {

const ModuleBytes* ModuleBreakdown::find(std::string_view component) const {
  const auto it = components.find(component);
  return it == components.end() ? nullptr : &it->second;
}

nlohmann::json module_breakdown_to_json(const ModuleBreakdown& breakdown) {
  auto j = nlohmann::json::object();
  for (const auto& [component, modules] : breakdown.components) {
    auto& entry = j[component] = nlohmann::json::object();
    for (const auto& [module, bytes] : modules) entry[module] = bytes;
  }
  return j;
}

ModuleBreakdown module_breakdown_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) {
    throw Error(fmt::format("{}: expected an object of components, each an object of module: bytes; got {}", where,
                            j.type_name()));
  }
  ModuleBreakdown out;
  for (const auto& [component, modules] : j.items()) {
    if (std::find(std::begin(kBrokenDownComponents), std::end(kBrokenDownComponents), component) ==
        std::end(kBrokenDownComponents)) {
      throw Error(fmt::format("{}.{}: unknown component; a breakdown is kept for activations, forward_peak, "
                              "eval_peak and step_peak",
                              where, component));
    }
    if (!modules.is_object()) {
      throw Error(fmt::format("{}.{}: expected an object of module: bytes; got {}", where, component,
                              modules.type_name()));
    }
    auto& bytes_of = out.components[component];
    for (const auto& [module, bytes] : modules.items()) {
      if (!bytes.is_number_integer()) {
        throw Error(fmt::format("{}.{}.{}: expected a whole number of bytes; got {}", where, component, module,
                                bytes.dump()));
      }
      bytes_of[module] = bytes.get<std::int64_t>();
    }
  }
  return out;
}

std::vector<ModuleChange> module_changes(const ModuleBytes& baseline, const ModuleBytes& measured) {
  std::vector<ModuleChange> out;
  for (const auto& [module, bytes] : baseline) {
    const auto it = measured.find(module);
    const auto now = it == measured.end() ? 0 : it->second;
    if (now != bytes) out.push_back({module, bytes, now});
  }
  for (const auto& [module, bytes] : measured) {
    if (!baseline.contains(module) && bytes != 0) out.push_back({module, 0, bytes});
  }
  std::sort(out.begin(), out.end(), [](const ModuleChange& a, const ModuleChange& b) {
    const auto x = std::llabs(a.difference()), y = std::llabs(b.difference());
    return x != y ? x > y : a.module < b.module;
  });
  return out;
}

std::string format_byte_count(std::int64_t bytes) {
  auto digits = std::to_string(bytes < 0 ? -bytes : bytes);
  for (auto i = static_cast<std::ptrdiff_t>(digits.size()) - 3; i > 0; i -= 3) digits.insert(static_cast<std::size_t>(i), ",");
  return (bytes < 0 ? "-" : "") + digits;
}

std::string describe_module_changes(std::span<const ModuleChange> changes, std::size_t most) {
  std::string out;
  const auto shown = std::min(most, changes.size());
  for (std::size_t i = 0; i < shown; ++i) {
    const auto d = changes[i].difference();
    out += fmt::format("{}{}{} B in {}", i == 0 ? "" : "; ", d > 0 ? "+" : "", format_byte_count(d), changes[i].module);
  }
  if (changes.size() > shown) {
    out += fmt::format("; and {} more module{}", changes.size() - shown, changes.size() - shown == 1 ? "" : "s");
  }
  return out;
}

}  // namespace memgate
