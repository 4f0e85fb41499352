// memgate plan of a Python fixture (arch: python): its checkpointable blocks and FLOPs come from its Python process
// (plan/flops.h's count_checkpoint_flops), so the plans checkpoint its blocks as they do a zoo model's.
#include "memgate/base/files.h"
#include "memgate/estimate/estimate_context.h"
#include "memgate/gate/fixture.h"
#include "memgate/launch/estimate.h"
#include "memgate/launch/run.h"
#include "memgate/plan/flops.h"
#include "memgate/plan/plan.h"
#include "fixture_util.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace memgate {
namespace {

std::string python_fixture(const std::string& name) {
  return testing::source_dir() + "/fixtures/models/" + name + ".yaml";
}

// A Python fixture's probes need memgate's Python extension (MEMGATE_PYTHON_EXTENSION, on in the presets).
bool python_extension_built() {
  return std::filesystem::is_regular_file(std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path() /
                                          "python" / "memgate" / "_build.py");
}

// py_gpt_tiny_plain (plain PyTorch GPT-2, 2 blocks h.0 and h.1 in a ModuleList) at batch 256 needs 56 MiB reserved by
// estimate for CUDA as it is; at 40 MiB it takes a checkpointed block. The plan's change applied to the fixture
// estimates to the plan's bytes again, in the fixture's own Python process as `memgate estimate` runs it.
TEST(PythonPlanTest, APythonFixturesPlansCheckpointItsBlocks) {
  if (!python_extension_built()) GTEST_SKIP() << "memgate's Python extension is not built (MEMGATE_PYTHON_EXTENSION)";
  PlanOptions options;
  options.batch = 256;
  const auto r = plan(load_fixture(python_fixture("py_gpt_tiny_plain")), {"capacity", "40 MiB", std::int64_t{40} << 20},
                      options);
  ASSERT_TRUE(r.as_is);
  EXPECT_FALSE(r.as_is->fits);
  EXPECT_EQ(r.space, 16) << "the subsets of 2 blocks, two allocator settings, whole or saving the attention";
  ASSERT_FALSE(r.plans.empty());
  const auto& p = r.plans.front();
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(p.blocks, 2);
  ASSERT_FALSE(p.checkpointed.empty());
  for (const auto& b : p.checkpointed) EXPECT_TRUE(b == "h.0" || b == "h.1") << b;
  EXPECT_GT(p.recompute_flops, 0);
  // The change applied, its entry's file named whole (the copy is not beside fixtures/models/python/).
  auto text = apply_change(read_text_file(python_fixture("py_gpt_tiny_plain"), "a fixture"), p.change);
  const std::string entry = "python/models.py:";
  const auto at = text.find(entry);
  ASSERT_NE(at, std::string::npos);
  text.replace(at, entry.size(), testing::source_dir() + "/fixtures/models/" + entry);
  testing::TempDir dir;
  write_file_atomically(dir / "plan.yaml", text);
  const auto applied = load_fixture(dir / "plan.yaml");
  EXPECT_EQ(applied.training.checkpoint_blocks, p.checkpointed);
  const EstimateContextGuard for_gpu(estimate_context_for_gpu({}));
  const auto e = estimate_probe(applied, p.micro_batch, EstimateTarget::kCuda);
  EXPECT_EQ(e.components.step_peak, p.step_peak);
  EXPECT_EQ(e.components.step_peak_reserved, p.step_peak_reserved);
}

// The counts from the Python process: the blocks as the fixture names them, each block's forward FLOPs > 0 and the
// two alike (the same layer shapes), within the forward, within the step.
TEST(PythonPlanTest, APythonFixturesBlocksAndFlopsAreCountedInItsProcess) {
  if (!python_extension_built()) GTEST_SKIP() << "memgate's Python extension is not built (MEMGATE_PYTHON_EXTENSION)";
  const std::int64_t sizes[] = {4, 8};
  const auto fixture = load_fixture(python_fixture("py_gpt_tiny_plain"));
  const auto c = count_checkpoint_flops(fixture, sizes, EstimateTarget::kCuda);
  EXPECT_EQ(c.blocks, (std::vector<std::string>{"h.0", "h.1"}));
  ASSERT_EQ(c.flops.size(), 2U);
  for (const auto& f : c.flops) {
    ASSERT_EQ(f.per_block.size(), 2U);
    EXPECT_GT(f.per_block[0], 0);
    EXPECT_EQ(f.per_block[0], f.per_block[1]);
    EXPECT_GT(f.forward, f.per_block[0] + f.per_block[1]) << "the embeddings and the head besides";
    EXPECT_GT(f.step, 2 * f.forward);
  }
  EXPECT_EQ(c.flops[1].per_block[0], 2 * c.flops[0].per_block[0]) << "twice the batch, twice each block's matmuls";
}

// A fixture with a selective checkpointing policy of its own (`gradient_checkpointing: {save: [...]}`) is not planned:
// the search would checkpoint blocks under that policy, whose recomputed FLOPs it does not count. Refused naming the
// file and the key.
TEST(PythonPlanTest, AFixtureWithASelectivePolicyIsRefusedNamingTheKey) {
  auto text = read_text_file(python_fixture("py_gpt_tiny_plain"), "a fixture");
  const std::string entry = "python/models.py:";
  text.replace(text.find(entry), entry.size(), testing::source_dir() + "/fixtures/models/" + entry);
  text.replace(text.find("training:\n"), 10, "training:\n  gradient_checkpointing: {save: [aten.addmm]}\n");
  testing::TempDir dir;
  write_file_atomically(dir / "saving.yaml", text);
  PlanOptions options;
  options.batch = 256;
  try {
    (void)plan(load_fixture(dir / "saving.yaml"), {"capacity", "40 MiB", std::int64_t{40} << 20}, options);
    ADD_FAILURE() << "planned";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("saving.yaml: training.gradient_checkpointing.save: memgate plan does not plan from a "
                        "fixture's own selective policy"),
              std::string::npos)
        << what;
  }
}

