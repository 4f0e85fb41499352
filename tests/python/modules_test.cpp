// Which module grew (issue 58): a Python fixture's activations and peaks are split by the module whose forward
// allocated what is alive there, each split summing to its component to the byte; the baseline keeps the split, and a
// change to one module's code fails the gate naming that module, in the message, check's table, its JSON, JUnit and
// Markdown, and the HTML summary.
#include "memgate/base/files.h"
#include "memgate/base/module_breakdown.h"
#include "memgate/gate/fixture.h"
#include "memgate/launch/run.h"
#include "cli_fork.h"
#include "fixture_util.h"
#include "test_util.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace memgate {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// An encoder, a decoder with two linear layers, a head; `decoder_code` is the decoder's forward.
std::string modules_model_code(const std::string& decoder_code) {
  return "import torch\nfrom torch import nn\n\n"
         "class Decoder(nn.Module):\n"
         "    def __init__(self, d):\n        super().__init__()\n"
         "        self.up = nn.Linear(d, 4 * d)\n        self.down = nn.Linear(4 * d, d)\n\n"
         "    def forward(self, x):\n" + decoder_code +
         "\nclass Net(nn.Module):\n"
         "    def __init__(self, d=32):\n        super().__init__()\n"
         "        self.encoder = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d))\n"
         "        self.decoder = Decoder(d)\n        self.head = nn.Linear(d, 10)\n\n"
         "    def forward(self, x):\n        return self.head(self.decoder(self.encoder(x)))\n\n"
         "def build():\n    return Net()\n";
}
const std::string kModulesPlainDecoder = "        return self.down(torch.relu(self.up(x)))\n";
// The same decoder gated by a sigmoid of its own: two more tensors saved for backward, allocated in the decoder's
// forward but in none of its submodules'.
const std::string kModulesGatedDecoder = "        h = self.up(x)\n        return self.down(torch.relu(h) * torch.sigmoid(h))\n";

const std::string kModulesFixture =
    "model:\n  arch: python\n  entry: models.py:build\n  inputs:\n    - {shape: [B, 32], dtype: float32}\n"
    "  task: sum\ntraining: {optimizer: adamw, trainable: all}\nbatch_sizes: [4]\n";

// What the gate runs here without: CI (and MEMGATE_STRICT) make a missing baseline a failure, and
// GITHUB_STEP_SUMMARY would have it write a summary.
const std::vector<std::string> kNotTheGates = {"CI", "MEMGATE_STRICT", "GITHUB_STEP_SUMMARY"};

// `memgate check` with `args`, as `env -u CI -u MEMGATE_STRICT -u GITHUB_STEP_SUMMARY memgate check ...` runs it (its
// exit code, its stdout and stderr), through tests/common/cli_fork.h's run_cli: forked from this process (what
// memgate-measure's main() runs, LibTorch started already), its probes forked from this process's Python fork server
// for runs without those variables (lend_python_fork_server; EachSplitSumsToItsComponentToTheByte's probes, run
// without them, come from the same one), so that they pay no Python start and no import of torch (~1.9 CPU-s of each
// run's ~2.2). Where this process has threads besides its main one (fork copies that one only), or with
// MEMGATE_TEST_FORK_CLI=0, the real program runs instead; MEMGATE_TEST_CLI_RECORD records each run
// (tests/cli/compare_cli_runs.py compares two).
int run_check(const std::vector<std::string>& args, std::string* output) {
  std::string command = fmt::format("env -u CI -u MEMGATE_STRICT -u GITHUB_STEP_SUMMARY {} check", MEMGATE_CLI);
  for (const auto& a : args) command += " '" + a + "'";
  return testing::run_cli(command, output, /*lend_python_server=*/true);
}

