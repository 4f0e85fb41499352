// memgate advise on the CPU: for every CPU-suite fixture and two capacities, the advised batch runs under the
// counting allocator's cap and the next one up does not, as an exhaustive search finds, in a few probes.
#include "memgate/advise/advise.h"
#include "memgate/estimate/estimate_context.h"
#include "memgate/gate/fixture.h"
#include "memgate/gate/suite.h"
#include "memgate/launch/estimate.h"
#include "memgate/launch/run.h"
#include "fixture_util.h"
#include "test_util.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace memgate {
namespace {

using testing::kCpu;

std::vector<std::string> cpu_suite_fixtures() {
  std::vector<std::string> names;
  for (const auto& f : suite_fixtures(load_suite(testing::source_dir() + "/fixtures/suites/cpu.yaml",
                                                 testing::source_dir() + "/fixtures/models"))) {
    // A Python fixture's every probe is a Python process of its own (torch, transformers and PEFT imported: about
    // 5 s), and the exhaustive search below runs some 40: its advice runs the same search as the zoo's fixtures.
    if (load_fixture(f.path).model.arch == Arch::kPython) continue;
    names.push_back(f.name);
  }
  return names;
}

class AdviseTest : public ::testing::TestWithParam<std::string> {};

TEST_P(AdviseTest, AdvisesTheLargestBatchThatRunsUnderTheCap) {
  const auto fixture = load_fixture(testing::source_dir() + "/fixtures/models/" + GetParam() + ".yaml");
  // Each distinct probe (batch, cap) runs once, here and in the searches: a probe gives the same bytes each time it
  // runs (MeasureTest, check --exact), so the exhaustive search below and advise's own searches see the same outcomes
  // as if each had run its probes itself, for half the probes.
  std::map<std::pair<std::int64_t, std::int64_t>, ProbeResult> ran;
  const auto run = [&](const Workload& w, std::int64_t batch, c10::Device device, std::optional<std::int64_t> cap,
                       const ProbeOptions& options) {
    const std::pair key{batch, cap.value_or(-1)};
    if (const auto it = ran.find(key); it != ran.end()) return it->second;
    auto r = cap ? run_probe_capped(w, batch, device, *cap, options) : run_probe(w, batch, device, options);
    return ran[key] = r;
  };
  // Two capacities from the fixture's own growth: about 4 and about 13 samples above batch 1's peak.
  const auto one = run(fixture, 1, kCpu, std::nullopt, {}), two = run(fixture, 2, kCpu, std::nullopt, {});
  ASSERT_FALSE(one.oom || two.oom);
  const auto peak = [](const ProbeResult& r) {
    return std::max(r.components.step_peak_reserved, r.components.eval_peak);
  };
  const auto per_sample = std::max<std::int64_t>(peak(two) - peak(one), 1);
  // A distributed fixture's every probe starts its ranks (processes), and an fp16 fixture's convolutions have no fast
  // CPU kernels (unet_tiny_fp16_accum4's walk to batch 14 took 28 s, a quarter of these checks): their advice runs
  // the same search as any other fixture's, so they are checked at the smaller capacity only, where the exhaustive
  // walk takes a few probes. The bf16 fixture, whose convex peak misleads the first fit, keeps both.
  const bool costly = fixture.training.distributed.enabled() || fixture.training.precision == Precision::kFp16;
  const auto capacities = costly ? std::vector<double>{3.5} : std::vector<double>{3.5, 12.5};
  for (const double samples : capacities) {
    const auto usable = peak(one) + static_cast<std::int64_t>(samples * static_cast<double>(per_sample));
    const AdviceTarget target{"capacity", std::to_string(usable) + " bytes", usable};
    AdviseOptions options;
    options.run = run;
    options.from_estimates = false;  // the line through the measured peaks; estimates guide it by default (below)
    const auto advice = advise(fixture, {target}, kCpu, options);
    ASSERT_EQ(advice.targets.size(), 1U);
    const auto& t = advice.targets.front();
    AdviseOptions guided = options;
    guided.from_estimates = true;
    const auto from_estimates = advise(fixture, {target}, kCpu, guided);
    const auto& te = from_estimates.targets.front();

    // The exhaustive answer: every batch from 1 up, under the same cap, until one does not run.
    auto fits = [&](std::int64_t b) { return !run(fixture, b, kCpu, usable, {}).oom; };
    std::int64_t exhaustive = 0;
    while (fits(exhaustive + 1)) ++exhaustive;
    ASSERT_TRUE(t.batch_size.has_value()) << "batch 1 fits by construction";
    EXPECT_EQ(*t.batch_size, exhaustive) << GetParam() << " under " << usable << " bytes";
    EXPECT_TRUE(fits(*t.batch_size));
    EXPECT_FALSE(fits(*t.batch_size + 1));
    std::int64_t found = 0;
    const int classic = power_of_two_then_binary_search_trials(fits, 1 << 20, &found);
    EXPECT_EQ(found, exhaustive);
    // Two shared probes and two per target when the peak is affine; these caps sit where a convex peak (an
    // optimizer step that dominates small batches) misleads the first fit most, and still the search never takes
    // more than two probes beyond the usual doubling-then-bisection.
    EXPECT_LE(t.probes, std::max(4, classic + 2)) << GetParam();
    // Picked from estimates, the probes find the same answer, confirmed the same way.
    ASSERT_TRUE(te.batch_size.has_value());
    EXPECT_EQ(*te.batch_size, exhaustive) << GetParam() << " under " << usable << " bytes, from estimates";
    EXPECT_LE(te.probes, std::max(4, classic + 2)) << GetParam() << ", from estimates";
    std::cout << "[ ADVICE   ] " << GetParam() << " cap " << usable << " B: batch " << *t.batch_size << " (predicted "
              << t.predicted.value_or(0) << ") in " << t.probes << " probes (from estimates: predicted "
              << te.predicted.value_or(0) << ", " << te.probes << " probes); power-of-two + binary search: "
              << classic << " trials\n";
  }
}

std::string name_of_case(const ::testing::TestParamInfo<std::string>& info) { return info.param; }

INSTANTIATE_TEST_SUITE_P(Cpu, AdviseTest, ::testing::ValuesIn(cpu_suite_fixtures()), name_of_case);


TEST(AdviseAccumulationTest, ReachesTheEffectiveBatchWithMicroBatchesThatFit) {
  const auto fixture = load_fixture(testing::source_dir() + "/fixtures/models/vit_tiny_lora.yaml");
  AdviseOptions options;
  options.effective_batch = 64;
  options.variants = false;
  const auto advice = advise(fixture, {{"capacity", "8 MiB", 8 << 20}}, kCpu, options);
  const auto& t = advice.targets.front();
  ASSERT_TRUE(t.batch_size.has_value());
  ASSERT_LT(*t.batch_size, 64) << "the test needs an effective batch that does not fit at once";
  ASSERT_TRUE(t.accumulation.has_value());
  const auto& a = *t.accumulation;
  EXPECT_EQ(a.micro_batch * a.steps, 64);
  EXPECT_TRUE(a.fits);
  EXPECT_GT(a.step_peak_reserved, 0);
  EXPECT_LE(a.step_peak_reserved, 8 << 20);
  // The accumulated step holds the gradients between micro-batches: the micro-batch may be below the batch alone.
  EXPECT_LE(a.micro_batch, *t.batch_size);
}

// When the wanted batch does not fit, the variants users reach for are measured as real fixtures: each advised
// batch runs under the cap and the next one up does not; the best comes first.
TEST(AdviseVariantsTest, MeasuresWhatWouldMakeTheWantedBatchFit) {
  const auto fixture = load_fixture(testing::source_dir() + "/fixtures/models/vit_tiny_full.yaml");
  const std::int64_t usable = 6 << 20;
  AdviseOptions options;
  options.wanted_batch = 32;
  const auto advice = advise(fixture, {{"capacity", "6 MiB", usable}}, kCpu, options);
  const auto& t = advice.targets.front();
  ASSERT_LT(t.batch_size.value_or(0), 32);
  const auto variants = fit_variants(fixture);
  ASSERT_EQ(t.variants.size(), variants.size());
  std::vector<std::string> names;
  for (const auto& v : t.variants) names.push_back(v.name);
  for (const auto* expected : {"bf16 autocast", "gradient checkpointing", "frozen backbone (train the head)",
                               "LoRA rank 8 on qkv", "SGD (momentum 0.9) instead of AdamW"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  }
  for (std::size_t i = 0; i < t.variants.size(); ++i) {
    const auto& v = t.variants[i];
    if (i > 0) {
      EXPECT_LE(v.batch_size.value_or(0), t.variants[i - 1].batch_size.value_or(0)) << "best first";
    }
    const auto& w = std::find_if(variants.begin(), variants.end(), [&](const auto& p) { return p.first.name == v.name; })->second;
    ASSERT_TRUE(v.batch_size.has_value()) << v.name;
    EXPECT_FALSE(run_probe_capped(w, *v.batch_size, kCpu, usable).oom) << v.name;
    EXPECT_TRUE(run_probe_capped(w, *v.batch_size + 1, kCpu, usable).oom) << v.name;
    EXPECT_GT(v.step_seconds, 0.0) << v.name;
  }
  // Freezing the backbone keeps no gradients or optimizer state for it: it allows more than the fixture as is.
  EXPECT_GT(t.variants.front().batch_size.value_or(0), t.batch_size.value_or(0));
}

TEST(AdviseVariantsTest, NoneWhenTheWantedBatchFits) {
  const auto fixture = load_fixture(testing::source_dir() + "/fixtures/models/vit_tiny_lora.yaml");
  AdviseOptions options;
  options.wanted_batch = 8;
  const auto advice = advise(fixture, {{"capacity", "40 MiB", 40 << 20}}, kCpu, options);
  EXPECT_TRUE(advice.targets.front().variants.empty());
}

TEST(AdviseTest, ABatchOfOneThatDoesNotFitIsNone) {
  const auto fixture = load_fixture(testing::source_dir() + "/fixtures/models/vit_tiny_lora.yaml");
  const auto advice = advise(fixture, {{"capacity", "64 KiB", 64 << 10}}, kCpu);
  EXPECT_FALSE(advice.targets.front().batch_size.has_value());
  EXPECT_LE(advice.total_probes, 2) << "batches 1 and 2, nothing more";
}

// Where doubling-then-bisection needs about 2 log2(B) trials, the model needs a handful.
TEST(AdviseTest, ALargeBatchTakesAFewProbes) {
  const auto fixture = load_fixture(testing::source_dir() + "/fixtures/models/vit_tiny_lora.yaml");
  const auto advice = advise(fixture, {{"capacity", "40 MiB", 40 << 20}}, kCpu);
  const auto& t = advice.targets.front();
  ASSERT_TRUE(t.batch_size.has_value());
  EXPECT_GT(*t.batch_size, 64);
  EXPECT_FALSE(run_probe_capped(fixture, *t.batch_size, kCpu, 40 << 20).oom);
  EXPECT_TRUE(run_probe_capped(fixture, *t.batch_size + 1, kCpu, 40 << 20).oom);
  const int classic = power_of_two_then_binary_search_trials(
      [&](std::int64_t b) { return b <= *t.batch_size; }, 1 << 20);
  EXPECT_LE(t.probes, 5);
  EXPECT_GE(classic, 12);
  std::cout << "[ ADVICE   ] vit_tiny_lora cap 40 MiB: batch " << *t.batch_size << " in " << t.probes
            << " probes; power-of-two + binary search: " << classic << " trials\n";
}

// On a GPU the caching allocator holds the library workspaces (cuBLAS's) before any step, under the same cap as the
// step: a batch fits when its step and the workspaces do. Probes that behave so: 1 MiB of workspaces, 10 KiB per
// sample, under a cap of 1.5 MiB: the answer is 51. (On an H200 the search that left the workspaces out tried batches
// whose step alone fitted, ran out under the cap each time and stopped after 40 probes with no answer.)
TEST(AdviseTest, TheWorkspacesTheAllocatorHoldsCountUnderTheCap) {
  const auto fixture = load_fixture(testing::source_dir() + "/fixtures/models/vit_tiny_lora.yaml");
  constexpr std::int64_t kWorkspaces = 1 << 20, kPerSample = 10 << 10, kUsable = 3 << 19;
  int ran = 0;
  AdviseOptions options;
  options.variants = false;
  // The probes below are made up, so the real model's estimates say nothing of them: the line's search alone.
  options.from_estimates = false;
  options.run = [&](const Workload&, std::int64_t batch, c10::Device, std::optional<std::int64_t> cap,
                    const ProbeOptions&) {
    ++ran;
    ProbeResult r;
    r.batch_size = batch;
    r.library_workspace_bytes = kWorkspaces;
    r.components.step_peak_reserved = r.components.step_peak = kPerSample * batch;
    r.components.eval_peak = kPerSample * batch / 2;
    r.oom = cap && kWorkspaces + kPerSample * batch > *cap;
    return r;
  };
  const auto advice = advise(fixture, {{"capacity", "1.5 MiB", kUsable}}, kCpu, options);
  const auto& t = advice.targets.front();
  ASSERT_TRUE(t.batch_size.has_value()) << "after " << t.probes << " probes";
  EXPECT_EQ(*t.batch_size, (kUsable - kWorkspaces) / kPerSample);
  EXPECT_LE(t.probes, 4) << "two shared probes and two for the target: the peak is affine";
  EXPECT_EQ(ran, t.probes);
}

TEST(AdviseTest, PowerOfTwoThenBinarySearchCountsItsTrials) {
  std::int64_t found = 0;
  // Fits up to 37: 1 2 4 8 16 32 64(no), then 48(no) 40(no) 36 38(no) 37 -> 12 trials.
  EXPECT_EQ(power_of_two_then_binary_search_trials([](std::int64_t b) { return b <= 37; }, 1 << 20, &found), 12);
  EXPECT_EQ(found, 37);
  EXPECT_EQ(power_of_two_then_binary_search_trials([](std::int64_t) { return false; }, 1 << 20, &found), 1);
  EXPECT_EQ(found, 0);
}

// The search by estimate of a Python fixture (estimate --all-gpus) runs whole in one Python process, every estimate
// from one built module (issue 59: a ViT-B with LoRA took 66 processes, 0.6 s each after its imports): the model's
// builder runs twice (the parameter count's build, and the first estimate's, which the others replay). Every target's
// largest batch, what it needs and what the next batch needs equal the one-at-a-time search over estimates made each
// in a process of its own. (That an estimate's bytes do not depend on the fork server's gc.freeze, which the processes
// of its own here share: PythonEstimateSpeedTest, against processes with MEMGATE_GC_FREEZE=0.)
TEST(AdviseTest, TheSearchByEstimateOfAPythonFixtureEqualsOneEstimateAProcessAtATime) {
  if (!std::filesystem::is_regular_file(std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path() /
                                        "python" / "memgate" / "_build.py")) {
    GTEST_SKIP() << "memgate's Python extension is not built (MEMGATE_PYTHON_EXTENSION=OFF)";
  }
  // The timm ViT with LoRA, through a builder that notes each call.
  testing::TempDir dir;
  const auto models = testing::source_dir() + "/fixtures/models/";
  testing::write_file(dir / "noting.py", "import sys\n\nsys.path.insert(0, r'" + models + "python')\n"
                                             "from models import timm_vit_lora  # noqa: E402\n\n\n"
                                             "def build(**kwargs):\n"
                                             "    with open(r'" + (dir / "builds.txt") + "', 'a') as f:\n"
                                             "        f.write('built\\n')\n"
                                             "    return timm_vit_lora(**kwargs)\n");
  auto yaml = testing::read_file(models + "py_vit_tiny_lora_timm.yaml");
  const std::string entry = "entry: python/models.py:timm_vit_lora";
  ASSERT_NE(yaml.find(entry), std::string::npos);
  yaml.replace(yaml.find(entry), entry.size(), "entry: " + (dir / "noting.py:build"));
  testing::write_file(dir / "f.yaml", yaml);
  // Three targets: one whose usable bytes are the step's at batch 5, one at batch 12, one that every batch fits.
  const auto f = load_fixture(dir / "f.yaml");
  constexpr std::int64_t kMaxBatch = 16;
  std::map<std::int64_t, std::int64_t> alone;
  const auto required = [&](std::int64_t b) {
    if (!alone.contains(b)) alone[b] = estimate_probe(f, b, EstimateTarget::kCuda).components.step_peak_reserved;
    return alone[b];
  };
  const std::vector<AdviceTarget> targets = {{.id = "five", .name = "five", .usable_bytes = required(5)},
                                             {.id = "twelve", .name = "twelve", .usable_bytes = required(12)},
                                             {.id = "all", .name = "all", .usable_bytes = std::int64_t{1} << 50}};
  std::vector<std::int64_t> expected;
  for (const auto& t : targets) {
    std::int64_t found = 0;
    (void)power_of_two_then_binary_search_trials([&](std::int64_t b) { return required(b) <= t.usable_bytes; },
                                                 kMaxBatch, &found);
    expected.push_back(found);
    (void)required(std::max<std::int64_t>(found, 1));
    if (found < kMaxBatch) (void)required(found + 1);
  }
  ASSERT_GE(expected[0], 5);
  ASSERT_GE(expected[1], 12);
  ASSERT_EQ(expected[2], kMaxBatch);
  std::filesystem::remove(dir / "builds.txt");
  const auto fits = largest_batches_by_estimate(f, targets, std::nullopt, kMaxBatch);
  EXPECT_EQ(testing::read_file(dir / "builds.txt"), "built\nbuilt\n")
      << "the search's one process: the parameter count's build and the first estimate's";
  ASSERT_EQ(fits.fits.size(), targets.size());
  EXPECT_GT(fits.estimates, 0);
  for (std::size_t t = 0; t < targets.size(); ++t) {
    const auto& fit = fits.fits[t];
    EXPECT_EQ(fit.largest, expected[t]) << targets[t].id;
    EXPECT_EQ(fit.required_bytes, alone.at(expected[t])) << targets[t].id;
    EXPECT_EQ(fit.next_required_bytes, expected[t] < kMaxBatch ? alone.at(expected[t] + 1) : 0) << targets[t].id;
    EXPECT_EQ(fit.capped, expected[t] == kMaxBatch) << targets[t].id;
  }
}

// A batch whose step CUDA cannot run at all bounds the search (issue 67): an audio front end ([B, 65536, 1] into a
// Linear(1, 2), a .sum() loss) sums its bias gradient over B x 65536 rows of an expanded gradient, which PyTorch 2.11's
// reduction cannot split for 32-bit indexing from batch 32768 (2^32 elements). The search of a GPU that every smaller
// batch fits answers 32767, says why the next cannot run, and claims no bytes for it; it ran to the end, where the
// estimate's probe was killed by signal 11 before and an error stopped the whole search after.
TEST(AdviseTest, ABatchThatCannotRunOnCudaBoundsTheSearchAndSaysWhy) {
  if (!std::filesystem::is_regular_file(std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path() /
                                        "python" / "memgate" / "_build.py")) {
    GTEST_SKIP() << "memgate's Python extension is not built (MEMGATE_PYTHON_EXTENSION=OFF)";
  }
  testing::TempDir dir;
  testing::write_file(dir / "a.py", "from torch import nn\n\n\ndef audio_front_end():\n    return nn.Linear(1, 2)\n");
  testing::write_file(dir / "f.yaml", "model:\n  arch: python\n  entry: a.py:audio_front_end\n"
                                      "  inputs:\n    - {shape: [B, 65536, 1]}\n  task: sum\n"
                                      "training:\n  optimizer: adamw\nbatch_sizes: [2]\n");
  const auto f = load_fixture(dir / "f.yaml");
  const auto at = [&](std::int64_t b) { return estimate_probe(f, b, EstimateTarget::kCuda).components; };
  const auto last = at(32767);  // runs: 2^32 - 65536 elements split in two pieces for 32-bit indexing
  try {
    (void)at(32768);
    FAIL() << "batch 32768's step was estimated; CUDA's reduction cannot run it";
  } catch (const std::exception& e) {
    EXPECT_TRUE(cannot_run_on_cuda(e)) << e.what();
  }
  const std::vector<AdviceTarget> targets = {
      {.id = "huge", .name = "huge", .usable_bytes = std::int64_t{1} << 50},
      {.id = "small", .name = "small", .usable_bytes = at(100).step_peak_reserved}};
  const auto fits = largest_batches_by_estimate(f, targets, std::nullopt, std::int64_t{1} << 16);
  ASSERT_EQ(fits.fits.size(), 2U);
  const auto& huge = fits.fits[0];
  EXPECT_EQ(huge.largest, 32767);
  EXPECT_FALSE(huge.capped);
  EXPECT_EQ(huge.required_bytes, last.step_peak_reserved);
  EXPECT_EQ(huge.next_required_bytes, 0);
  EXPECT_NE(huge.next_cannot_run.find("has 4294967296 elements, more than 32-bit indexing covers"), std::string::npos)
      << huge.next_cannot_run;
  // A GPU whose memory ends first is answered by its bytes, as ever.
  const auto& small = fits.fits[1];
  EXPECT_GE(small.largest, 100);
  EXPECT_LT(small.largest, 32767);
  EXPECT_TRUE(small.next_cannot_run.empty());
  EXPECT_GT(small.next_required_bytes, targets[1].usable_bytes);
  const auto table = format_estimated_fits(fits, std::nullopt);
  EXPECT_NE(table.find("cannot run: batch 32768 cannot run on CUDA on any GPU, whatever its memory"), std::string::npos)
      << table;
  const auto json = estimated_fits_to_json(fits);
  EXPECT_EQ(json.at(0).at("next_cannot_run").get<std::string>(), huge.next_cannot_run);
  EXPECT_FALSE(json.at(1).contains("next_cannot_run"));
}

// Each GPU as itself (issue 59): CUDA's reduction staging depends on the GPU's SMs and threads per SM, and the
// two-stage conv segmentation net's decoder stages its bias gradients' sums through it (channels last, few outputs, many
// inputs each). An estimate for a T4 (40 SMs x 1,024 threads) stages less than one for an H100 (132 x 2,048), and the
// search answers each GPU target with its own GPU's estimates: what it reports a batch needs is that GPU's.
TEST(AdviseTest, EachGpuTargetIsAnsweredWithItsOwnGpusReductionStaging) {
  const auto f = load_fixture(testing::source_dir() + "/fixtures/models/camo_seg_stage1.yaml");
  const CudaReduceDevice t4{40, 1024};
  const auto h100_at = [&](std::int64_t b) { return estimate_probe(f, b, EstimateTarget::kCuda).components; };
  const auto t4_at = [&](std::int64_t b) {
    const EstimateContextGuard scoped(estimate_context_for_gpu(t4));
    return estimate_probe(f, b, EstimateTarget::kCuda).components;
  };
  const auto h100 = h100_at(4), on_t4 = t4_at(4);
  EXPECT_LT(on_t4.step_peak_reserved, h100.step_peak_reserved);
  EXPECT_LT(on_t4.step_peak, h100.step_peak);
  EXPECT_EQ(on_t4.params, h100.params);
  EXPECT_EQ(on_t4.activations, h100.activations);  // what the forward keeps: no reduction's staging
  // Two targets of the same usable bytes and workspaces, a T4's SMs and the defaults': the bytes of the H100's step at
  // batch 6. Each answer is its own GPU's: its largest batch fits on its GPU's estimate and the next does not.
  const auto usable = h100_at(6).step_peak_reserved;
  const std::vector<AdviceTarget> targets = {
      {.id = "h100", .name = "h100", .usable_bytes = usable, .multiprocessors = 132,
       .max_threads_per_multiprocessor = 2048},
      {.id = "t4", .name = "t4", .usable_bytes = usable, .multiprocessors = 40, .max_threads_per_multiprocessor = 1024}};
  const auto fits = largest_batches_by_estimate(f, targets, std::nullopt, 64);
  ASSERT_EQ(fits.fits.size(), 2U);
  const auto& h = fits.fits[0];
  const auto& t = fits.fits[1];
  EXPECT_GE(h.largest, 6);
  EXPECT_GE(t.largest, h.largest);
  EXPECT_EQ(h.required_bytes, h100_at(h.largest).step_peak_reserved);
  EXPECT_EQ(h.next_required_bytes, h100_at(h.largest + 1).step_peak_reserved);
  EXPECT_EQ(t.required_bytes, t4_at(t.largest).step_peak_reserved);
  EXPECT_EQ(t.next_required_bytes, t4_at(t.largest + 1).step_peak_reserved);
  EXPECT_LE(t.required_bytes, usable);
  EXPECT_GT(t.next_required_bytes, usable);
  EXPECT_LT(t.required_bytes, h100_at(t.largest).step_peak_reserved);
}

// The search guesses where each GPU's step reaches its usable bytes on the line through the estimates around it, and
// estimates the guess and the batch after it (issue 59: the doubling and bisection took 55 estimates for RETFound
// ViT-L with LoRA over the nine GPU fixtures). Every GPU's answer, on its own GPU's estimates, fits and its next batch
// does not, as the doubling and bisection's (the same answer where the step's bytes grow with the batch: where cuDNN's
// plans make them dip, each may find another such batch), with fewer estimates than that search needs.
class SearchByEstimateTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SearchByEstimateTest, GuessesFromTheLineAndAnswersAsTheDoublingSearch) {
  const auto f = load_fixture(testing::source_dir() + "/fixtures/models/" + GetParam() + ".yaml");
  std::vector<AdviceTarget> targets;
  for (const auto& gpu : load_gpus(testing::source_dir() + "/fixtures/gpus")) targets.push_back(target_of(gpu));
  ASSERT_GE(targets.size(), 5U);
  constexpr std::int64_t kMaxBatch = 4096;
  const auto fits = largest_batches_by_estimate(f, targets, std::nullopt, kMaxBatch);
  ASSERT_EQ(fits.fits.size(), targets.size());
  std::map<std::pair<int, int>, std::map<std::int64_t, std::int64_t>> alone;
  std::set<std::pair<std::pair<int, int>, std::int64_t>> doubling_estimates;
  for (std::size_t t = 0; t < targets.size(); ++t) {
    const auto& target = targets[t];
    const std::pair<int, int> gpu{target.multiprocessors, target.max_threads_per_multiprocessor};
    const auto needs = [&](std::int64_t b) {
      if (!alone[gpu].contains(b)) {
        const EstimateContextGuard scoped(estimate_context_for_gpu(CudaReduceDevice{gpu.first, gpu.second}));
        alone[gpu][b] = estimate_probe(f, b, EstimateTarget::kCuda).components.step_peak_reserved;
      }
      return alone[gpu][b] + target.library_workspace_bytes;
    };
    std::int64_t found = 0;
    (void)power_of_two_then_binary_search_trials(
        [&](std::int64_t b) {
          doubling_estimates.insert({gpu, b});
          return needs(b) <= target.usable_bytes;
        },
        kMaxBatch, &found);
    const auto& fit = fits.fits[t];
    if (fit.largest != found) {
      // The step's bytes are not monotone in the batch there (cuDNN's plans, and their workspaces, change with it):
      // each search found a batch that fits whose next does not, as both must.
      EXPECT_LE(needs(found), target.usable_bytes) << target.id;
      EXPECT_GT(needs(found + 1), target.usable_bytes) << target.id;
      std::cout << fmt::format("[ SEARCH   ] {}: {} (the doubling search: {}; both fit, and neither's next)\n",
                               target.id, fit.largest, found);
    }
    if (fit.largest == 0) {
      EXPECT_GT(needs(1), target.usable_bytes) << target.id;
      continue;
    }
    EXPECT_EQ(fit.required_bytes, needs(fit.largest)) << target.id;
    EXPECT_LE(fit.required_bytes, target.usable_bytes) << target.id;
    EXPECT_EQ(fit.next_required_bytes, needs(fit.largest + 1)) << target.id;
    EXPECT_GT(fit.next_required_bytes, target.usable_bytes) << target.id;
  }
  std::cout << fmt::format("[ SEARCH   ] {} GPUs: {} estimates; the doubling and bisection: {}\n", targets.size(),
                           fits.estimates, doubling_estimates.size());
  EXPECT_LT(fits.estimates, static_cast<std::int64_t>(doubling_estimates.size()));
}

INSTANTIATE_TEST_SUITE_P(Zoo, SearchByEstimateTest,
                         ::testing::Values("retfound_large_lora", "gpt2_small", "resnet18_fewshot", "camo_seg_stage2",
                                           "lisa_7b_bf16", "vessel_unet_1024_fp16"));

}  // namespace
}  // namespace memgate
