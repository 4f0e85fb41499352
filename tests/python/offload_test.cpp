// Activation offload (`training.activation_offload`, issue 70): what the forward saves for backward packed into host
// memory as PyTorch's torch.autograd.graph.save_on_cpu does, measured by memgate's protocol (the component
// `host_activations`: the most bytes the host copies held at once in the measured step). The zoo's offload is checked
// against PyTorch's own loop (tools/checkpoint_reference.py --save-on-cpu: the timm twin with its training forwards
// inside save_on_cpu, torch.profiler's allocation events) on every component, and the component is followed through
// the baseline and the gate. On the CPU without CUDA, pin_memory=True copies into ordinary CPU memory (CUDA is not
// available) and pin_memory=False keeps each tensor itself (tensor.cpu() of a CPU tensor).
#include "memgate/base/files.h"
#include "memgate/gate/fixture.h"
#include "memgate/launch/estimate.h"
#include "memgate/launch/run.h"
#include "checkpoint_reference.h"
#include "fixture_util.h"
#include "test_util.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

namespace memgate {
namespace {

using ::testing::HasSubstr;
using testing::kCpu;

const std::vector<std::int64_t> kBatches{1, 4};

// tools/checkpoint_reference.py launched once for the suite: py_vit_tiny_lora_timm at batches 1 and 4 in PyTorch's
// plain loop with every training forward inside save_on_cpu(pin_memory=True) (selection 0), then pin_memory=False
// (selection 1). Its "selections", or the reason it failed as a string.
const nlohmann::json& save_on_cpu_reference() {
  static const auto selections = testing::checkpoint_reference_selections(
      "py_vit_tiny_lora_timm", "--save-on-cpu 1 --save-on-cpu 0 --batch-sizes 1,4");
  return selections;
}

// vit_tiny_lora (the timm twin's zoo fixture) with `training.activation_offload: <mode>`, written into `dir`.
Fixture vit_offloaded(const testing::TempDir& dir, const std::string& mode) {
  auto text = read_text_file(testing::source_dir() + "/fixtures/models/vit_tiny_lora.yaml", "a fixture");
  text.replace(text.find("  precision: fp32\n"), 18, "  precision: fp32\n  activation_offload: " + mode + "\n");
  write_file_atomically(dir / ("vit_tiny_lora_" + mode + ".yaml"), text);
  return load_fixture(dir / ("vit_tiny_lora_" + mode + ".yaml"));
}

// Every component of `fixture` at kBatches equals the reference's selection `index`, host_activations included.
void expect_save_on_cpu_reference(const Fixture& fixture, std::size_t index) {
  const auto& selections = save_on_cpu_reference();
  ASSERT_TRUE(selections.is_array()) << "the reference failed: " << selections.dump();
  ASSERT_GT(selections.size(), index);
  const auto& ref = selections[index].at("probes");
  ASSERT_EQ(ref.size(), kBatches.size());
  for (std::size_t i = 0; i < kBatches.size(); ++i) {
    const auto probe = run_probe(fixture, kBatches[i], kCpu);
    ASSERT_FALSE(probe.oom) << probe.error;
    ASSERT_TRUE(probe.components.offloads_activations);
    ASSERT_TRUE(ref[i].contains("host_activations"));
    for (const auto* c : {"params", "gradients", "optimizer_state", "activations", "forward_peak", "eval_peak",
                          "step_peak", "host_activations"}) {
      const auto want = ref[i].at(c).get<std::int64_t>();
      const auto got = probe.components.get(c);
      std::cout << fmt::format("[ OFFLOAD  ] {} bs{} {:<16} memgate {:>9} save_on_cpu {:>9}\n", fixture.name,
                               kBatches[i], c, got, want);
      EXPECT_EQ(got, want) << "batch " << kBatches[i] << ": " << c;
    }
  }
}

// cpu_pinned is save_on_cpu(pin_memory=True): on a CPU without CUDA a contiguous CPU copy of every tensor saved for
// backward (the frozen weights a linear saves too), made in forward, and the copies' peak is host_activations; every
// component equals PyTorch's loop's, to the byte, at batches 1 and 4.
TEST(ActivationOffloadReferenceTest, PinnedOffloadAllocatesWhatSaveOnCpuDoes) {
  testing::TempDir dir;
  expect_save_on_cpu_reference(vit_offloaded(dir, "cpu_pinned"), 0);
}

// cpu is save_on_cpu(pin_memory=False): tensor.cpu() of a CPU tensor is the tensor itself, so on the CPU nothing is
// copied (host_activations 0) and every other component is the step's without offload, as in PyTorch's loop.
TEST(ActivationOffloadReferenceTest, UnpinnedOffloadOnTheCpuAllocatesWhatSaveOnCpuDoes) {
  testing::TempDir dir;
  const auto fixture = vit_offloaded(dir, "cpu");
  expect_save_on_cpu_reference(fixture, 1);
  const auto plain = run_probe(load_fixture(testing::source_dir() + "/fixtures/models/vit_tiny_lora.yaml"), 4, kCpu);
  const auto offloaded = run_probe(fixture, 4, kCpu);
  ASSERT_FALSE(plain.oom || offloaded.oom) << plain.error << offloaded.error;
  EXPECT_FALSE(plain.components.offloads_activations);
  for (const auto& info : kComponentTable) {
    if (info.present != nullptr) continue;
    EXPECT_EQ(offloaded.components.*info.member, plain.components.*info.member) << info.name;
  }
}

// A Python fixture offloads through PyTorch's own save_on_cpu (Python's autograd engine owns the hooks in its
// process): py_vit_tiny_lora_timm with cpu_pinned, measured by memgate through its extension, equals the same model in
// PyTorch's loop inside save_on_cpu(pin_memory=True), every component and host_activations, at batches 1 and 4.
TEST(ActivationOffloadReferenceTest, APythonFixturesOffloadAllocatesWhatSaveOnCpuDoes) {
  testing::TempDir dir;
  const auto models = testing::source_dir() + "/fixtures/models/";
  auto text = read_text_file(models + "py_vit_tiny_lora_timm.yaml", "a fixture");
  text.replace(text.find("entry: python/models.py"), 23, "entry: " + models + "python/models.py");
  text.replace(text.find("  precision: fp32\n"), 18, "  precision: fp32\n  activation_offload: cpu_pinned\n");
  write_file_atomically(dir / "py_offload.yaml", text);
  expect_save_on_cpu_reference(load_fixture(dir / "py_offload.yaml"), 0);
}

// The key is part of what the model trains as (its hash), `none` is its absence (the same hash: committed baselines
// stay), and host_activations is in a probe exactly where the fixture offloads.
TEST(ActivationOffloadTest, TheComponentIsThereExactlyWhereAFixtureOffloads) {
  const auto absent = testing::fixture_from(testing::tiny_vit_yaml());
  const auto none = testing::fixture_from(testing::tiny_vit_yaml("  activation_offload: none\n"));
  const auto pinned = testing::fixture_from(testing::tiny_vit_yaml("  activation_offload: cpu_pinned\n"));
  EXPECT_EQ(absent.hash, none.hash);
  EXPECT_NE(absent.hash, pinned.hash);
  ASSERT_EQ(pinned.training.activation_offload, ActivationOffload::kCpuPinned);
  const auto a = run_probe(none, 2, kCpu);
  const auto b = run_probe(pinned, 2, kCpu);
  ASSERT_FALSE(a.oom || b.oom) << a.error << b.error;
  EXPECT_FALSE(a.components.offloads_activations);
  ASSERT_TRUE(b.components.offloads_activations);
  EXPECT_GT(b.components.host_activations, 0);
  // The copies are CPU allocations: the forward keeps them beside what it keeps anyway, so it keeps more.
  EXPECT_GT(b.components.activations, a.components.activations);
  for (const auto* c : {"params", "gradients", "optimizer_state", "eval_peak"}) {
    EXPECT_EQ(a.components.get(c), b.components.get(c)) << c;
  }
}

// The gate follows the component: recording writes host_activations into the baseline with the measured bytes, and
// checking against it passes with a verdict for it.
TEST(ActivationOffloadTest, TheBaselineAndTheGateCarryHostActivations) {
  testing::TempDir dir;
  testing::write_file(dir / "off.yaml", testing::tiny_vit_yaml("  activation_offload: cpu_pinned\n"));
  const auto memgate = fmt::format("env -u CI -u MEMGATE_STRICT {}", MEMGATE_CLI);
  const auto common =
      fmt::format("--config {} --batch-sizes 2 --device cpu --baselines {}", dir / "off.yaml", dir / "b");
  std::string out;
  ASSERT_EQ(testing::run(fmt::format("{} check {} --update-baselines 2>&1", memgate, common), &out), 0) << out;
  const auto baseline = nlohmann::json::parse(testing::read_file(dir / "b/cpu/off.json"));
  const auto& components = baseline.at("probes").at(0).at("components");
  ASSERT_TRUE(components.contains("host_activations")) << components.dump();
  const auto probe = run_probe(load_fixture(dir / "off.yaml"), 2, kCpu);
  ASSERT_FALSE(probe.oom) << probe.error;
  EXPECT_EQ(components.at("host_activations").get<std::int64_t>(), probe.components.host_activations);
  EXPECT_GT(probe.components.host_activations, 0);
  ASSERT_EQ(testing::run(fmt::format("{} check {} --exact --json {} 2>&1", memgate, common, dir / "check.json"), &out),
            0)
      << out;
  EXPECT_THAT(testing::read_file(dir / "check.json"), HasSubstr("host_activations"));
}

// An estimate on the Meta device packs as the target would (for the CPU: `cpu` keeps each tensor, `cpu_pinned` copies
// it as a CPU allocation): estimated for the CPU, every component of vit_tiny_lora with either mode, host_activations
// included, equals its measurement on the CPU at batches 1 and 4.
TEST(ActivationOffloadEstimateTest, AnEstimateForTheCpuEqualsTheMeasurementOnEveryComponent) {
  testing::TempDir dir;
  for (const auto* mode : {"cpu_pinned", "cpu"}) {
    const auto fixture = vit_offloaded(dir, mode);
    const auto measured = run_probes(fixture, kBatches, kCpu);
    const auto estimated = estimate_profile(fixture, kBatches, EstimateTarget::kCpu).probes;
    ASSERT_EQ(measured.size(), kBatches.size());
    ASSERT_EQ(estimated.size(), kBatches.size());
    for (std::size_t i = 0; i < kBatches.size(); ++i) {
      const auto& m = measured[i];
      const auto& e = estimated[i];
      ASSERT_FALSE(m.oom || e.oom) << m.error << e.error;
      ASSERT_TRUE(e.components.offloads_activations) << mode;
      for (const auto& info : kComponentTable) {
        if (!has_component(m.components, info)) continue;
        std::cout << fmt::format("[ OFFLOAD  ] {} bs{} {:<18} estimated {:>9} measured {:>9}\n", mode, kBatches[i],
                                 info.name, e.components.*info.member, m.components.*info.member);
        EXPECT_EQ(e.components.*info.member, m.components.*info.member)
            << mode << " at batch " << kBatches[i] << ": " << info.name;
      }
    }
  }
}

// Estimated for CUDA, the host copies are outside the device's count: pinned offload keeps fewer activations on the
// device than none does, its host_activations are CUDA's caching host allocator's blocks (each rounded up to a power
// of two: at least the CPU's copies' bytes), and pageable offload (tensor.cpu()) holds copies too.
TEST(ActivationOffloadEstimateTest, ForCudaTheCopiesLeaveTheDevice) {
  testing::TempDir dir;
  const auto plain = load_fixture(testing::source_dir() + "/fixtures/models/vit_tiny_lora.yaml");
  const auto none = estimate_profile(plain, {4}, EstimateTarget::kCuda).probes.at(0);
  const auto pinned = estimate_profile(vit_offloaded(dir, "cpu_pinned"), {4}, EstimateTarget::kCuda).probes.at(0);
  const auto pageable = estimate_profile(vit_offloaded(dir, "cpu"), {4}, EstimateTarget::kCuda).probes.at(0);
  const auto on_cpu = estimate_profile(vit_offloaded(dir, "cpu_pinned"), {4}, EstimateTarget::kCpu).probes.at(0);
  ASSERT_FALSE(none.oom || pinned.oom || pageable.oom || on_cpu.oom);
  std::cout << fmt::format("[ OFFLOAD  ] for CUDA at bs4: activations none {} pinned {} pageable {}; host_activations "
                           "pinned {} pageable {} (for the CPU {})\n", none.components.activations,
                           pinned.components.activations, pageable.components.activations,
                           pinned.components.host_activations, pageable.components.host_activations,
                           on_cpu.components.host_activations);
  EXPECT_LT(pinned.components.activations, none.components.activations);
  EXPECT_GE(pinned.components.host_activations, on_cpu.components.host_activations);
  EXPECT_GT(pageable.components.host_activations, 0);
  for (const auto* c : {"params", "gradients", "optimizer_state", "eval_peak"}) {
    EXPECT_EQ(pinned.components.get(c), none.components.get(c)) << c;
  }
}

}  // namespace
}  // namespace memgate
