// Components read and written through the component table.
#include "memgate/base/components.h"

#include "memgate/base/error.h"

#include <string>

namespace memgate {
namespace {

const ComponentInfo& component_or_throw(std::string_view name) {
  if (const auto* c = find_component(name)) return *c;
  std::string known;
  for (const auto& c : kComponentTable) known += (known.empty() ? "" : ", ") + std::string(c.name);
  throw Error("unknown component '" + std::string(name) + "': expected one of " + known);
}

}  // namespace

std::int64_t Components::get(std::string_view name) const { return this->*component_or_throw(name).member; }

void Components::set(std::string_view name, std::int64_t bytes) { this->*component_or_throw(name).member = bytes; }

}  // namespace memgate
