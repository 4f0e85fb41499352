// What an update leaves behind and what a comparison can hold: a temporary file of an update killed with SIGKILL is
// removed by the next update (and only such files); a baseline of 2^63-1 bytes compares without overflowing into
// "grew". And a model with nothing to train, or a Python fixture's `python:`, says which fixture and key.
#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/gate/baseline.h"
#include "memgate/measure/train_step.h"
#include "memgate/models/python.h"
#include "fixture_util.h"
#include "test_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <limits>
#include <string>

namespace memgate {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;
using testing::cpu_info;

ProbeResult probe(std::int64_t bs) {
  ProbeResult r;
  r.batch_size = bs;
  std::int64_t v = 0;
  for (const auto& info : kComponentTable) r.components.*info.member = (v += 1000);
  return r;
}

// A process that writes `<file>.tmp.<its pid>` as write_file_atomically does and is killed with SIGKILL before the
// rename: its pid, gone.
pid_t killed_writer(const std::string& file) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const auto tmp = file + ".tmp." + std::to_string(::getpid());
    if (FILE* f = std::fopen(tmp.c_str(), "w")) {
      std::fputs("{\"half\": ", f);
      std::fclose(f);
    }
    ::raise(SIGKILL);
    ::_exit(1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  return pid;
}

TEST(StrayTemporaryFiles, AnUpdateRemovesThoseOfKilledUpdatesAndNothingElse) {
  testing::TempDir dir;
  const auto f = testing::fixture_from(testing::tiny_vit_yaml(), "tiny");
  const auto path = baseline_path(dir.path().string(), "cpu", f.name);
  fs::create_directories(fs::path(path).parent_path());
  const auto folder = fs::path(path).parent_path();
  const pid_t dead = killed_writer(path);
  const pid_t dead_other = killed_writer((folder / "other.json").string());
  const auto stray = path + ".tmp." + std::to_string(dead);
  const auto stray_other = (folder / "other.json.tmp.").string() + std::to_string(dead_other);
  ASSERT_TRUE(fs::exists(stray));
  ASSERT_TRUE(fs::exists(stray_other));
  // Kept: a live process's (pid 1, and this test's parent), and names of another form. (This process's own name is
  // the one its update writes and renames.)
  const std::vector<std::string> kept{path + ".tmp.1", path + ".tmp." + std::to_string(::getppid()),
                                      (folder / "other.json.tmp." ).string() + std::to_string(::getpid()),
                                      (folder / "notes.tmp.77").string(),
                                      path + ".tmp.x77", path + ".tmp.", (folder / "tiny.yaml.tmp.77").string()};
  for (const auto& k : kept) testing::write_file(k, "keep");

  ASSERT_TRUE(update_baseline(path, f, cpu_info(), {probe(1)}, "abc"));
  EXPECT_FALSE(fs::exists(stray));
  EXPECT_FALSE(fs::exists(stray_other));
  for (const auto& k : kept) EXPECT_TRUE(fs::exists(k)) << k;
  EXPECT_EQ(load_baseline(path).probes.size(), 1U);
}

// --- tolerance arithmetic at the edge of 64 bits -------------------------------------------------------------

constexpr auto kMax = std::numeric_limits<std::int64_t>::max();

TEST(CompareComponent, ABaselineOfTwoToTheSixtyThreeIsWithinItselfNotGrown) {
  Tolerance t;
  t.relative = 0.005;
  t.absolute = 0;
  t.reserved_relative = 0.005;
  t.reserved_absolute = 2 << 20;
  for (const char* component : {"params", "step_peak_reserved"}) {
    const auto same = compare_component("f", 1, component, kMax, kMax, t);
    EXPECT_EQ(same.verdict, Verdict::kWithin) << component << "\n" << same.message();
    EXPECT_EQ(compare_component("f", 1, component, kMax - 1, kMax, t).verdict, Verdict::kWithin);
    EXPECT_EQ(compare_component("f", 1, component, kMax, 0, t).verdict, Verdict::kStale);
    EXPECT_EQ(compare_component("f", 1, component, 0, kMax, t).verdict, Verdict::kRegression);
    EXPECT_EQ(compare_component("f", 1, component, kMax / 2, kMax, t).verdict, Verdict::kRegression);
  }
  // A relative tolerance above 1 on a huge baseline: an allowance beyond 64 bits is the largest they hold.
  t.relative = 3.0;
  const auto wide = compare_component("f", 1, "params", kMax / 2, kMax, t);
  EXPECT_EQ(wide.verdict, Verdict::kWithin) << wide.message();
  EXPECT_EQ(wide.allowed, kMax);
  EXPECT_THAT(wide.message(), HasSubstr("is within its baseline"));
  // An absolute tolerance of 2^63-1 bytes lets anything through, and overflows nothing on the way down either.
  t.relative = 0;
  t.absolute = kMax;
  EXPECT_EQ(compare_component("f", 1, "params", 5, kMax, t).verdict, Verdict::kWithin);
  EXPECT_EQ(compare_component("f", 1, "params", kMax, 0, t).verdict, Verdict::kWithin);
}

TEST(CompareComponent, ABaselineFileOfTwoToTheSixtyThreeBytesIsJudgedWithin) {
  testing::TempDir dir;
  const auto f = testing::fixture_from(testing::tiny_vit_yaml(), "tiny");
  const auto path = baseline_path(dir.path().string(), "cpu", f.name);
  auto huge = probe(1);
  for (const auto& info : kComponentTable) huge.components.*info.member = kMax;
  ASSERT_TRUE(update_baseline(path, f, cpu_info(), {huge}, "abc"));
  const auto b = load_baseline(path, "tiny", "cpu");
  for (const auto& info : kComponentTable) {
    if (!has_component(b.probes.at(0).components, info)) continue;
    const auto c = compare_component("tiny", 1, info.name, b.probes.at(0).components.*info.member, kMax, b.tolerance);
    EXPECT_EQ(c.verdict, Verdict::kWithin) << c.message();
  }
}

// --- a model with nothing to train -----------------------------------------------------------------------------

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

const std::string kFewshot =
    "model:\n  arch: resnet\n  depth: 18\n  img_size: 16\n  width: 16\n  task: protonet\n  ways: 3\n  shots: 1\n"
    "  queries: 2\ntraining:\n  optimizer: sgd\n  momentum: 0.9\n  trainable: all\nbatch_sizes: [1]\n";

TEST(NothingToTrain, AProtonetResNetWithTrainableHeadIsRefusedAtLoadNamingTheKey) {
  testing::TempDir dir;
  auto text = kFewshot;
  text.replace(text.find("trainable: all"), 14, "trainable: head");
  testing::write_file(dir / "fewshot.yaml", text);
  const auto what = error_of([&] { (void)load_fixture(dir / "fewshot.yaml"); });
  EXPECT_THAT(what, HasSubstr(dir / "fewshot.yaml" + ":13: training.trainable: expected at least one trainable "
                                                     "parameter"));
  EXPECT_THAT(what, HasSubstr("got 'head'"));
}

TEST(NothingToTrain, AStepWithNoTrainableParameterSaysSoBeforeItRuns) {
  // The selection that load_fixture refuses for this model, given to the step as a library user could.
  testing::TempDir dir;
  testing::write_file(dir / "fewshot.yaml", kFewshot);
  auto f = load_fixture(dir / "fewshot.yaml");
  f.training.trainable.kind = TrainableSpec::Kind::kHead;
  const auto what = error_of([&] { TrainingStep step(f, 1, testing::kCpu, 0); });
  EXPECT_THAT(what, HasSubstr(dir / "fewshot.yaml" + ": training.trainable: expected at least one trainable "
                                                     "parameter, got none: 'head' selects none"));
  EXPECT_THAT(what, ::testing::Not(HasSubstr("does not require grad")));
}

TEST(NothingToTrain, APatternThatMatchesNothingNamesTheFixture) {
  testing::TempDir dir;
  auto text = kFewshot;
  text.replace(text.find("trainable: all"), 14, "trainable: {train: [\"decoder.*\"]}");
  testing::write_file(dir / "fewshot.yaml", text);
  const auto f = load_fixture(dir / "fewshot.yaml");
  const auto what = error_of([&] { TrainingStep step(f, 1, testing::kCpu, 0); });
  EXPECT_THAT(what, HasSubstr(dir / "fewshot.yaml" + ": training.trainable: the pattern 'decoder.*' matches no "
                                                     "parameter"));
}

// --- a Python fixture's `python:` is relative to the fixture's folder ----------------------------------------

TEST(PythonKey, ARelativePathIsResolvedFromTheFixturesFolder) {
  testing::TempDir dir;
  testing::write_file(dir / "sub/m.py", "def build():\n    pass\n");
  testing::write_file(dir / "sub/f.yaml",
                      "model:\n  arch: python\n  entry: m.py:build\n  python: ../venv/bin/python\n  inputs:\n"
                      "    - {shape: [B, 4], dtype: float32}\n  task: sum\ntraining:\n  optimizer: sgd\n"
                      "batch_sizes: [1]\n");
  const auto f = load_fixture(dir / "sub/f.yaml");
  const auto& py = std::get<PythonOptions>(f.model.options);
  EXPECT_EQ(py.python, (dir.path() / "venv/bin/python").string());
  EXPECT_EQ(py.python_written, "../venv/bin/python");
  EXPECT_EQ(py.python_key, dir / "sub/f.yaml" + ":4: model.python");
}

}  // namespace
}  // namespace memgate
