// The gate tested by mutation: realistic regressions injected through model and training options of the CPU
// suite's own fixtures (never by editing a baseline). The baseline is recorded from the unmutated fixture by the
// update path; the mutated model is measured and judged as the same fixture (a code change under an unchanged
// YAML file). Each mutation must fail exactly the components it grows, pass (stale, with a notice) the ones it
// shrinks, and leave the others ok.
#include "memgate/base/files.h"
#include "memgate/gate/baseline.h"
#include "memgate/gate/fixture.h"
#include "memgate/gate/suite.h"
#include "memgate/gate/verdict.h"
#include "memgate/measure/probe.h"
#include "memgate/models/vit.h"
#include "memgate/launch/run.h"
#include "test_util.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <ostream>
#include <set>
#include <string>

namespace memgate {
namespace {

/// One injected regression: what it does to which fixture, and the components it must move.
struct Mutation {
  std::string name;
  std::string fixture;           ///< a CPU-suite fixture (fixtures/models/<name>.yaml)
  std::int64_t batch_size = 0;   ///< judged at this batch size
  std::function<void(Fixture&, std::int64_t& batch_size)> apply;
  std::set<std::string> grows;   ///< components that must fail (regression)
  std::set<std::string> shrinks; ///< components that must pass with a stale notice
  /// A distributed fixture's ranks reload it from its file: such a mutation edits the file's text instead, and the
  /// component names are each rank's (rank0_gradients, ...). Empty for the others.
  std::function<std::string(std::string)> edit_yaml;
};

void PrintTo(const Mutation& m, std::ostream* os) { *os << m.name; }

VitOptions& vit(Fixture& f) { return std::get<VitOptions>(f.model.options); }

const std::set<std::string> kActivationsAndPeaks = {"activations", "forward_peak", "step_peak", "step_peak_reserved"};

std::vector<Mutation> mutations() {
  return {
      // A dropout after each block's attention projection keeps one mask per block for backward (train only).
      {"extra_kept_tensor_per_block", "vit_tiny_lora", 4,
       [](Fixture& f, std::int64_t&) { vit(f).proj_drop = 0.1; }, kActivationsAndPeaks, {}, {}},
      // Unfused attention saves the n x n softmax where SDPA saves its output and log-sum-exp. In eval the
      // transient score matrix stays below the MLP's hidden activation, so the eval peak does not move.
      {"math_attention_instead_of_sdpa", "vit_tiny_lora", 4,
       [](Fixture& f, std::int64_t&) { vit(f).attention = VitOptions::Attention::kMath; }, kActivationsAndPeaks, {}, {}},
      // An adapter on the attention projection too: more trainable parameters, their gradients and Adam moments.
      {"lora_target_added", "vit_tiny_lora", 4,
       [](Fixture& f, std::int64_t&) { vit(f).lora.targets.push_back("proj"); },
       {"params", "gradients", "optimizer_state", "activations", "forward_peak", "eval_peak", "step_peak",
        "step_peak_reserved"},
       {}, {}},
      // Every block's activations kept for backward instead of recomputed.
      {"checkpointing_off", "segnet_tiny_ckpt", 2,
       [](Fixture& f, std::int64_t&) { f.training.gradient_checkpointing = false; }, kActivationsAndPeaks, {}, {}},
      // fp32 where the fixture autocasts to bf16: saved activations twice the size, but no bf16 copies of the
      // weights. At batch 8 the activations outweigh the copies in training (as in the full-size model); in eval,
      // which saves nothing, im2col's column buffers (LibTorch's own convolutions) double too and outweigh them.
      {"fp32_instead_of_bf16", "resnet_tiny_fewshot_amp_accum", 8,
       [](Fixture& f, std::int64_t&) { f.training.precision = Precision::kFp32; },
       {"activations", "forward_peak", "eval_peak", "step_peak", "step_peak_reserved"}, {}, {}},
      // The same samples per step in one micro-batch instead of four.
      {"accumulation_off", "unet_tiny_fp16_accum4", 1,
       [](Fixture& f, std::int64_t& batch_size) {
         batch_size *= f.training.accumulation_steps;
         f.training.accumulation_steps = 1;
       },
       {"activations", "forward_peak", "eval_peak", "step_peak", "step_peak_reserved"}, {}, {}},
      // DDP's gradients as their own tensors again, beside the buckets: a second copy of every gradient on every
      // rank (measured by 2 rank processes over Gloo).
      {"ddp_gradients_not_bucket_views", "vit_tiny_ddp", 2, [](Fixture&, std::int64_t&) {},
       {"rank0_gradients", "rank1_gradients"}, {},
       [](std::string yaml) {
         const std::string from = "gradient_as_bucket_view: true";
         const auto at = yaml.find(from);
         if (at != std::string::npos) yaml.replace(at, from.size(), "gradient_as_bucket_view: false");
         return yaml;
       }},
      // FSDP prefetching two units in backward instead of one (set_modules_to_backward_prefetch): one more block's
      // all-gather buffer at the backward's peak, on every rank.
      {"fsdp_prefetch_two_units", "vit_tiny_fsdp", 2, [](Fixture&, std::int64_t&) {},
       {"rank0_step_peak", "rank0_step_peak_reserved", "rank1_step_peak", "rank1_step_peak_reserved"}, {},
       [](std::string yaml) {
         const std::string from = "    units: blocks\n";
         const auto at = yaml.find(from);
         if (at != std::string::npos) yaml.insert(at + from.size(), "    backward_prefetch: 2\n");
         return yaml;
       }},
  };
}

class MutationTest : public ::testing::TestWithParam<Mutation> {};

TEST_P(MutationTest, FailsExactlyWhereMemoryGrew) {
  const auto& m = GetParam();
  testing::TempDir dir;
  const auto fixture = load_fixture(testing::source_dir() + "/fixtures/models/" + m.fixture + ".yaml");
  const c10::Device cpu(c10::DeviceType::CPU);
  const auto info = describe_probe_device(cpu, fixture);
  const auto path = baseline_path(dir / "baselines", info.slug, fixture.name);
  ASSERT_TRUE(update_baseline(path, fixture, info, {run_probe(fixture, m.batch_size, cpu)}, "test"));
  const auto baseline = load_baseline(path);

  auto mutated = fixture;
  auto batch_size = m.batch_size;
  if (m.edit_yaml) {
    const auto yaml = read_text_file(fixture.source, "a fixture");
    const auto edited = m.edit_yaml(yaml);
    ASSERT_NE(edited, yaml) << m.name << ": the edit changed nothing";
    const auto file = dir / (m.fixture + ".yaml");
    write_file_atomically(file, edited);
    mutated = load_fixture(file);
  }
  m.apply(mutated, batch_size);
  auto probe = run_probe(mutated, batch_size, cpu);
  ASSERT_FALSE(probe.oom) << probe.error;
  probe.batch_size = m.batch_size;  // judged against the unmutated batch's baseline

  std::vector<std::string> components;
  const auto ranks = fixture.training.distributed.enabled() ? fixture.training.distributed.world_size : 0;
  for (const auto& c : kComponentTable) {
    if (!keeps_component(fixture.training, c)) continue;
    if (ranks == 0) components.emplace_back(c.name);
    for (std::int64_t r = 0; r < ranks; ++r) components.push_back(rank_component_name(static_cast<int>(r), c.name));
  }
  for (const auto& component : components) {
    const auto v = evaluate_component(fixture, probe, component, &baseline, path, info);
    const auto expected = m.grows.contains(component)     ? Status::kRegression
                          : m.shrinks.contains(component) ? Status::kStale
                                                          : Status::kOk;
    EXPECT_EQ(name_of(kStatusNames, v.status), name_of(kStatusNames, expected))
        << m.name << ": " << component << " " << *v.baseline << " -> " << v.measured.value_or(-1) << "\n"
        << v.message;
  }
}

std::string mutation_name(const ::testing::TestParamInfo<Mutation>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(Cpu, MutationTest, ::testing::ValuesIn(mutations()), mutation_name);

}  // namespace
}  // namespace memgate