// Selective checkpointing as a lever of a Python fixture whose blocks run an attention (issue 70): timm's ViT with
// PEFT's LoRA (py_vit_tiny_lora_timm, 4 blocks) at batch 4 needs 2.3 MiB for the CPU as it is; in 2,000,000 bytes the
// cheapest plan checkpoints blocks saving their attention's output (PyTorch's selective checkpointing,
// `gradient_checkpointing: {blocks: [...], save: [aten._scaled_dot_product_flash_attention_for_cpu]}`), recomputing
// those blocks' FLOPs less their attention's. The plan's fixture, measured on the CPU, peaks where the plan says, to
// the byte.
TEST(PythonPlanTest, ASelectivePlanSavesTheAttentionAndItsFixtureMeasuresAsPlanned) {
  if (!python_extension_built()) GTEST_SKIP() << "memgate's Python extension is not built (MEMGATE_PYTHON_EXTENSION)";
  auto text = read_text_file(python_fixture("py_vit_tiny_lora_timm"), "a fixture");
  const std::string entry = "python/models.py:";
  text.replace(text.find(entry), entry.size(), testing::source_dir() + "/fixtures/models/" + entry);
  testing::TempDir dir;
  write_file_atomically(dir / "vit.yaml", text);
  const auto fixture = load_fixture(dir / "vit.yaml");
  PlanOptions options;
  options.batch = 4;
  options.target = EstimateTarget::kCpu;
  const auto r = plan(fixture, {"capacity", "2000000 B", 2000000}, options);
  ASSERT_TRUE(r.as_is);
  EXPECT_FALSE(r.as_is->fits);
  EXPECT_EQ(r.space, 32) << "the subsets of 4 blocks, whole or saving the attention (the CPU: one allocator)";
  ASSERT_FALSE(r.plans.empty());
  const auto& p = r.plans.front();
  ASSERT_TRUE(p.fits);
  EXPECT_EQ(p.checkpoint_save, std::vector<std::string>{"aten._scaled_dot_product_flash_attention_for_cpu"});
  ASSERT_FALSE(p.checkpointed.empty());
  // Its recomputed FLOPs: those blocks' forward less their attention's, fewer than the same blocks recomputed whole.
  const std::int64_t sizes[] = {4};
  const auto counted = count_checkpoint_flops(fixture, sizes, EstimateTarget::kCpu);
  ASSERT_EQ(counted.flops.at(0).per_block_attention.size(), counted.blocks.size());
  std::int64_t whole = 0, attention = 0;
  for (std::size_t i = 0; i < counted.blocks.size(); ++i) {
    if (std::find(p.checkpointed.begin(), p.checkpointed.end(), counted.blocks[i]) == p.checkpointed.end()) continue;
    whole += counted.flops[0].per_block[i];
    attention += counted.flops[0].per_block_attention[i];
  }
  EXPECT_GT(attention, 0);
  EXPECT_EQ(p.recompute_flops, whole - attention);
  // The change applied is the fixture measured: a selective policy, its step peak the plan's to the byte.
  write_file_atomically(dir / "plan.yaml", apply_change(text, p.change));
  const auto applied = load_fixture(dir / "plan.yaml");
  ASSERT_EQ(std::get<PythonOptions>(applied.model.options).checkpoint_save, p.checkpoint_save);
  const auto measured = run_probe(applied, p.micro_batch, testing::kCpu);
  ASSERT_FALSE(measured.oom) << measured.error;
  EXPECT_EQ(measured.components.step_peak, p.step_peak);
  EXPECT_EQ(measured.components.step_peak_reserved, p.step_peak_reserved);
  EXPECT_LE(measured.components.step_peak_reserved, 2000000);
}

}  // namespace
}  // namespace memgate