struct ModulesProject {
  testing::TempDir dir;
  explicit ModulesProject(const std::string& decoder_code) {
    testing::write_file(dir / "f.yaml", kModulesFixture);
    testing::write_file(dir / "models.py", modules_model_code(decoder_code));
  }
  // `memgate check --config f.yaml --device cpu --baselines baselines <extra...>` (run_check).
  int check(const std::vector<std::string>& extra, std::string* output) const {
    std::vector<std::string> args{"--config", dir / "f.yaml", "--device", "cpu", "--baselines", dir / "baselines"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_check(args, output);
  }
};

// The plain decoder's project recorded (`check --update-baselines`, which measures its probe twice) once for the suite:
// its exit, its output and the baseline it wrote. Each test that starts from that baseline copies it into a project of
// its own.
struct Recorded {
  int rc = -1;
  std::string out;
  std::string baseline;
};

const Recorded& plain_recorded() {
  static const Recorded recorded = [] {
    ModulesProject p(kModulesPlainDecoder);
    Recorded r;
    r.rc = p.check({"--update-baselines"}, &r.out);
    if (const auto file = p.dir / "baselines/cpu/f.json"; std::filesystem::exists(file)) {
      r.baseline = testing::read_file(file);
    }
    return r;
  }();
  return recorded;
}

// `p` (the plain decoder's) with plain_recorded()'s baseline, which the recording must have written.
void start_from_recorded(const ModulesProject& p) {
  const auto& r = plain_recorded();
  ASSERT_EQ(r.rc, 0) << r.out;
  ASSERT_FALSE(r.baseline.empty()) << "no baseline recorded: " << r.out;
  testing::write_file(p.dir / "baselines/cpu/f.json", r.baseline);
}

std::int64_t sum_of_modules(const ModuleBytes& modules) {
  return std::accumulate(modules.begin(), modules.end(), std::int64_t{0},
                         [](std::int64_t total, const auto& entry) { return total + entry.second; });
}

// Each component with a breakdown is split exactly: the modules' bytes add up to the component's, at two batch
// sizes; the leaves whose outputs backward keeps hold activations, and what no module's forward allocated (the
// parameters and the optimizer's state at the step's peak) is named by the part of the step that allocated it.
TEST(ModuleBreakdownTest, EachSplitSumsToItsComponentToTheByte) {
  ModulesProject p(kModulesPlainDecoder);
  const auto fixture = load_fixture(p.dir / "f.yaml");
  // The gate's environment: its runs (run_check) fork their probes from the server these probes start.
  const testing::WithoutVariables without(kNotTheGates);
  for (const std::int64_t batch : {2, 4}) {
    const auto probe = run_probe(fixture, batch, testing::kCpu);
    ASSERT_TRUE(probe.measured()) << probe.error;
    for (const auto component : kBrokenDownComponents) {
      const auto* modules = probe.modules.find(component);
      ASSERT_NE(modules, nullptr) << component;
      EXPECT_EQ(sum_of_modules(*modules), probe.components.get(component)) << component << " at batch " << batch;
    }
    // What backward keeps: each encoder layer's output (GELU and the Linears save their inputs), the decoder's
    // ReLU output (made in the decoder's own forward), decoder.down's output (the head's input). decoder.up's output
    // is freed (ReLU keeps its own), and so is the head's (the loss needs no input).
    const auto& activations = *probe.modules.find("activations");
    for (const auto* module : {"encoder.0", "encoder.1", "encoder.2", "decoder", "decoder.down"}) {
      EXPECT_EQ(activations.at(module), batch * 32 * 4 * (std::string(module) == "decoder" ? 4 : 1))
          << module << " at batch " << batch;
    }
    EXPECT_FALSE(activations.contains("decoder.up"));
    EXPECT_FALSE(activations.contains("head"));
    EXPECT_EQ(probe.modules.find("forward_peak")->at("decoder.up"), batch * 128 * 4) << "alive at the peak";
    const auto& step_peak = *probe.modules.find("step_peak");
    EXPECT_TRUE(step_peak.contains("(building the model)")) << "the parameters";
    EXPECT_TRUE(step_peak.contains("(warm-up step: optimizer step)")) << "AdamW's state";
  }
}

// The zoo's C++ models have no modules memgate can name: no breakdown, and their baselines stay as they were.
TEST(ModuleBreakdownTest, AZooModelHasNone) {
  const auto probe = run_probe(testing::model_fixture("vit_tiny_lora"), 1, testing::kCpu);
  ASSERT_TRUE(probe.measured()) << probe.error;
  EXPECT_TRUE(probe.modules.empty());
}

TEST(ModuleBreakdownTest, AGrownModuleIsNamedByTheGate) {
  ModulesProject p(kModulesPlainDecoder);
  std::string out;
  ASSERT_NO_FATAL_FAILURE(start_from_recorded(p));
  const auto file = p.dir / "baselines/cpu/f.json";
  const auto recorded = testing::read_file(file);
  const auto baseline = nlohmann::json::parse(recorded);
  ASSERT_TRUE(baseline["probes"][0].contains("modules")) << recorded;
  EXPECT_EQ(baseline["probes"][0]["modules"]["activations"]["decoder"], 2048) << recorded;
  // Recorded again with nothing changed: the file stays byte for byte.
  ASSERT_EQ(p.check({"--update-baselines"}, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("unchanged"));
  EXPECT_EQ(testing::read_file(file), recorded);
  ASSERT_EQ(p.check({}, &out), 0) << out;

  // The decoder's code changes: its forward keeps a gate's two tensors more.
  testing::write_file(p.dir / "models.py", modules_model_code(kModulesGatedDecoder));
  const std::vector<std::string> reports{"--json",     p.dir / "v.json", "--junit", p.dir / "j.xml",
                                         "--markdown", p.dir / "s.md",   "--html",  p.dir / "s.html"};
  EXPECT_EQ(p.check(reports, &out), 1) << out;
  // 4 x 128 float32 twice, in the decoder's own forward.
  EXPECT_THAT(out, HasSubstr("by module: +4,096 B in decoder")) << out;
  EXPECT_THAT(out, HasSubstr("regression  f_bs4_activations")) << out;
  EXPECT_THAT(out, HasSubstr("+4.0 KiB decoder")) << "the table's module column: " << out;
  EXPECT_LT(out.find("by module:"), out.find("If this growth is intended")) << "the module before what to do";

  const auto verdicts = nlohmann::json::parse(testing::read_file(p.dir / "v.json"));
  bool named = false;
  for (const auto& row : verdicts.at("results")) {
    if (row.at("component") != "activations") continue;
    ASSERT_TRUE(row.contains("modules")) << row.dump();
    EXPECT_EQ(row["modules"][0]["module"], "decoder");
    EXPECT_EQ(row["modules"][0]["measured"].get<std::int64_t>() - row["modules"][0]["baseline"].get<std::int64_t>(),
              4096);
    named = true;
  }
  EXPECT_TRUE(named);
  EXPECT_THAT(testing::read_file(p.dir / "j.xml"), HasSubstr("by module: +4,096 B in decoder"));
  const auto md = testing::read_file(p.dir / "s.md");
  EXPECT_THAT(md, HasSubstr("module that changed most"));
  EXPECT_THAT(md, HasSubstr("+4.0 KiB in `decoder`")) << md;

  // The HTML page shows the same modules.
  const auto html = testing::read_file(p.dir / "s.html");
  EXPECT_THAT(html, HasSubstr("<h2>By module</h2>"));
  EXPECT_THAT(html, HasSubstr("<td>decoder</td>"));

  // Recorded, the gate passes again and the breakdown holds the decoder's new bytes.
  ASSERT_EQ(p.check({"--update-baselines"}, &out), 0) << out;
  EXPECT_EQ(p.check({}, &out), 0) << out;
  EXPECT_THAT(out, Not(HasSubstr("by module")));
}

// A baseline recorded before breakdowns were kept judges as before; a failure says how to get the modules named.
TEST(ModuleBreakdownTest, ABaselineWithoutOneSaysHowToGetIt) {
  ModulesProject p(kModulesPlainDecoder);
  std::string out;
  ASSERT_NO_FATAL_FAILURE(start_from_recorded(p));
  const auto file = p.dir / "baselines/cpu/f.json";
  auto baseline = nlohmann::json::parse(testing::read_file(file));
  baseline["probes"][0].erase("modules");
  testing::write_file(file, baseline.dump(2));
  EXPECT_EQ(p.check({}, &out), 0) << out;
  testing::write_file(p.dir / "models.py", modules_model_code(kModulesGatedDecoder));
  EXPECT_EQ(p.check({}, &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("the baseline has no per-module breakdown of activations; record it again")) << out;
  // A corrupt breakdown is an error naming the file and the key.
  baseline["probes"][0]["modules"] = {{"activations", {{"decoder", "many"}}}};
  testing::write_file(file, baseline.dump(2));
  EXPECT_EQ(p.check({}, &out), 3) << out;
  EXPECT_THAT(out, HasSubstr("probes[0].modules.activations.decoder: expected a whole number of bytes")) << out;
}

}  // namespace
}  // namespace memgate
