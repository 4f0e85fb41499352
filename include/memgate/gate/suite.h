// Suites (fixtures/suites/*.yaml): which fixtures and batch sizes a gate runs on a device, and its budgets.
// One list of probes drives both the GoogleTest memory suites and the benchmarks.
#pragma once

#include "memgate/base/enum_names.h"
#include "memgate/spec/gpus.h"

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace memgate {

/// One probe of a suite: a fixture at a batch size.
struct ProbeCase {
  std::string fixture;       ///< the fixture's name (`vit_tiny_lora`)
  std::string fixture_path;  ///< its YAML file
  std::int64_t batch_size = 0;
  /// `vit_tiny_lora_bs8`: the parameter name of its tests and the key of its benchmark.
  [[nodiscard]] std::string name() const { return fixture + "_bs" + std::to_string(batch_size); }
};

/// A budget: this fixture at this batch size must fit this GPU (fixtures/gpus/<gpu>.yaml).
struct BudgetCase {
  std::string fixture;
  std::string fixture_path;
  std::int64_t batch_size = 0;
  std::string gpu;  ///< the GPU fixture's id (file stem)
  [[nodiscard]] std::string name() const {
    return fixture + "_bs" + std::to_string(batch_size) + "_on_" + gpu;
  }
};

/// Cases print as their names in GoogleTest's messages.
inline void PrintTo(const ProbeCase& c, std::ostream* os) { *os << c.name(); }
inline void PrintTo(const BudgetCase& c, std::ostream* os) { *os << c.name(); }

/// The kind of device a suite runs on.
enum class SuiteDevice { kCpu, kCuda };

/// The words of SuiteDevice, as suite files spell them.
inline constexpr EnumNames<SuiteDevice, 2> kSuiteDeviceNames{{{SuiteDevice::kCpu, "cpu"}, {SuiteDevice::kCuda, "cuda"}}};

/// A suite file.
struct Suite {
  std::string name;    ///< the file's stem: cpu, gpu
  std::string path;
  SuiteDevice device = SuiteDevice::kCpu;  ///< cpu | cuda
  std::vector<ProbeCase> probes;
  std::vector<BudgetCase> budgets;
  /// Fixtures the suite lists that do not load (a malformed file, an unknown key): each keeps its error, so that a
  /// gate reports it as that fixture's result and still judges every other fixture.
  struct Broken {
    std::string name;
    std::string path;
    std::string error;
  };
  std::vector<Broken> broken;
};

/// One fixture of a suite: the batch sizes it is gated at and the budgets it is held to.
struct SuiteFixture {
  std::string name;
  std::string path;
  std::vector<std::int64_t> batch_sizes;  ///< empty for a fixture that only has budgets
  std::vector<BudgetCase> budgets;
  std::string error;  ///< why the fixture does not load (Suite::broken); empty for one that does
};

/// The suite's fixtures, each once, in the order they are listed (then budget-only ones), a fixture that does not
/// load among them with its error.
[[nodiscard]] std::vector<SuiteFixture> suite_fixtures(const Suite& suite);

/// Loads a suite; fixtures are looked up as `<fixtures_dir>/<name>.yaml` and their batch sizes default to the
/// fixture's own. Throws memgate::Error (file, key, line) for bad input or a fixture that does not exist; a fixture
/// file that exists but does not load is kept in Suite::broken with its error (its batch sizes unknown, unless the
/// suite lists them).
[[nodiscard]] Suite load_suite(const std::string& path, const std::string& fixtures_dir);

/// The model fixtures of a suite file: <its folder>/../models (fixtures/suites/cpu.yaml -> fixtures/models).
[[nodiscard]] std::string suite_models_dir(const std::string& suite_path);

}  // namespace memgate
