// Components read and written through the component table, and a distributed probe's per-rank components.
#include "memgate/base/components.h"

#include "memgate/base/error.h"

#include <algorithm>
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

void Components::set(std::string_view name, std::int64_t bytes) {
  const auto& info = component_or_throw(name);
  this->*info.member = bytes;
  if (info.present != nullptr) this->*info.present = true;
}

bool operator==(const Components& a, const Components& b) {
  for (const auto& info : kComponentTable) {
    const bool in_a = has_component(a, info), in_b = has_component(b, info);
    if (in_a != in_b || (in_a && a.*info.member != b.*info.member)) return false;
  }
  return true;
}

const RankComponents* find_rank(const std::vector<RankComponents>& ranks, int rank) {
  const auto it = std::find_if(ranks.begin(), ranks.end(), [rank](const RankComponents& r) { return r.rank == rank; });
  return it == ranks.end() ? nullptr : &*it;
}

Components max_over_ranks(const std::vector<RankComponents>& ranks) {
  Components out;
  for (const auto& info : kComponentTable) {
    std::int64_t most = 0;
    for (const auto& r : ranks) most = std::max(most, r.components.*info.member);
    out.*info.member = most;
    // An optional component (`ema`, `host_activations`, `host_state`) is there where any rank has it.
    if (info.present != nullptr) {
      out.*info.present = std::any_of(ranks.begin(), ranks.end(),
                                      [&](const RankComponents& r) { return r.components.*info.present; });
    }
  }
  return out;
}

std::string rank_component_name(int rank, std::string_view component) {
  return "rank" + std::to_string(rank) + "_" + std::string(component);
}

std::optional<std::pair<int, std::string>> parse_rank_component(std::string_view name) {
  if (!name.starts_with("rank")) return std::nullopt;
  const auto underscore = name.find('_');
  if (underscore == std::string_view::npos || underscore == 4) return std::nullopt;
  int rank = 0;
  for (const char c : name.substr(4, underscore - 4)) {
    if (c < '0' || c > '9' || rank > 100000) return std::nullopt;
    rank = rank * 10 + (c - '0');
  }
  const auto component = name.substr(underscore + 1);
  if (find_component(component) == nullptr) return std::nullopt;
  return std::pair<int, std::string>{rank, std::string(component)};
}

}  // namespace memgate
