// Loading suites: fixtures x batch sizes, and budgets.
#include "memgate/gate/suite.h"

#include "memgate/base/error.h"
#include "memgate/gate/fixture.h"
#include "memgate/spec/yaml_reader.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <map>

namespace memgate {

std::vector<SuiteFixture> suite_fixtures(const Suite& suite) {
  std::vector<SuiteFixture> out;
  auto of = [&](const std::string& name, const std::string& path) -> SuiteFixture& {
    for (auto& f : out) {
      if (f.name == name) return f;
    }
    out.push_back({name, path, {}, {}});
    return out.back();
  };
  for (const auto& p : suite.probes) of(p.fixture, p.fixture_path).batch_sizes.push_back(p.batch_size);
  for (const auto& b : suite.budgets) of(b.fixture, b.fixture_path).budgets.push_back(b);
  for (const auto& b : suite.broken) of(b.name, b.path).error = b.error;
  return out;
}

std::string suite_models_dir(const std::string& suite_path) {
  return (std::filesystem::path(suite_path).parent_path().parent_path() / "models").lexically_normal().string();
}

Suite load_suite(const std::string& path, const std::string& fixtures_dir) {
  auto root = detail::load_yaml_file(path);
  detail::MapReader r(root, path, "");
  Suite suite;
  suite.path = path;
  suite.name = std::filesystem::path(path).stem().string();
  suite.device = r.get_enum("device", std::optional<SuiteDevice>(), kSuiteDeviceNames);
  (void)r.get_string("description", std::string());
  auto fixture_file = [&](const std::string& name, const detail::MapReader& where, const std::string& key) {
    // A fixture's name names files and tests: letters, digits, '_' and '-' (as load_fixture requires of `name:`).
    const bool valid = !name.empty() && name.size() <= 200 && std::all_of(name.begin(), name.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
    });
    const auto file = fixtures_dir + "/" + name + ".yaml";
    std::error_code ec;
    if (!valid || !std::filesystem::is_regular_file(file, ec)) {
      where.fail(key, "the name of a fixture in " + fixtures_dir, "'" + name.substr(0, 80) + "'");
    }
    return file;
  };
  const auto entries = r.get_sequence("fixtures", true);
  std::map<std::string, std::size_t> listed;  // fixture -> its entry: each fixture once (its tests are named by it)
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto& entry = entries[i];
    const auto key = "fixtures[" + std::to_string(i) + "]";
    std::string name;
    std::vector<std::int64_t> batch_sizes;
    // A fixture that exists but does not load is that fixture's result, not the suite's: the others are judged.
    const auto fixture_batch_sizes = [&](const std::string& file) {
      try {
        return load_fixture(file).batch_sizes;
      } catch (const Error& e) {
        suite.broken.push_back({name, file, e.what()});
        return std::vector<std::int64_t>{};
      }
    };
    if (entry.IsScalar()) {
      name = entry.Scalar();
      batch_sizes = fixture_batch_sizes(fixture_file(name, r, "fixtures"));
    } else {
      detail::MapReader e(entry, path, key);
      name = e.get_string("fixture", std::nullopt);
      const auto file = fixture_file(name, e, "fixture");
      if (e.has("batch_sizes")) {
        batch_sizes = e.get_int_list("batch_sizes", std::nullopt, 1);
        (void)fixture_batch_sizes(file);
      } else {
        batch_sizes = fixture_batch_sizes(file);
      }
      e.finish();
    }
    if (const auto [it, fresh] = listed.emplace(name, i); !fresh) {
      r.fail(key, "each fixture once (list its batch sizes in one entry)",
             "'" + name + "' again (it is fixtures[" + std::to_string(it->second) + "] too)");
    }
    for (auto bs : batch_sizes) suite.probes.push_back({name, fixtures_dir + "/" + name + ".yaml", bs});
  }
  const auto budgets = r.get_sequence("budgets", false);
  for (std::size_t i = 0; i < budgets.size(); ++i) {
    detail::MapReader b(budgets[i], path, "budgets[" + std::to_string(i) + "]");
    BudgetCase budget;
    budget.fixture = b.get_string("fixture", std::nullopt);
    budget.fixture_path = fixture_file(budget.fixture, b, "fixture");
    budget.batch_size = b.get_int("batch_size", std::nullopt, 1);
    budget.gpu = b.get_string("gpu", std::nullopt);
    b.finish();
    suite.budgets.push_back(budget);
  }
  r.finish();
  return suite;
}

}  // namespace memgate
