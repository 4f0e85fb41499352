// Status words and the JSON of a verdict.
#include "memgate/base/status.h"

#include "memgate/base/error.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <string>

namespace memgate {

bool fails(Status status, bool strict) {
  switch (status) {
    case Status::kOk: return false;
    case Status::kStale: return strict;
    case Status::kMissing: return missing_fails(strict);
    case Status::kRegression:
    case Status::kChanged:
    case Status::kOom:
    case Status::kOverBudget:
    case Status::kNotRepeatable: return true;
  }
  return true;
}

namespace {

constexpr const char* kTruthy[] = {"1", "true", "yes", "on"};
constexpr const char* kFalsy[] = {"0", "false", "no", "off"};

std::string lowercase(std::string value) {
  std::transform(value.begin(), value.end(), value.begin(), [](unsigned char c) { return std::tolower(c); });
  return value;
}

}  // namespace

std::optional<bool> env_switch(const char* variable) {
  const char* v = std::getenv(variable);
  if (v == nullptr || *v == '\0') return std::nullopt;
  const auto value = lowercase(v);
  for (const char* word : kTruthy) {
    if (value == word) return true;
  }
  for (const char* word : kFalsy) {
    if (value == word) return false;
  }
  throw Error(fmt::format("{}={}: expected 1, true, yes or on to turn it on, or 0, false, no or off to turn it off "
                          "(any case; unset or empty: the default)",
                          variable, v));
}

void check_env_switches() {
  for (const char* variable : {"MEMGATE_STRICT", "MEMGATE_UPDATE_BASELINES"}) (void)env_switch(variable);
}

bool strict_mode() { return env_switch("MEMGATE_STRICT").value_or(false); }

bool ci_environment() {
  const char* v = std::getenv("CI");
  if (v == nullptr) return false;
  const auto value = lowercase(v);
  return std::any_of(std::begin(kTruthy), std::end(kTruthy), [&](const char* word) { return value == word; });
}

bool missing_fails(bool strict) {
  if (strict) return true;
  if (const auto set = env_switch("MEMGATE_STRICT")) return *set;
  return ci_environment();
}

bool update_mode() { return env_switch("MEMGATE_UPDATE_BASELINES").value_or(false); }

void to_json(nlohmann::json& j, const ComponentVerdict& v) {
  j = {{"status", name_of(kStatusNames, v.status)},
       {"fixture", v.fixture},
       {"batch_size", v.batch_size},
       {"component", v.component},
       {"message", v.message}};
  if (v.baseline) j["baseline"] = *v.baseline;
  if (v.measured) j["measured"] = *v.measured;
  if (v.allowed) j["allowed"] = *v.allowed;
  if (!v.modules.empty()) {
    auto& modules = j["modules"] = nlohmann::json::array();
    for (const auto& m : v.modules) {
      modules.push_back({{"module", m.module}, {"baseline", m.baseline}, {"measured", m.measured}});
    }
  }
}

namespace {

const nlohmann::json& field(const nlohmann::json& j, const char* key, bool (nlohmann::json::*is)() const noexcept,
                            const char* expected) {
  if (!j.is_object() || !j.contains(key) || !(j[key].*is)()) {
    throw Error(fmt::format("`{}`: expected {}", key, expected));
  }
  return j[key];
}

std::optional<std::int64_t> optional_bytes(const nlohmann::json& j, const char* key) {
  if (!j.contains(key)) return std::nullopt;
  if (!j[key].is_number_integer()) throw Error(fmt::format("`{}`: expected an integer (bytes)", key));
  return j[key].get<std::int64_t>();
}

}  // namespace

void from_json(const nlohmann::json& j, ComponentVerdict& v) {
  const auto word = field(j, "status", &nlohmann::json::is_string, "a string").get<std::string>();
  const auto status = parse_enum(kStatusNames, word);
  if (!status) {
    std::string known;
    for (const auto& w : enum_words(kStatusNames)) known += (known.empty() ? "" : ", ") + w;
    throw Error(fmt::format("`status`: expected one of {}, got '{}'", known, word));
  }
  v.status = *status;
  v.fixture = field(j, "fixture", &nlohmann::json::is_string, "a string").get<std::string>();
  v.batch_size = field(j, "batch_size", &nlohmann::json::is_number_integer, "an integer").get<std::int64_t>();
  v.component = field(j, "component", &nlohmann::json::is_string, "a string").get<std::string>();
  v.message = field(j, "message", &nlohmann::json::is_string, "a string").get<std::string>();
  v.baseline = optional_bytes(j, "baseline");
  v.measured = optional_bytes(j, "measured");
  v.allowed = optional_bytes(j, "allowed");
  v.modules.clear();
  if (j.contains("modules")) {
    const auto& modules = field(j, "modules", &nlohmann::json::is_array, "a list of {module, baseline, measured}");
    for (const auto& m : modules) {
      ModuleChange change;
      change.module = field(m, "module", &nlohmann::json::is_string, "a string (a module's name)").get<std::string>();
      change.baseline = field(m, "baseline", &nlohmann::json::is_number_integer, "an integer (bytes)").get<std::int64_t>();
      change.measured = field(m, "measured", &nlohmann::json::is_number_integer, "an integer (bytes)").get<std::int64_t>();
      v.modules.push_back(std::move(change));
    }
  }
}

}  // namespace memgate
