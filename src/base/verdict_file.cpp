// The measuring tests' verdict files.
#include "memgate/base/verdict_file.h"

#include "memgate/base/error.h"
#include "memgate/base/files.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

namespace memgate {
namespace {

constexpr const char* kFormat = "memgate-verdicts";
constexpr int kVersion = 1;

const ComponentVerdict* find_in(const std::vector<ComponentVerdict>& all, std::int64_t batch_size,
                                std::string_view name) {
  for (const auto& v : all) {
    if (v.batch_size == batch_size && v.component == name) return &v;
  }
  return nullptr;
}

std::vector<ComponentVerdict> read_list(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_array()) throw Error(fmt::format("`{}`: expected a list", key));
  std::vector<ComponentVerdict> out;
  for (std::size_t i = 0; i < j[key].size(); ++i) {
    try {
      out.push_back(j[key][i].get<ComponentVerdict>());
    } catch (const Error& e) {
      throw Error(fmt::format("`{}[{}]`: {}", key, i, e.what()));
    }
  }
  return out;
}

std::string read_string(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_string()) throw Error(fmt::format("`{}`: expected a string", key));
  return j[key].get<std::string>();
}

}  // namespace

const ComponentVerdict* VerdictFile::find(std::int64_t batch_size, std::string_view component) const {
  return find_in(components, batch_size, component);
}

const ComponentVerdict* VerdictFile::find_budget(std::int64_t batch_size, std::string_view gpu) const {
  return find_in(budgets, batch_size, gpu);
}

void write_verdict_file(const std::string& path, const VerdictFile& file) {
  nlohmann::json j = {{"format", kFormat},        {"version", kVersion},          {"suite", file.suite},
                      {"fixture", file.fixture},  {"device", file.device},        {"components", file.components},
                      {"budgets", file.budgets}};
  if (file.skipped) j["skipped"] = *file.skipped;
  if (file.error) j["error"] = *file.error;
  write_file_atomically(path, j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

VerdictFile read_verdict_file(const std::string& path) {
  std::string text;
  try {
    text = read_text_file(path, "a verdict file");
  } catch (const Error& e) {
    throw Error(fmt::format("{} (its measuring test did not write it)", e.what()));
  }
  try {
    const auto j = nlohmann::json::parse(text);
    if (!j.is_object() || !j.contains("format") || j["format"] != kFormat) {
      throw Error(fmt::format("`format`: expected \"{}\"", kFormat));
    }
    if (!j.contains("version") || j["version"] != kVersion) throw Error(fmt::format("`version`: expected {}", kVersion));
    VerdictFile f;
    f.suite = read_string(j, "suite");
    f.fixture = read_string(j, "fixture");
    f.device = read_string(j, "device");
    if (j.contains("skipped")) f.skipped = read_string(j, "skipped");
    if (j.contains("error")) f.error = read_string(j, "error");
    f.components = read_list(j, "components");
    f.budgets = read_list(j, "budgets");
    return f;
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not a verdict file: {}", path, e.what()));
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", path, e.what()));
  }
}

}  // namespace memgate
