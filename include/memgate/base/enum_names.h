// Names of enumerations as fixtures, baselines and the command line spell them: parsed once, printed the same.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace memgate {

/// One value of an enumeration and the word that stands for it in files and on the command line.
template <typename E>
struct EnumName {
  E value;
  std::string_view name;
};

/// Every value of an enumeration with its word, in the order error messages list them.
///
///   inline constexpr EnumNames<Optimizer, 2> kOptimizerNames{{{Optimizer::kAdamW, "adamw"}, {Optimizer::kSgd, "sgd"}}};
template <typename E, std::size_t N>
using EnumNames = std::array<EnumName<E>, N>;

/// The word of `value`; an empty view for a value the table lacks.
template <typename E, std::size_t N>
[[nodiscard]] constexpr std::string_view name_of(const EnumNames<E, N>& names, E value) {
  for (const auto& n : names) {
    if (n.value == value) return n.name;
  }
  return {};
}

/// The value whose word is `word`, if any.
template <typename E, std::size_t N>
[[nodiscard]] constexpr std::optional<E> parse_enum(const EnumNames<E, N>& names, std::string_view word) {
  for (const auto& n : names) {
    if (n.name == word) return n.value;
  }
  return std::nullopt;
}

/// Every word of the table, in its order.
template <typename E, std::size_t N>
[[nodiscard]] std::vector<std::string> enum_words(const EnumNames<E, N>& names) {
  std::vector<std::string> out;
  out.reserve(N);
  for (const auto& n : names) out.emplace_back(n.name);
  return out;
}

}  // namespace memgate
