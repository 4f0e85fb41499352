// Memory snapshots for memory_viz: recording changes no byte, and the CPU's pickle reads back in Python with the
// measured step's peak to the byte.
#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/backend/cpu_allocator.h"
#include "memgate/backend/memory_snapshot.h"
#include "memgate/measure/probe.h"
#include "memgate/launch/run.h"
#include "fixture_util.h"
#include "test_util.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace memgate {
namespace {

using ::testing::HasSubstr;

using testing::kCpu;

// The checker of tests/backend: Python's pickle and, where this Python has torch, torch.cuda._memory_viz.
int check_in_python(const std::string& pickle, const std::string& flags, std::string* out) {
  const std::string script = testing::source_dir() + "/tests/backend/check_memory_snapshot.py";
  return testing::run(fmt::format("'{}' '{}' '{}' {}", MEMGATE_TEST_PYTHON, script, pickle, flags), out);
}

bool python_has_torch() {
  return testing::run(fmt::format("'{}' -c 'import torch'", MEMGATE_TEST_PYTHON)) == 0;
}

TEST(MemorySnapshotTest, RecordingChangesNoByteOfTheProbe) {
  const auto fixture = testing::fixture_from(
      testing::tiny_vit_yaml("  trainable: lora\n", "  lora: {rank: 4, alpha: 8, targets: [qkv]}\n"));
  const auto plain = run_probe(fixture, 2, kCpu);
  ProbeOptions options;
  options.snapshot = SnapshotOptions{};
  std::vector<std::string> phases;
  options.on_phase = [&](std::string_view p) { phases.emplace_back(p); };
  const auto recorded = run_probe(fixture, 2, kCpu, options);
  ASSERT_FALSE(recorded.oom) << recorded.error;
  EXPECT_EQ(recorded.components, plain.components);
  EXPECT_TRUE(plain.snapshot.empty()) << "no snapshot unless asked";
  EXPECT_GT(recorded.snapshot.size(), 1000U);
  EXPECT_EQ(phases.front(), "building the model");
  EXPECT_THAT(phases, ::testing::Contains("measured step: backward"));
  EXPECT_THAT(phases, ::testing::Contains("warm-up step: optimizer step"));
}

TEST(MemorySnapshotTest, TheCpuSnapshotReadsBackInPythonWithTheStepPeakToTheByte) {
  const auto fixture = testing::fixture_from(testing::tiny_vit_yaml());
  ProbeOptions options;
  options.snapshot = SnapshotOptions{};
  const auto r = run_probe(fixture, 4, kCpu, options);
  ASSERT_FALSE(r.oom) << r.error;
  testing::TempDir dir;
  write_file_atomically(dir / "step.pickle", r.snapshot);
  std::string out;
  const auto flags =
      fmt::format("--step-peak {}{}", r.components.step_peak, python_has_torch() ? " --memory-viz" : "");
  EXPECT_EQ(check_in_python(dir / "step.pickle", flags, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("ok: "));
  // The check can fail: one byte off the measured peak is refused.
  EXPECT_EQ(check_in_python(dir / "step.pickle", fmt::format("--step-peak {}", r.components.step_peak + 1), &out), 1)
      << out;
  EXPECT_THAT(out, HasSubstr("the measured step peaks"));
  testing::write_file(dir / "broken.pickle", r.snapshot.substr(0, r.snapshot.size() / 2));
  EXPECT_NE(check_in_python(dir / "broken.pickle", "", &out), 0) << "a truncated pickle does not load";
}

TEST(MemorySnapshotTest, AnOutOfMemoryStillLeavesTheHistoryUpToIt) {
  const auto fixture = testing::fixture_from(testing::tiny_vit_yaml());
  ProbeOptions options;
  options.snapshot = SnapshotOptions{};
  const auto r = run_probe_capped(fixture, 8, kCpu, 200 * 1024, options);
  ASSERT_TRUE(r.oom) << "200 KiB cannot hold the tiny ViT's step";
  ASSERT_FALSE(r.snapshot.empty()) << r.error;
  testing::TempDir dir;
  write_file_atomically(dir / "oom.pickle", r.snapshot);
  std::string out;
  EXPECT_EQ(check_in_python(dir / "oom.pickle", "", &out), 0) << out;
}

TEST(MemorySnapshotTest, ASnapshotIsTakenOnceAndOnlyOnADeviceThatRecords) {
  AllocationHistory history(kCpu, {});
  const auto t = torch::ones({256});
  const auto pickle = history.finish();
  EXPECT_FALSE(pickle.empty());
  EXPECT_THROW((void)history.finish(), Error);
  EXPECT_THROW(AllocationHistory(c10::Device(c10::DeviceType::MPS), {}), Error);
  // A finished recording no longer observes the allocator: allocating afterwards is safe.
  const auto u = torch::ones({1024});
  EXPECT_EQ(u.numel(), 1024);
}

}  // namespace
}  // namespace memgate
