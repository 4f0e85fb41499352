// What memgate's own machinery must not change (issue 68): a library that makes a tensor as it is first imported
// (a detection head's anchors at class level), imported inside the model's builder, is imported on the CPU even when
// the process's first build is the parameter count's on the Meta device; and an op whose output's size depends on data
// is refused by an estimate with memgate's message, naming the op and the module whose forward called it; and state the
// user's code keeps between the batch sizes of a sweep does not change their bytes.
#include "memgate/base/components.h"
#include "memgate/gate/fixture.h"
#include "memgate/launch/estimate.h"
#include "memgate/launch/run.h"
#include "fixture_util.h"
#include "test_util.h"
#include "twins.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace memgate {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A fixture folder: f_<entry>.yaml over models.py:<entry> (inputs [B, 4], task sum) and lib/anchors_lib, a package of
// the team's own on PYTHONPATH whose class makes its anchors as it is imported.
struct IsolationFolder {
  testing::TempDir dir;
  IsolationFolder() {
    testing::write_file(dir / "lib/anchors_lib/__init__.py",
                        "import torch\nfrom torch import nn\n\n\n"
                        "class AnchorHead(nn.Module):\n"
                        "    ANCHORS = torch.linspace(0.0, 1.0, 64).view(16, 4)  # made as the package is imported\n\n"
                        "    def __init__(self):\n        super().__init__()\n        self.proj = nn.Linear(4, 4)\n"
                        "        self.register_buffer('anchors', self.ANCHORS.clone(), persistent=False)\n\n"
                        "    def forward(self, x):\n        return self.proj(x) + self.anchors[: x.shape[0]]\n");
    testing::write_file(dir / "models.py",
                        "import torch\nfrom torch import nn\n\n\n"
                        "class Net(nn.Module):\n"
                        "    def __init__(self, head):\n        super().__init__()\n        self.lin = nn.Linear(4, 4)\n"
                        "        self.head = head\n\n"
                        "    def forward(self, x):\n        return self.head(self.lin(x))\n\n\n"
                        "def anchors():\n"
                        "    from anchors_lib import AnchorHead  # imported inside the builder's body\n"
                        "    return Net(AnchorHead())\n\n\n"
                        "def anchors_by_name():\n"
                        "    import importlib  # an import the fork server's reading of the file does not see\n"
                        "    return Net(importlib.import_module('anchors_lib').AnchorHead())\n\n\n"
                        "class Picks(nn.Module):\n"
                        "    def __init__(self, how):\n        super().__init__()\n        self.how = how\n"
                        "        self.lin = nn.Linear(4, 4)\n\n"
                        "    def forward(self, x):\n"
                        "        y = self.lin(x)\n"
                        "        if self.how == 'nonzero':\n            return y[torch.nonzero(y > 0, as_tuple=True)]\n"
                        "        if self.how == 'tolist':\n            return y[: max(1, len(y[0].tolist()))]\n"
                        "        if self.how == 'item':\n            return y[: max(1, int(y.sum().item()))]\n"
                        "        import torchvision\n"
                        "        keep = torchvision.ops.nms(torch.cat([y[:, :2], y[:, :2] + 1], 1), y[:, 2], 0.5)\n"
                        "        return y[keep]\n\n\n"
                        "class Detector(nn.Module):\n"
                        "    def __init__(self, how):\n        super().__init__()\n        self.body = nn.Linear(4, 4)\n"
                        "        self.picks = Picks(how)\n\n"
                        "    def forward(self, x):\n        return self.picks(self.body(x))\n\n\n"
                        "def detector(how):\n    return Detector(how)\n");
  }
  [[nodiscard]] std::string fixture(const std::string& entry, const std::string& args = "{}") const {
    const auto path = dir / ("f_" + entry + ".yaml");
    testing::write_file(path, fmt::format("model:\n  arch: python\n  entry: models.py:{}\n  args: {}\n  inputs:\n"
                                          "    - {{shape: [B, 4], dtype: float32}}\n  task: sum\n"
                                          "training: {{optimizer: adamw, trainable: all}}\nbatch_sizes: [2]\n",
                                          entry.starts_with("anchors") ? entry : "detector", args));
    return path;
  }
  [[nodiscard]] std::string memgate(const std::string& args) const {
    return fmt::format("env -u CI -u MEMGATE_STRICT PYTHONPATH={} {} {}", dir / "lib", MEMGATE_CLI, args);
  }
};

nlohmann::json components_of(const std::string& path) {
  return nlohmann::json::parse(testing::read_file(path)).at("probes").at(0).at("components");
}

