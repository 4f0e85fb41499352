// What the gate relies on, checked rather than assumed (issue 56): a step whose memory grows from step to step is an
// error that says by how many bytes per step; a probe that leaves tensors alive after it ended is an error, never a
// number in the next probe's components; a model whose bytes differ from run to run is refused when recorded and
// judged "not repeatable" when checked, never "regression" or "stale". Python fixtures through the memgate command.
#include "memgate/base/files.h"
#include "cli_fork.h"
#include "test_util.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

namespace memgate {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::string kFixture =
    "model:\n  arch: python\n  entry: models.py:build\n  inputs:\n    - {shape: [B, 4], dtype: float32}\n"
    "  task: sum\ntraining: {optimizer: adamw, trainable: all}\nbatch_sizes: [2]\n";

// A temporary folder with f.yaml (kFixture) and models.py (`code`), and the command that runs memgate there with
// neither CI nor strict mode set.
struct Project {
  testing::TempDir dir;
  explicit Project(const std::string& code) {
    testing::write_file(dir / "f.yaml", kFixture);
    testing::write_file(dir / "models.py", code);
  }
  [[nodiscard]] std::string memgate(const std::string& args) const {
    return fmt::format("env -u CI -u MEMGATE_STRICT {} {}", MEMGATE_CLI, args);
  }
  [[nodiscard]] std::string check(const std::string& extra = "") const {
    return memgate(fmt::format("check --config {} --device cpu --baselines {} {}", dir / "f.yaml", dir / "baselines",
                               extra));
  }
};

// Each forward keeps a copy of its output on the module (a loss history kept as tensors, say): 2 x 2 float32 at batch
// 2, 16 bytes per train-mode forward.
TEST(SteadyStateTest, AStepWhoseMemoryGrowsIsAnErrorThatSaysByHowManyBytesPerStep) {
  Project p("import torch\n\nclass Leaky(torch.nn.Module):\n"
            "    def __init__(self):\n        super().__init__()\n        self.lin = torch.nn.Linear(4, 2)\n"
            "        self.kept = []\n\n"
            "    def forward(self, x):\n        y = self.lin(x)\n        self.kept.append(y.detach().clone())\n"
            "        return y\n\n"
            "def build():\n    return Leaky()\n");
  std::string out;
  EXPECT_EQ(testing::run_dev(p.memgate(fmt::format("profile --config {} --device cpu", p.dir / "f.yaml")), &out), 3)
      << out;
  EXPECT_THAT(out, HasSubstr("f.yaml at batch 2: memory grows by 16 bytes per step")) << out;
  EXPECT_THAT(out, HasSubstr("not steady"));
  EXPECT_EQ(testing::run_dev(p.check("--update-baselines"), &out), 3) << out;
  EXPECT_THAT(out, HasSubstr("memory grows by 16 bytes per step"));
  EXPECT_FALSE(std::filesystem::exists(p.dir / "baselines")) << "nothing is recorded from it";
}

// A model whose module-level list keeps a tensor of its build: each build imports the file anew, so the list of an
// earlier probe goes with that probe's module, in reference cycles that only Python's collector frees. It is
// collected before the next probe reads its base: each probe measures its own bytes, the same as a process of its own
// (before, the earlier probe's 4,000 bytes were freed inside the next probe's build, and its params read 40 bytes).
TEST(SteadyStateTest, AnEarlierProbesModuleIsCollectedBeforeTheNextProbesBase) {
  Project p("import torch\n\n_KEPT = []\n\n"
            "def build():\n    _KEPT.append(torch.zeros(1000))\n    return torch.nn.Linear(4, 2)\n");
  std::string out;
  ASSERT_EQ(testing::run_dev(p.memgate(fmt::format("profile --config {} --device cpu --batch-sizes 1,2 --output {}",
                                                   p.dir / "f.yaml", p.dir / "p.json")),
                             &out),
            0)
      << out;
  const auto profile = nlohmann::json::parse(testing::read_file(p.dir / "p.json"));
  ASSERT_EQ(profile["probes"].size(), 2U);
  // Linear(4, 2)'s 40 bytes and the list's 4,000 at each batch size.
  EXPECT_EQ(profile["probes"][0]["components"]["params"], 40 + 4000);
  EXPECT_EQ(profile["probes"][1]["components"]["params"], 40 + 4000) << "batch 2's own list, none freed inside it";
}

// Memory of an earlier probe that the next one frees while it is measured (here a tensor parked in builtins, which
// outlive every import) is an error of that probe, never numbers short by those bytes.
TEST(SteadyStateTest, AProbeThatFreesAnEarlierProbesTensorsIsAnErrorNotNumbers) {
  Project p("import builtins\nimport torch\n\n"
            "def build():\n    if hasattr(builtins, '_memgate_test_kept'):\n"
            "        del builtins._memgate_test_kept\n"
            "    elif torch.empty(0).device.type == 'cpu':\n"
            "        builtins._memgate_test_kept = torch.zeros(1000)\n"
            "    return torch.nn.Linear(4, 2)\n");
  std::string out;
  EXPECT_EQ(testing::run_dev(
                p.memgate(fmt::format("profile --config {} --device cpu --batch-sizes 1,2", p.dir / "f.yaml")), &out),
            3)
      << out;
  // Seen first as a negative component (params -3,960 bytes), else by the base it did not return to.
  EXPECT_THAT(out, HasSubstr("at batch 2: ")) << out;
  EXPECT_THAT(out, HasSubstr("allocated before ")) << out;
  EXPECT_THAT(out, HasSubstr(" freed while it was measured")) << out;
}

// A forward whose saved tensor has a size drawn from the OS at each call: no two runs give the same bytes.
const std::string kNoisy =
    "import os\nimport torch\n\nclass Noisy(torch.nn.Module):\n"
    "    def __init__(self):\n        super().__init__()\n        self.lin = torch.nn.Linear(4, 2)\n\n"
    "    def forward(self, x):\n        n = 1 + int.from_bytes(os.urandom(2), 'little')\n"
    "        return (self.lin(x).sum() * x.new_ones(n)).sum()\n\n"
    "def build():\n    return Noisy()\n";

TEST(RepeatabilityTest, RecordingMeasuresTwiceAndRefusesBytesThatDiffer) {
  Project p(kNoisy);
  std::string out;
  EXPECT_EQ(testing::run_dev(p.check("--update-baselines"), &out), 3) << out;
  EXPECT_THAT(out, HasSubstr("not repeatable, nothing recorded: measured twice, these components differ"));
  EXPECT_THAT(out, HasSubstr("batch 2: "));
  EXPECT_THAT(out, HasSubstr("activations "));
  EXPECT_THAT(out, HasSubstr(" then "));
  EXPECT_FALSE(std::filesystem::exists(p.dir / "baselines/cpu/f.json")) << "nothing is recorded";
}

TEST(RepeatabilityTest, ACheckThatSeesBytesMoveSaysNotRepeatableNeverRegressionOrStale) {
  Project p(kNoisy);
  std::string out;
  // A baseline from one measurement (as a record from before the model became noisy would be).
  ASSERT_EQ(testing::run_dev(p.memgate(fmt::format("profile --config {} --device cpu --output {}", p.dir / "f.yaml",
                                                   p.dir / "p.json")),
                             &out),
            0)
      << out;
  const auto profile = nlohmann::json::parse(testing::read_file(p.dir / "p.json"));
  const nlohmann::json baseline = {
      {"schema", 1}, {"fixture", "f"}, {"device", {{"slug", "cpu"}}},
      {"tolerance", {{"relative", 0.005}, {"absolute_bytes", 0}, {"reserved_relative", 0.005},
                     {"reserved_absolute_bytes", 0}}},
      {"probes", {{{"batch_size", 2}, {"components", profile["probes"][0]["components"]},
                   {"provenance", {{"fixture_hash", profile["model"]["fixture_hash"]}}}}}}};
  testing::write_file(p.dir / "baselines/cpu/f.json", baseline.dump(2));
  EXPECT_EQ(testing::run_dev(p.check(), &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("not-repeatable f_bs2_activations"));
  EXPECT_THAT(out, HasSubstr("activations is not repeatable: two measurements of the same probe gave"));
  EXPECT_THAT(out, Not(HasSubstr("regression  f_bs2_activations")));
  EXPECT_THAT(out, Not(HasSubstr("stale       f_bs2_activations")));
  EXPECT_EQ(testing::read_file(p.dir / "baselines/cpu/f.json"), baseline.dump(2)) << "the baseline is as it was";
}

}  // namespace
}  // namespace memgate
