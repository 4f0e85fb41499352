// Strict reading of YAML maps: every key is checked, every error names the file, the key, the line and what
// was expected. Each value read (defaults included) is also recorded as canonical JSON.
#pragma once

#include "memgate/base/enum_names.h"
#include "memgate/base/error.h"

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace memgate::detail {

/// What memgate reads of a YAML file (a fixture, a suite, a GPU file), at most: its size in bytes, its values (maps,
/// lists, keys, scalars; an alias counts as all that its anchor holds) and how deep maps and lists nest (an alias as
/// deep as its anchor). A file past one is an error before it is built or walked, in time and memory a small multiple
/// of the file's size.
inline constexpr std::uintmax_t kMaxYamlBytes = 1 << 20;
inline constexpr std::int64_t kMaxYamlNodes = 100'000;
inline constexpr int kMaxYamlDepth = 64;

/// Loads a YAML file; a missing file, a syntax error or a file past the bounds above becomes memgate::Error with the
/// file, the line and what was expected.
YAML::Node load_yaml_file(const std::string& path);

/// Reads one YAML map. Reading a key marks it known; `finish()` rejects the keys nobody read.
class MapReader {
 public:
  /// `path` is the dotted key of this map in the file ("" for the top level); `out` receives what is read.
  MapReader(YAML::Node node, std::string file, std::string path, nlohmann::json* out = nullptr);

  [[nodiscard]] bool has(const std::string& key) const;
  /// Whether an optional key is set (present and not null), marking it known either way: listed among the keys the
  /// map takes when another is unknown, and a null accepted as not set, as if the key were absent (nothing recorded
  /// in the canonical JSON, so a fixture keeps its hash). A set key is then read with a getter.
  [[nodiscard]] bool optional(const std::string& key);
  [[nodiscard]] std::int64_t get_int(const std::string& key, std::optional<std::int64_t> fallback,
                                     std::int64_t min, std::int64_t max = INT64_MAX);
  [[nodiscard]] double get_double(const std::string& key, std::optional<double> fallback, double min, double max);
  [[nodiscard]] bool get_bool(const std::string& key, std::optional<bool> fallback);
  [[nodiscard]] std::string get_string(const std::string& key, std::optional<std::string> fallback,
                                       const std::vector<std::string>& allowed = {});
  [[nodiscard]] std::vector<std::int64_t> get_int_list(const std::string& key,
                                                       std::optional<std::vector<std::int64_t>> fallback,
                                                       std::int64_t min, std::int64_t max = INT64_MAX);
  [[nodiscard]] std::vector<std::string> get_string_list(const std::string& key,
                                                         std::optional<std::vector<std::string>> fallback,
                                                         const std::vector<std::string>& allowed = {});
  /// A word of `names` (the error lists them all); recorded as the word, so hashes follow the spelling.
  template <typename E, std::size_t N>
  [[nodiscard]] E get_enum(const std::string& key, std::optional<E> fallback, const EnumNames<E, N>& names) {
    std::optional<std::string> word;
    if (fallback) word = std::string(name_of(names, *fallback));
    return *parse_enum(names, get_string(key, word, enum_words(names)));
  }
  /// The map under `key`, to read with its own MapReader; an absent key gives an empty map.
  [[nodiscard]] MapReader child(const std::string& key, bool required = false);
  /// The sequence under `key` (each element a YAML node); throws unless it is a sequence.
  [[nodiscard]] std::vector<YAML::Node> get_sequence(const std::string& key, bool required);

  /// Leaves `key` (read already) out of the canonical JSON: for an option added after fixtures were hashed, at the
  /// value that reproduces the old behaviour, so that those fixtures keep their hash (and their baselines).
  void leave_out_of_hash(const std::string& key);

  /// Marks `key` read and records `value` for it in the canonical JSON: for what the reader's getters do not
  /// read themselves (a list of maps, a value derived from a file).
  void record_value(const std::string& key, nlohmann::json value) { record(key, std::move(value)); }

  /// Throws memgate::Error naming the first key that was not read (unknown keys are errors).
  void finish() const;

  /// Raises an error about `key` of this map: "<file>:<line>: <path.key>: expected <what>, got <got>".
  [[noreturn]] void fail(const std::string& key, const std::string& expected, const std::string& got = {}) const;
  [[nodiscard]] const std::string& file() const { return file_; }
  [[nodiscard]] std::string key_path(const std::string& key) const;
  [[nodiscard]] int line_of(const std::string& key) const;
  [[nodiscard]] const YAML::Node& node() const { return node_; }

 private:
  [[nodiscard]] YAML::Node value(const std::string& key) const;
  void record(const std::string& key, nlohmann::json value);

  YAML::Node node_;
  std::string file_;
  std::string path_;
  nlohmann::json* out_;
  std::set<std::string> read_;
};

/// Describes a YAML node for an error message: its scalar, or "a map" / "a list".
[[nodiscard]] std::string describe(const YAML::Node& node);

/// The name of `known` that `key` misspells: one edit or two away (Levenshtein), or one of them the other's start
/// ("ema_decay" for "ema", whose decay is a key under it); empty when none is, or two are equally near. The keys a
/// map does not know, and the aten op names a fixture's selective checkpointing saves.
[[nodiscard]] std::string nearest_key(const std::string& key, const std::set<std::string>& known);

}  // namespace memgate::detail