// The fixture measured (`profile`) and estimated: the measurement runs, and the estimate equals it on every component.
void expect_measured_and_estimated_alike(const IsolationFolder& f, const std::string& fixture) {
  std::string out;
  ASSERT_EQ(testing::run(f.memgate(fmt::format("profile --config {} --device cpu --output {}", fixture,
                                               f.dir / "measured.json")),
                         &out),
            0)
      << out;
  EXPECT_THAT(out, Not(HasSubstr("meta tensor"))) << out;
  ASSERT_EQ(testing::run(f.memgate(fmt::format("estimate --config {} --for cpu --output {}", fixture,
                                               f.dir / "estimated.json")),
                         &out),
            0)
      << out;
  const auto measured = components_of(f.dir / "measured.json"), estimated = components_of(f.dir / "estimated.json");
  for (const auto& [name, bytes] : measured.items()) {
    EXPECT_GT(bytes.get<std::int64_t>(), 0) << name;
    EXPECT_EQ(estimated.at(name), bytes) << name;
  }
}

// Before, the parameter count's build on the Meta device imported anchors_lib under torch.device("meta"): its anchors
// were a Meta tensor for the whole process and the measurement failed ("Cannot copy out of meta tensor"). Now the
// measurement runs, and the estimate equals it on every component (the anchors a buffer of the model's in both).
// Two builders: one with an import statement (the fork server, which reads it, imports the package before it forks
// the probe) and one that imports it by name (importlib.import_module: the probe's parameter count imports it).
TEST(ParameterCountTest, ALibraryImportedInTheBuilderMakesItsTensorsOnTheCpuAsAProcessOfItsOwnDoes) {
  IsolationFolder f;
  for (const auto* entry : {"anchors", "anchors_by_name"}) {
    SCOPED_TRACE(entry);
    expect_measured_and_estimated_alike(f, f.fixture(entry));
  }
}

// nonzero (boolean indexing), a read of values (tolist, item) and torchvision's NMS in a module's forward: the estimate
// fails with memgate's message (the op, the module, measure it instead), not PyTorch's text, through the CLI; the
// measurement runs (run_probe, what `memgate profile` runs: the four probes fork from one Python server here).
TEST(DataDependentOpTest, AnEstimateRefusesItNamingTheOpAndTheModuleAndSaysToMeasure) {
  IsolationFolder f;
  const std::vector<std::pair<std::string, std::string>> cases{
      {"nonzero", "aten::nonzero"},
      {"tolist", "a read of a tensor's values"},
      {"item", "aten::_local_scalar_dense"},
      {"nms", "torchvision::nms"}};
  for (const auto& [how, op] : cases) {
    const auto fixture = f.fixture("detector_" + how, fmt::format("{{how: {}}}", how));
    std::string out;
    EXPECT_EQ(testing::run(f.memgate(fmt::format("estimate --config {} --for cpu", fixture)), &out), 3) << out;
    EXPECT_THAT(out, HasSubstr("the estimate cannot run " + op)) << how << ": " << out;
    EXPECT_THAT(out, HasSubstr("called in the forward of 'picks' (Picks)")) << how << ": " << out;
    EXPECT_THAT(out, HasSubstr("measure it instead (`memgate profile`)")) << how << ": " << out;
    for (const auto* bare : {"Traceback", "register_meta function", "Cannot copy out of meta tensor",
                             "as opposed to FakeTensors"}) {
      EXPECT_THAT(out, Not(HasSubstr(bare))) << how << ": " << out;
    }
    const auto measured = run_probe(load_fixture(fixture), 2, testing::kCpu);
    EXPECT_TRUE(!measured.oom && measured.error.empty()) << how << ": " << measured.error;
    EXPECT_GT(measured.components.activations, 0) << how;
  }
}

// State the user's code keeps between batch sizes: a model whose forward counts its calls (its extra head joins after
// four, one probe's forwards) and a loss from a package on PYTHONPATH with a module-level step counter and state
// inside objects (a list, a dict, a class attribute, an instance's attribute), each a wider term after two steps, one
// probe's; each of the four put back in place is needed (without any one of them the sweep differs). A dict subclass
// that fails as it is read (transformers' lazy auto mappings import a class per key) is left alone, not a crash. Before, a sweep's later batch sizes ran with both switched on (the estimate's one
// built module kept its counter; the package's counter went on in the measurement's process): gradients 17,920 B
// against 1,280 B at batch 2. Each batch size of a sweep now equals a process of its own, estimate and measurement.
// Through the library, as `memgate estimate` and `memgate profile` sweep (estimate_profile, run_probes: each sweep in
// one Python process) and probe one batch size (estimate_probe, run_probe: a Python process each), so that the eight
// probes' processes fork from one server that imported torch (eight CLI runs each imported it: 2.5 core-s each).
TEST(SweepStateTest, EachBatchSizeOfASweepEqualsAProcessOfItsOwn) {
  testing::TempDir dir;
  // Each kind of state switches on a term of its own width after two steps: a global rebound (STEP), a list appended
  // to, a dict filled, a class attribute counted up and an instance's attribute counted up (the state inside objects).
  testing::write_file(dir / "lib/stepstate/__init__.py",
                      "import torch\n\nSTEP = 0  # the loss's own step counter\nHISTORY = []\nCACHE = {}\n\n\n"
                      "class Scale:\n    calls = 0\n\n\n"
                      "class Tracker:\n    def __init__(self):\n        self.seen = 0\n\n\nTRACKER = Tracker()\n\n\n"
                      "class Lazy(dict):  # a mapping that imports as it is read (transformers' lazy auto mappings)\n"
                      "    def __iter__(self):\n        raise ValueError('Could not find a model class')\n\n"
                      "    keys = items = values = __iter__\n\n\nLAZY = Lazy()\n\n\n"
                      "def loss(output, batch):\n    global STEP\n    STEP += 1\n    HISTORY.append(STEP)\n"
                      "    CACHE[len(CACHE)] = STEP\n    Scale.calls += 1\n    TRACKER.seen += 1\n"
                      "    h, extra = output\n"
                      "    value = h.pow(2).mean() + extra.pow(2).mean()\n"
                      "    for widen, count in ((8, STEP), (2, len(HISTORY)), (3, len(CACHE)), (4, Scale.calls),\n"
                      "                         (5, TRACKER.seen)):\n"
                      "        if count > 2:\n            value = value + torch.cat([h] * widen, dim=1).pow(2).mean()\n"
                      "    return value\n");
  testing::write_file(dir / "models.py",
                      "from torch import nn\n\n\n"
                      "class Net(nn.Module):\n"
                      "    def __init__(self):\n        super().__init__()\n        self.body = nn.Linear(4, 64)\n"
                      "        self.extra = nn.Linear(64, 64)\n        self.calls = 0\n\n"
                      "    def forward(self, x):\n        self.calls += 1\n        h = self.body(x)\n"
                      "        return h, (self.extra(h) if self.calls > 4 else h * 0)\n\n\n"
                      "def build():\n    return Net()\n");
  testing::write_file(dir / "f.yaml", "model:\n  arch: python\n  entry: models.py:build\n  loss: stepstate:loss\n"
                                      "  inputs:\n    - {shape: [B, 4], dtype: float32}\n"
                                      "training: {optimizer: adamw, trainable: all}\nbatch_sizes: [1, 2, 4]\n");
  // The package's folder on PYTHONPATH for the probes' Pythons (and their fork server, started by the first probe).
  const char* old_path = std::getenv("PYTHONPATH");
  const std::string saved = old_path == nullptr ? "" : old_path;
  ::setenv("PYTHONPATH", (dir / "lib").c_str(), 1);
  const auto f = load_fixture(dir / "f.yaml");
  const std::vector<std::int64_t> batches{1, 2, 4};
  const auto expect_alike = [&](const std::vector<ProbeResult>& sweep, const auto& alone_at, const char* command) {
    ASSERT_EQ(sweep.size(), 3U) << command;
    for (std::size_t i = 0; i < 3; ++i) {
      const auto alone = alone_at(batches[i]);
      ASSERT_FALSE(sweep[i].oom || !sweep[i].error.empty()) << command << ": " << sweep[i].error;
      ASSERT_FALSE(alone.oom || !alone.error.empty()) << command << ": " << alone.error;
      testing::expect_equal_components(sweep[i].components, alone.components,
                                       fmt::format("{} at batch {}", command, batches[i]));
    }
  };
  expect_alike(estimate_profile(f, batches, EstimateTarget::kCpu).probes,
               [&](std::int64_t b) { return estimate_probe(f, b, EstimateTarget::kCpu); }, "estimate --for cpu");
  expect_alike(run_probes(f, batches, testing::kCpu), [&](std::int64_t b) { return run_probe(f, b, testing::kCpu); },
               "profile --device cpu");
  if (old_path == nullptr) {
    ::unsetenv("PYTHONPATH");
  } else {
    ::setenv("PYTHONPATH", saved.c_str(), 1);
  }
}

}  // namespace
}  // namespace memgate
