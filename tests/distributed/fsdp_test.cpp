// FSDP2 per rank: real rank processes over Gloo, each keeping padded dim-0 shards of the parameters, their gradients
// and their AdamW state, against the model's own parameter shapes; reshard_after_forward and the prefetch where the
// memory goes; and the Meta device's estimate against the measurement, rank by rank, at 2 and 4 ranks.
#include "memgate/base/files.h"
#include "memgate/gate/fixture.h"
#include "memgate/base/error.h"
#include "memgate/distributed/process_group.h"
#include "memgate/estimate/meta_kernels.h"
#include "memgate/launch/estimate.h"
#include "memgate/launch/ranks.h"
#include "memgate/backend/memory_snapshot.h"
#include "memgate/backend/meta_allocator.h"
#include "memgate/measure/probe.h"
#include "memgate/models/checkpoint.h"
#include "memgate/models/registry.h"
#include "memgate/models/zoo.h"
#include "memgate/allocator/replay.h"
#include "memgate/allocator/snapshot_pickle.h"
#include "fixture_util.h"
#include "test_util.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <filesystem>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <tuple>

namespace memgate {
namespace {

using testing::kCpu;

// The CPU suite's FSDP twin with `world_size` ranks, `extra` keys under `distributed` and `training_extra` under
// `training`, written beside the test.
Fixture fsdp_twin(const testing::TempDir& dir, std::int64_t world_size, const std::string& extra = "",
                  const std::string& training_extra = "") {
  auto yaml = read_text_file(testing::source_dir() + "/fixtures/models/vit_tiny_fsdp.yaml", "a fixture");
  const std::string from = "world_size: 2";
  yaml.replace(yaml.find(from), from.size(), "world_size: " + std::to_string(world_size));
  const std::string units = "    units: blocks\n";
  if (!extra.empty()) yaml.insert(yaml.find(units) + units.size(), extra);
  const std::string trainable = "  trainable: all\n";
  if (!training_extra.empty()) yaml.insert(yaml.find(trainable) + trainable.size(), training_extra);
  const auto path = dir / "vit_tiny_fsdp.yaml";
  write_file_atomically(path, yaml);
  return load_fixture(path);
}

// What sharding keeps of the model's parameters on `rank` of `world`, from their shapes (torch.chunk on dim 0).
struct Shards {
  std::int64_t padded_bytes = 0;    ///< each parameter's shard padded to the first chunk's rows
  std::int64_t unpadded_bytes = 0;  ///< the rows this rank owns
  std::int64_t count = 0;           ///< parameters
  std::int64_t block_unsharded_bytes = 0;  ///< the blocks' padded unsharded parameters (N x the padded shards)
};

Shards shards_of(const Fixture& fixture, std::int64_t rank, std::int64_t world) {
  const auto model = build_model(fixture.model, c10::Device(c10::DeviceType::Meta));
  Shards s;
  for (const auto& named : model->module().named_parameters()) {
    const auto& p = named.value();
    const auto rows = p.size(0);
    const auto rest = p.numel() / rows;
    const auto chunk = (rows + world - 1) / world;
    const auto own = std::clamp(rows - rank * chunk, std::int64_t{0}, chunk);
    s.padded_bytes += chunk * rest * 4;
    s.unpadded_bytes += own * rest * 4;
    s.count += 1;
    if (named.key().starts_with("blocks.")) s.block_unsharded_bytes += world * chunk * rest * 4;
  }
  return s;
}

TEST(FsdpTest, EachRankKeepsPaddedShardsOfParametersGradientsAndOptimizerState) {
  testing::TempDir dir;
  const auto fixture = fsdp_twin(dir, 2);
  const auto probe = run_probe(fixture, 2, kCpu);
  ASSERT_FALSE(probe.oom) << probe.error;
  ASSERT_EQ(probe.ranks.size(), 2U);
  const auto full_bytes = workload_param_counts(fixture).trainable * 4;  // fp32
  for (const auto& r : probe.ranks) {
    const auto s = shards_of(fixture, r.rank, 2);
    const auto at = fmt::format("rank {}", r.rank);
    EXPECT_EQ(r.components.params, s.padded_bytes) << at << ": padded dim-0 shards, equal on every rank";
    EXPECT_EQ(r.components.gradients, s.padded_bytes) << at << ": views into the reduce-scatter outputs";
    // AdamW's two moments of the rows the rank owns (not the padding), and a step count per parameter.
    EXPECT_EQ(r.components.optimizer_state, 2 * s.unpadded_bytes + 4 * s.count) << at;
    EXPECT_LT(r.components.params, full_bytes) << at << ": a shard, not a replica";
    EXPECT_EQ(r.comm_buffer_bytes, 0) << at << ": FSDP keeps no communication buffer between steps";
  }
  // cls_token and pos_embed have one row: rank 0 owns it, rank 1 an empty view of its padding.
  EXPECT_GT(probe.ranks[0].components.optimizer_state, probe.ranks[1].components.optimizer_state);
  EXPECT_EQ(probe.components, max_over_ranks(probe.ranks));
  // All the ranks' shards together: the model, plus the padding of the rows that do not divide by 2.
  EXPECT_GE(probe.ranks[0].components.params + probe.ranks[1].components.params, full_bytes);
}

// What FSDP's units hook: the modules each forward runs through run_block.
class RecordingHook final : public BlockHook {
 public:
  torch::Tensor run(const torch::nn::Module& block, const torch::Tensor& x, const BlockFn& forward) override {
    ran.insert(&block);
    return forward(x);
  }
  std::set<const torch::nn::Module*> ran;
};

// `units: blocks` wraps modules the model's forward runs one by one: a unit whose module never runs through the hook
// keeps its parameters freed into its forward (the segmentation net's stem and the UNet's levels did: a segfault in a
// rank). Every zoo fixture, on the Meta device.
TEST(FsdpTest, EachZooModelsUnitsAreTheBlocksItsForwardRunsOneByOne) {
  register_meta_kernels();  // for the CPU: no estimate context is set
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(testing::source_dir() + "/fixtures/models")) {
    if (entry.path().extension() != ".yaml") continue;
    const auto fixture = load_fixture(entry.path().string());
    if (fixture.model.arch == Arch::kPython || fixture.model.arch == Arch::kTorchScript) continue;
    SCOPED_TRACE(entry.path().filename().string());
    const auto model = build_model(fixture.model, c10::Device(c10::DeviceType::Meta));
    std::map<std::string, const torch::nn::Module*> units;
    const auto modules = model->module().named_modules();
    for (const auto& prefix : model->unit_prefixes()) {
      const auto* found = modules.find(prefix.substr(0, prefix.size() - 1));
      ASSERT_NE(found, nullptr) << prefix << " names no module";
      units[prefix] = found->get();
    }
    RecordingHook hook;
    {
      const BlockHookScope scope(&hook);
      torch::NoGradGuard no_grad;
      (void)model->loss(model->make_batch(1));
    }
    EXPECT_FALSE(units.empty());
    // Each unit runs through the hook. (Blocks may run through it without being units: a multimodal model's vision
    // encoder, which stays in the root.)
    for (const auto& [prefix, module] : units) EXPECT_TRUE(hook.ran.contains(module)) << prefix << " never ran as a unit";
    ++checked;
  }
  EXPECT_GE(checked, 20);
}

// The conv twins shard under FSDP with units: blocks: each rank keeps padded shards of every parameter and trains.
TEST(FsdpTest, TheConvTwinsShardTheirBlocks) {
  for (const auto* name : {"segnet_tiny_stage2", "unet_tiny"}) {
    SCOPED_TRACE(name);
    testing::TempDir dir;
    auto yaml = read_text_file(testing::source_dir() + "/fixtures/models/" + std::string(name) + ".yaml", "a fixture");
    const std::string trainable = "  trainable: all\n";
    yaml.insert(yaml.find(trainable) + trainable.size(),
                "  distributed:\n    strategy: fsdp\n    world_size: 2\n    units: blocks\n");
    write_file_atomically(dir / "twin.yaml", yaml);
    const auto fixture = load_fixture(dir / "twin.yaml");
    const auto probe = run_probe(fixture, 1, kCpu);
    ASSERT_FALSE(probe.oom) << probe.error;
    ASSERT_EQ(probe.ranks.size(), 2U);
    // Buffers (batch norm's running statistics) are not sharded: every rank keeps them whole.
    std::int64_t buffer_bytes = 0;
    for (const auto& b : build_model(fixture.model, c10::Device(c10::DeviceType::Meta))->module().buffers()) {
      buffer_bytes += b.numel() * static_cast<std::int64_t>(b.element_size());
    }
    for (const auto& r : probe.ranks) {
      const auto s = shards_of(fixture, r.rank, 2);
      EXPECT_EQ(r.components.params, s.padded_bytes + buffer_bytes) << "rank " << r.rank;
      EXPECT_EQ(r.components.gradients, s.padded_bytes) << "rank " << r.rank;
    }
  }
}

TEST(FsdpTest, WithoutReshardAfterForwardEveryBlockStaysGatheredUntilBackward) {
  testing::TempDir dir;
  const auto resharded = run_probe(fsdp_twin(dir, 2), 1, kCpu);
  const auto kept = run_probe(fsdp_twin(dir, 2, "    reshard_after_forward: false\n"), 1, kCpu);
  const auto all = run_probe(fsdp_twin(dir, 2, "    reshard_after_forward: true\n"), 1, kCpu);
  ASSERT_FALSE(resharded.oom || kept.oom || all.oom);
  const auto fixture = fsdp_twin(dir, 2);
  const auto s = shards_of(fixture, 0, 2);
  for (std::size_t r = 0; r < 2; ++r) {
    // The forward keeps every block's padded unsharded parameters instead of freeing each after its forward.
    EXPECT_EQ(kept.ranks[r].components.activations - resharded.ranks[r].components.activations,
              s.block_unsharded_bytes) << "rank " << r;
    // true reshards the root too (its parameters are all-gathered again when backward starts): less held after
    // forward than FSDP2's default, which keeps the root gathered.
    EXPECT_LT(all.ranks[r].components.activations, resharded.ranks[r].components.activations) << "rank " << r;
    EXPECT_EQ(kept.ranks[r].components.params, resharded.ranks[r].components.params);
  }
}

// An integer reshard_after_forward k between 1 and N: after its forward each unit (the root too, given the value)
// keeps this rank's 1/k of its padded unsharded parameters, cloned, instead of nothing (true) or all of them (false),
// and all-gathers them back in backward from its group of k ranks.
TEST(FsdpTest, ReshardingToAGroupOfTwoKeepsHalfTheUnshardedParametersUntilBackward) {
  testing::TempDir dir;
  const auto full = run_probe(fsdp_twin(dir, 4, "    reshard_after_forward: true\n"), 1, kCpu);
  const auto pairs = run_probe(fsdp_twin(dir, 4, "    reshard_after_forward: 2\n"), 1, kCpu);
  const auto kept = run_probe(fsdp_twin(dir, 4, "    reshard_after_forward: false\n"), 1, kCpu);
  ASSERT_FALSE(full.oom || pairs.oom || kept.oom);
  ASSERT_EQ(pairs.ranks.size(), 4U);
  const auto unsharded = 4 * shards_of(fsdp_twin(dir, 4), 0, 4).padded_bytes;  // every unit, padded
  for (std::size_t r = 0; r < 4; ++r) {
    const auto at = fmt::format("rank {}", r);
    EXPECT_EQ(pairs.ranks[r].components.activations - full.ranks[r].components.activations, unsharded / 2) << at;
    EXPECT_EQ(kept.ranks[r].components.activations - full.ranks[r].components.activations, unsharded) << at;
    EXPECT_EQ(pairs.ranks[r].components.params, full.ranks[r].components.params) << at;
    EXPECT_EQ(pairs.ranks[r].components.gradients, full.ranks[r].components.gradients) << at;
  }
}

// The post-forward groups are consecutive ranks, as FSDP2's mesh.view(-1, k) makes them; on the Meta device each
// rank's group is a Meta group of its own, and a size that does not divide the world is refused.
TEST(ConsecutiveSubgroupTest, GroupsConsecutiveRanks) {
  for (const auto& [rank, size, sub_rank] : {std::tuple{0, 2, 0}, {1, 2, 1}, {2, 2, 0}, {3, 2, 1}, {3, 4, 3}, {2, 1, 0}}) {
    const auto sub = consecutive_subgroup(meta_process_group(rank, 4), size);
    EXPECT_EQ(sub.rank, sub_rank) << "rank " << rank << " in groups of " << size;
    EXPECT_EQ(sub.world_size, size);
    EXPECT_EQ(sub.group->getRank(), sub_rank);
    EXPECT_EQ(sub.group->getSize(), size);
  }
  EXPECT_THROW((void)consecutive_subgroup(meta_process_group(0, 4), 3), Error);
}

// FSDP2's MixedPrecisionPolicy from training.precision: the shards, their gradients and the optimizer's state stay
// fp32, while what is gathered is bf16: a forward that keeps every block gathered holds half the bytes it holds in
// fp32. Reduce-scattering in fp32 (reduce_dtype) changes what backward holds, not what the step keeps.
TEST(FsdpTest, MixedPrecisionGathersInTheParamDtypeAndKeepsTheShardsInFp32) {
  testing::TempDir dir;
  const std::string kept = "    reshard_after_forward: false\n";
  const auto fp32 = run_probe(fsdp_twin(dir, 2), 2, kCpu);
  const auto bf16 = run_probe(fsdp_twin(dir, 2, "", "  precision: bf16\n"), 2, kCpu);
  const auto bf16_fp32_reduce = run_probe(fsdp_twin(dir, 2, "    reduce_dtype: fp32\n", "  precision: bf16\n"), 2, kCpu);
  const auto fp32_kept = run_probe(fsdp_twin(dir, 2, kept), 2, kCpu);
  const auto bf16_kept = run_probe(fsdp_twin(dir, 2, kept, "  precision: bf16\n"), 2, kCpu);
  for (const auto* p : {&fp32, &bf16, &bf16_fp32_reduce, &fp32_kept, &bf16_kept}) ASSERT_FALSE(p->oom) << p->error;
  const auto s = shards_of(fsdp_twin(dir, 2), 0, 2);
  for (std::size_t r = 0; r < 2; ++r) {
    const auto at = fmt::format("rank {}", r);
    for (const auto* p : {&bf16, &bf16_fp32_reduce}) {
      EXPECT_EQ(p->ranks[r].components.params, fp32.ranks[r].components.params) << at << ": fp32 shards";
      EXPECT_EQ(p->ranks[r].components.gradients, fp32.ranks[r].components.gradients) << at << ": fp32 sharded grads";
      EXPECT_EQ(p->ranks[r].components.optimizer_state, fp32.ranks[r].components.optimizer_state) << at;
      EXPECT_LT(p->ranks[r].components.activations, fp32.ranks[r].components.activations) << at;
    }
    // Every block's unsharded parameters, held from its forward to its backward: bf16, half of fp32's.
    EXPECT_EQ(fp32_kept.ranks[r].components.activations - fp32.ranks[r].components.activations,
              s.block_unsharded_bytes) << at;
    EXPECT_EQ(bf16_kept.ranks[r].components.activations - bf16.ranks[r].components.activations,
              s.block_unsharded_bytes / 2) << at;
    // The reduce-scatter input in fp32 instead of bf16: backward holds more.
    EXPECT_GT(bf16_fp32_reduce.ranks[r].components.step_peak, bf16.ranks[r].components.step_peak) << at;
  }
}

// The bounds PyTorch holds FSDP2 to (test/distributed/_composable/fsdp/test_fully_shard_memory.py,
// test_fully_shard_training_memory, without CPU offload or optimizer in backward), on its model: a Transformer of 3
// blocks of 768 (vocabulary 32, no weight tying), every block then the root wrapped with reshard_after_forward
// true or false, one sequence of 4 tokens, Adam without foreach, 2 ranks. Its bounds count from before the model was
// built, in its first iteration; a probe reads the steady state, where the optimizer's state is there before the
// step begins, so the forward's peak is params + forward_peak and the backward's is step_peak - optimizer_state.
class FsdpBoundsTest : public ::testing::TestWithParam<bool> {};

TEST_P(FsdpBoundsTest, PeaksStayWithinTheBoundsPyTorchAsserts) {
  const bool reshard = GetParam();
  testing::TempDir dir;
  const auto path = dir / "transformer_fsdp.yaml";
  write_file_atomically(path, fmt::format(R"(model:
  arch: gpt
  vocab_size: 32
  seq_len: 4
  n_layer: 3
  n_embd: 768
  n_head: 12
  mlp: gelu
  norm: layernorm
  position: learned
  bias: true
  tied_embeddings: false
training:
  optimizer: adamw
  optimizer_impl: for_loop
  trainable: all
  distributed:
    strategy: fsdp
    world_size: 2
    reshard_after_forward: {}
batch_sizes: [1]
)", reshard));
  const auto fixture = load_fixture(path);
  // PyTorch's bounds are NCCL's on a GPU, whose all-gather works in place: the estimate for CUDA. On the CPU,
  // Gloo's all-gather has a flat output of its own (the unit's unsharded size) during the collective: the
  // measurement is held to the bounds with one more block.
  const auto estimated = estimate_probe(fixture, 1, EstimateTarget::kCuda);
  const auto measured = run_probe(fixture, 1, kCpu);
  ASSERT_FALSE(estimated.oom || measured.oom) << estimated.error << measured.error;
  // The test's numels, from the model's parameters.
  const auto model = build_model(fixture.model, c10::Device(c10::DeviceType::Meta));
  std::int64_t unsharded = 0, max_block = 0, non_block = 0;
  std::map<std::string, std::int64_t> blocks;
  for (const auto& named : model->module().named_parameters()) {
    unsharded += named.value().numel();
    if (named.key().starts_with("h.")) blocks[named.key().substr(0, named.key().find('.', 2))] += named.value().numel();
    else non_block += named.value().numel();
  }
  for (const auto& [name, numel] : blocks) max_block = std::max(max_block, numel);
  ASSERT_EQ(blocks.size(), 3U);
  const double sharded = static_cast<double>((unsharded + 1) / 2);
  const double mb = 1e6;
  const double buffer = 16 * mb;  // the test's allowance for activations and fragmentation
  const auto bytes = [](double numel) { return numel * 4.0; };
  const double forward_bound =
      reshard ? bytes(3.0 * static_cast<double>(max_block) + static_cast<double>(non_block) + sharded) + buffer
              : bytes(sharded + static_cast<double>(unsharded) + static_cast<double>(max_block)) + buffer;
  const double backward_bound =
      reshard ? bytes(4.0 * static_cast<double>(max_block) + static_cast<double>(non_block) + 2.0 * sharded) + buffer
              : bytes(sharded + static_cast<double>(unsharded) + 1.5 * static_cast<double>(max_block)) + buffer;
  for (const auto* probe : {&estimated, &measured}) {
    const bool gloo = probe == &measured;
    const double gloo_flat_output = gloo ? bytes(static_cast<double>(max_block)) : 0.0;
    ASSERT_EQ(probe->ranks.size(), 2U);
    for (const auto& r : probe->ranks) {
      const auto& c = r.components;
      const auto at = fmt::format("{} rank {}", gloo ? "measured (Gloo)" : "estimated for CUDA", r.rank);
      const auto forward = static_cast<double>(c.params + c.forward_peak);
      const auto backward = static_cast<double>(c.step_peak - c.optimizer_state);
      EXPECT_LE(forward, forward_bound + gloo_flat_output) << at << ": forward " << forward / mb << " MB, bound "
                                                           << (forward_bound + gloo_flat_output) / mb;
      EXPECT_LE(backward, backward_bound + gloo_flat_output) << at << ": backward " << backward / mb << " MB, bound "
                                                             << (backward_bound + gloo_flat_output) / mb;
      // The optimizer step: 1x sharded parameters and gradients, 2x sharded state (+ the buffer).
      EXPECT_LE(static_cast<double>(c.params + c.gradients + c.optimizer_state), bytes(4.0 * sharded) + buffer) << at;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ReshardAfterForward, FsdpBoundsTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "true" : "false"; });

// Each request of the Meta device with the stream it was made on.
class StreamRecorder final : public CountingMetaAllocator::Observer {
 public:
  StreamRecorder() { CountingMetaAllocator::install().set_observer(this); }
  ~StreamRecorder() override { CountingMetaAllocator::install().set_observer(nullptr); }
  StreamRecorder(const StreamRecorder&) = delete;
  StreamRecorder& operator=(const StreamRecorder&) = delete;
  void on_alloc(std::uint64_t, std::size_t bytes, std::uint64_t stream) override {
    by_stream[stream].insert(static_cast<std::int64_t>(bytes));
  }
  void on_free(std::uint64_t, std::size_t) override {}
  std::map<std::uint64_t, std::set<std::int64_t>> by_stream;  ///< the distinct sizes requested on each stream
};

// Each unit's padded shard elements on a rank of `world` (the blocks in order, then the root).
std::vector<std::int64_t> unit_shard_numels(const Fixture& fixture, std::int64_t world) {
  const auto model = build_model(fixture.model, c10::Device(c10::DeviceType::Meta));
  auto prefixes = model->block_prefixes();
  std::vector<std::int64_t> numels(prefixes.size() + 1, 0);
  for (const auto& named : model->module().named_parameters()) {
    const auto& p = named.value();
    const auto numel = (p.size(0) + world - 1) / world * (p.numel() / p.size(0));
    const auto at = std::find_if(prefixes.begin(), prefixes.end(),
                                 [&](const std::string& prefix) { return named.key().starts_with(prefix); });
    numels[static_cast<std::size_t>(at - prefixes.begin())] += numel;
  }
  return numels;
}

std::int64_t blocks_of_512(std::int64_t bytes) { return (bytes + 511) / 512 * 512; }

// On a GPU, FSDP2 allocates a unit's all-gather buffers on its copy-in stream and the reduce-scatter's output on its
// reduce-scatter stream, pools the caching allocator keeps apart from the default stream's. The estimate for CUDA
// makes exactly those requests there: each unit's all-gather output (N x its padded shards, in the param dtype) and
// under bf16 its cast copy-in buffer on the one; each unit's reduce-scatter output (its padded shards, in the reduce
// dtype) and its cast back to fp32 on the other; nothing else; and each rank's memory_viz snapshot says so, so that
// memgate replay finds the pools again. An estimate for the CPU makes every request on one.
TEST(FsdpEstimateTest, EstimateForCudaMakesTheCollectiveBuffersOnFsdpsStreams) {
  for (const bool bf16 : {false, true}) {
    testing::TempDir dir;
    const std::int64_t world = 2;
    const auto fixture = fsdp_twin(dir, world, "", bf16 ? "  precision: bf16\n" : "");
    const auto numels = unit_shard_numels(fixture, world);
    const std::int64_t param_bytes = bf16 ? 2 : 4;
    std::set<std::int64_t> all_gather, reduce_scatter;
    for (const auto numel : numels) {
      all_gather.insert(blocks_of_512(world * numel * param_bytes));
      if (bf16) all_gather.insert(blocks_of_512(numel * param_bytes));  // the shards cast into the copy-in buffer
      reduce_scatter.insert(blocks_of_512(numel * param_bytes));
      if (bf16) reduce_scatter.insert(blocks_of_512(numel * 4));  // the reduced gradients cast back to the shards'
    }
    const auto at = bf16 ? "bf16" : "fp32";
    {
      StreamRecorder recorder;
      const auto estimated = estimate_probe(fixture, 1, EstimateTarget::kCuda);
      ASSERT_FALSE(estimated.oom) << estimated.error;
      EXPECT_EQ(recorder.by_stream[FullyShard::kAllGatherCopyInStream], all_gather) << at;
      EXPECT_EQ(recorder.by_stream[FullyShard::kReduceScatterStream], reduce_scatter) << at;
      EXPECT_EQ(recorder.by_stream.size(), 3U) << at << ": the default stream and FSDP's two";
    }
    {
      // Each rank's memory_viz snapshot of the estimate says the stream of each request, as a GPU's does.
      ProbeOptions options;
      options.snapshot = SnapshotOptions{};
      const auto estimated = estimate_probe(fixture, 1, EstimateTarget::kCuda, options);
      ASSERT_FALSE(estimated.oom) << estimated.error;
      EXPECT_TRUE(estimated.snapshot.empty()) << "one per rank instead";
      ASSERT_EQ(estimated.rank_snapshots.size(), static_cast<std::size_t>(world)) << at;
      for (std::size_t r = 0; r < estimated.rank_snapshots.size(); ++r) {
        const auto snapshot = read_plain_pickle(estimated.rank_snapshots[r], fmt::format("rank {}'s snapshot", r));
        std::map<std::uint64_t, std::set<std::int64_t>> by_stream;
        for (const auto& entry : snapshot.at("device_traces").at(0)) {
          if (entry.at("action") == "alloc") {
            by_stream[entry.at("stream").get<std::uint64_t>()].insert(entry.at("size").get<std::int64_t>());
          }
        }
        EXPECT_EQ(by_stream[FullyShard::kAllGatherCopyInStream], all_gather) << at << " rank " << r;
        EXPECT_EQ(by_stream[FullyShard::kReduceScatterStream], reduce_scatter) << at << " rank " << r;
        // memgate replay runs the snapshot's requests through the caching allocator's model, stream by stream: the
        // rank's step_peak_reserved again (without the streams, one pool would reserve less: 4 MiB, not 8, at fp32).
        const auto replayed = replay_snapshot(read_snapshot(snapshot, "the snapshot"));
        ASSERT_EQ(replayed.devices.size(), 1U);
        EXPECT_EQ(replayed.devices[0].replayed.peak_reserved, estimated.ranks[r].components.step_peak_reserved)
            << at << " rank " << r;
      }
    }
    {
      StreamRecorder recorder;
      const auto estimated = estimate_probe(fixture, 1, EstimateTarget::kCpu);
      ASSERT_FALSE(estimated.oom) << estimated.error;
      EXPECT_EQ(recorder.by_stream.size(), 1U) << at;
      EXPECT_TRUE(recorder.by_stream.contains(0)) << at;
    }
  }
}

// Each parameter's shard on `rank` of `world` in the order fully_shard's units hold them, the order the optimizer
// steps them: each block's parameters in turn, then the root's (the rest, in the model's order).
struct ParamShard {
  std::int64_t padded_numel = 0;  ///< ceil(rows / N) rows: what every rank keeps
  std::int64_t own_numel = 0;     ///< the rows this rank owns: its sharded parameter, gradient and AdamW moments
};

std::vector<ParamShard> shards_in_unit_order(const Fixture& fixture, std::int64_t rank, std::int64_t world) {
  const auto model = build_model(fixture.model, c10::Device(c10::DeviceType::Meta));
  const auto named = model->module().named_parameters();
  std::vector<ParamShard> out;
  std::vector<bool> taken(named.size(), false);
  const auto take = [&](std::size_t i) {
    const auto& p = named[i].value();
    const auto rows = p.size(0);
    const auto chunk = (rows + world - 1) / world;
    const auto own = std::clamp(rows - rank * chunk, std::int64_t{0}, chunk);
    out.push_back({chunk * (p.numel() / rows), own * (p.numel() / rows)});
    taken[i] = true;
  };
  for (const auto& prefix : model->unit_prefixes()) {
    for (std::size_t i = 0; i < named.size(); ++i) {
      if (!taken[i] && named[i].key().starts_with(prefix)) take(i);
    }
  }
  for (std::size_t i = 0; i < named.size(); ++i) {
    if (!taken[i]) take(i);
  }
  return out;
}

// A pinned block of CUDA's caching host allocator: the request rounded up to a power of two.
std::int64_t pinned_block(std::int64_t bytes) {
  return bytes == 0 ? 0 : static_cast<std::int64_t>(std::bit_ceil(static_cast<std::uint64_t>(bytes)));
}

// FSDP2's CPUOffloadPolicy in an estimate for CUDA (vit_tiny_fsdp, fp32, AdamW, 2 ranks, batch 1): the padded shards,
// their gradients and AdamW's moments are host memory, so the device keeps no parameter (the ViT has no buffers), no
// gradient and no optimizer state, and its step peak is lower than without offload. host_state, counted here from
// the parameters' shapes alone: the padded shards (pinned: each a power-of-two block), the gradients of the rows the
// rank owns (each reduce-scattered view copied back: pinned as well), AdamW's two moments of them (torch.optim makes
// them like the parameter: pageable), and torch.optim's for-loop's temporaries on the host at their peak: stepping
// parameter i, sqrt(exp_avg_sq) and its quotient (2 x its bytes) while parameter i - 1's `denom` is still held.
// cpu and cpu_pinned differ only there: every device byte is the same.
TEST(FsdpEstimateTest, CpuOffloadForCudaKeepsShardsGradientsAndAdamWStateOnTheHost) {
  testing::TempDir dir;
  const std::int64_t world = 2;
  const auto plain = estimate_probe(fsdp_twin(dir, world), 1, EstimateTarget::kCuda);
  ASSERT_FALSE(plain.oom) << plain.error;
  EXPECT_FALSE(plain.components.offloads_state) << "no offload, no host_state";
  std::map<std::string, ProbeResult> by_policy;
  for (const std::string policy : {"cpu", "cpu_pinned"}) {
    const auto fixture = fsdp_twin(dir, world, "    offload_policy: " + policy + "\n");
    const auto estimated = estimate_probe(fixture, 1, EstimateTarget::kCuda);
    ASSERT_FALSE(estimated.oom) << estimated.error;
    ASSERT_EQ(estimated.ranks.size(), static_cast<std::size_t>(world));
    const bool pinned = policy == "cpu_pinned";
    for (std::int64_t r = 0; r < world; ++r) {
      const auto& e = estimated.ranks[static_cast<std::size_t>(r)].components;
      const auto at = fmt::format("{} rank {}", policy, r);
      EXPECT_EQ(e.params, 0) << at;
      EXPECT_EQ(e.gradients, 0) << at;
      EXPECT_EQ(e.optimizer_state, 0) << at;
      std::int64_t host = 0, temporaries = 0, previous_denom = 0;
      for (const auto& s : shards_in_unit_order(fixture, r, world)) {
        const auto padded = s.padded_numel * 4, own = s.own_numel * 4;
        host += (pinned ? pinned_block(padded) : padded) + (pinned ? pinned_block(own) : own) + 2 * own;
        temporaries = std::max(temporaries, previous_denom + 2 * own);
        previous_denom = own;
      }
      ASSERT_TRUE(e.offloads_state) << at;
      EXPECT_EQ(e.host_state, host + temporaries) << at;
      EXPECT_LT(e.step_peak, plain.ranks[static_cast<std::size_t>(r)].components.step_peak) << at;
    }
    EXPECT_TRUE(estimated.components.offloads_state) << policy;
    by_policy[policy] = estimated;
  }
  for (const auto& info : kComponentTable) {
    if (info.name == "host_state") {
      EXPECT_GT(by_policy["cpu_pinned"].components.host_state, by_policy["cpu"].components.host_state);
    } else {
      EXPECT_EQ(by_policy["cpu_pinned"].components.get(info.name), by_policy["cpu"].components.get(info.name))
          << info.name;
    }
  }
  // On the CPU nothing of the above: the device is the host, and no component is added.
  const auto cpu = estimate_probe(fsdp_twin(dir, world, "    offload_policy: cpu\n"), 1, EstimateTarget::kCpu);
  ASSERT_FALSE(cpu.oom) << cpu.error;
  EXPECT_FALSE(cpu.components.offloads_state);
  EXPECT_EQ(cpu.components.params, estimate_probe(fsdp_twin(dir, world), 1, EstimateTarget::kCpu).components.params);
}

// Offloaded shards skip FSDP2's foreach copy-in: before each all-gather every shard is brought to the device on its
// own (`.to(device)`: its padded bytes) and, under bf16's param_dtype, cast on its own (half of them), on the
// all-gather copy-in stream, beside each unit's all-gather output and never one flat copy-in buffer. The gradients'
// copies back are host memory: the reduce-scatter stream sees what it sees without offload.
TEST(FsdpEstimateTest, CpuOffloadForCudaBringsEachShardToTheDeviceAndCastsItOnItsOwn) {
  for (const bool bf16 : {false, true}) {
    testing::TempDir dir;
    const std::int64_t world = 2;
    const auto fixture = fsdp_twin(dir, world, "    offload_policy: cpu_pinned\n", bf16 ? "  precision: bf16\n" : "");
    const std::int64_t param_bytes = bf16 ? 2 : 4;
    std::set<std::int64_t> all_gather, reduce_scatter;
    for (const auto numel : unit_shard_numels(fixture, world)) {
      all_gather.insert(blocks_of_512(world * numel * param_bytes));
      reduce_scatter.insert(blocks_of_512(numel * param_bytes));
      if (bf16) reduce_scatter.insert(blocks_of_512(numel * 4));
    }
    for (const auto& s : shards_in_unit_order(fixture, 0, world)) {
      all_gather.insert(blocks_of_512(s.padded_numel * 4));
      if (bf16) all_gather.insert(blocks_of_512(s.padded_numel * 2));
    }
    StreamRecorder recorder;
    const auto estimated = estimate_probe(fixture, 1, EstimateTarget::kCuda);
    ASSERT_FALSE(estimated.oom) << estimated.error;
    const auto at = bf16 ? "bf16" : "fp32";
    EXPECT_EQ(recorder.by_stream[FullyShard::kAllGatherCopyInStream], all_gather) << at;
    EXPECT_EQ(recorder.by_stream[FullyShard::kReduceScatterStream], reduce_scatter) << at;
  }
}

// An estimate reuses a rank's for the ranks that make the same requests: DDP's are all rank 0; FSDP's differ only in
// the rows of each parameter's dim-0 chunk they own (vit_tiny_fsdp at 8 ranks: the one-row cls_token and pos_embed on
// rank 0 only, the 5-row head's chunks of 1 on ranks 0 to 4).
TEST(FsdpEstimateTest, RanksAlikeAreEstimatedOnce) {
  testing::TempDir dir;
  EXPECT_EQ(rank_kinds(fsdp_twin(dir, 8), 8), (std::vector<int>{0, 1, 1, 1, 1, 5, 5, 5}));
  EXPECT_EQ(rank_kinds(fsdp_twin(dir, 2), 2), (std::vector<int>{0, 1}));
  auto ddp = load_fixture(testing::source_dir() + "/fixtures/models/vit_tiny_ddp.yaml");
  ddp.training.distributed.world_size = 64;
  EXPECT_EQ(rank_kinds(ddp, 64), std::vector<int>(64, 0));
  // And thousands of ranks cost a few estimates: DDP over 4096 ranks, each rank the first's.
  ddp.training.distributed.world_size = 4096;
  const auto estimated = estimate_probe(ddp, 1, EstimateTarget::kCuda);
  ASSERT_EQ(estimated.ranks.size(), 4096U);
  EXPECT_EQ(estimated.ranks.back().rank, 4095);
  EXPECT_EQ(estimated.ranks.back().components, estimated.ranks.front().components);
}

// FSDP2's root post-forward runs when the root module's forward returns, not after the loss: by the loss, the last
// block's all-gather buffer is gone. A GPT with tied embeddings and a vocabulary large enough for the loss to be the
// forward's peak, against the same model whose loss memgate cannot split from its forward (so the root's
// post-forward waits for the loss, as it did for every model before): the peak differs by exactly that buffer.
class UnsplitModel final : public Model {
 public:
  explicit UnsplitModel(std::unique_ptr<Model> inner) : inner_(std::move(inner)) {}
  torch::nn::Module& module() override { return inner_->module(); }
  Batch make_batch(std::int64_t batch_size) override { return inner_->make_batch(batch_size); }
  torch::Tensor loss(const Batch& batch) override { return inner_->loss(batch); }
  torch::Tensor forward(const Batch& batch) override { return inner_->forward(batch); }
  std::vector<std::string> block_prefixes() const override { return inner_->block_prefixes(); }
  std::vector<std::string> head_prefixes() const override { return inner_->head_prefixes(); }

 private:
  std::unique_ptr<Model> inner_;
};

// The GPT (arch: gpt), or the registered one that builds the same GPT (its keys are the factory's).
std::string big_vocab_gpt_yaml(const std::string& arch) {
  const std::string keys = arch != "gpt" ? ""
                                         : "  vocab_size: 4096\n  seq_len: 32\n  n_layer: 2\n  n_embd: 32\n  n_head: 4\n"
                                           "  mlp: gelu\n  norm: layernorm\n  position: learned\n  bias: true\n"
                                           "  tied_embeddings: true\n";
  return "model:\n  arch: " + arch + "\n" + keys +
         "training:\n  optimizer: adamw\n  trainable: all\n  distributed:\n    strategy: fsdp\n    world_size: 2\n"
         "batch_sizes: [2]\n";
}

const bool kUnsplitGpt = register_architecture({
    .name = "test_gpt_unsplit_loss",
    .options = nlohmann::json::object(),
    .factory = [](const nlohmann::json&, nn::ParamOptions param) -> std::unique_ptr<Model> {
      return std::make_unique<UnsplitModel>(build_model(testing::fixture_from(big_vocab_gpt_yaml("gpt")).model,
                                                        param.device));
    }});

TEST(FsdpTest, TheRootsPostForwardRunsWhenItsForwardReturnsNotAfterTheLoss) {
  ASSERT_TRUE(kUnsplitGpt);
  const auto split = testing::fixture_from(big_vocab_gpt_yaml("gpt"), "gpt");
  const auto unsplit = testing::fixture_from(big_vocab_gpt_yaml("test_gpt_unsplit_loss"), "gpt_unsplit");
  // The last block's padded unsharded parameters: its all-gather buffer (every row count divides by 2: no padding).
  std::int64_t last_block_bytes = 0;
  const auto model = build_model(split.model, c10::Device(c10::DeviceType::Meta));
  for (const auto& p : model->module().named_parameters()) {
    if (p.key().starts_with("h.1.")) last_block_bytes += p.value().numel() * 4;
  }
  ASSERT_GT(last_block_bytes, 0);
  for (const auto target : {EstimateTarget::kCpu, EstimateTarget::kCuda}) {
    const auto s = estimate_probe(split, 2, target);
    const auto u = estimate_probe(unsplit, 2, target);
    ASSERT_FALSE(s.oom || u.oom);
    ASSERT_EQ(s.ranks.size(), 2U);
    for (std::size_t r = 0; r < 2; ++r) {
      const auto at = fmt::format("{} rank {}", target == EstimateTarget::kCpu ? "cpu" : "cuda", r);
      // (The CUDA caching allocator's blocks are multiples of 512 bytes.)
      const auto buffer = target == EstimateTarget::kCpu ? last_block_bytes : (last_block_bytes + 511) / 512 * 512;
      EXPECT_EQ(u.ranks[r].components.forward_peak - s.ranks[r].components.forward_peak, buffer) << at;
      EXPECT_LE(s.ranks[r].components.step_peak, u.ranks[r].components.step_peak) << at;
      EXPECT_EQ(s.ranks[r].components.params, u.ranks[r].components.params) << at;
    }
  }
  // And the measurement on Gloo ranks says the same.
  testing::TempDir dir;
  testing::write_file(dir / "gpt.yaml", big_vocab_gpt_yaml("gpt"));
  const auto s = run_probe(load_fixture(dir / "gpt.yaml"), 2, kCpu);
  ASSERT_FALSE(s.oom) << s.error;
  ASSERT_EQ(s.ranks.size(), 2U);
  const auto e = estimate_probe(split, 2, EstimateTarget::kCpu);
  for (std::size_t r = 0; r < 2; ++r) {
    EXPECT_LE(testing::error_pct(e.ranks[r].components.forward_peak, s.ranks[r].components.forward_peak), 1.0);
  }
}

struct EstimateCase {
  int world;
  std::string extra;
  std::string name;
  std::string training_extra;
};

void PrintTo(const EstimateCase& c, std::ostream* os) { *os << c.name; }

class FsdpEstimateTest : public ::testing::TestWithParam<EstimateCase> {};

TEST_P(FsdpEstimateTest, EqualsEachRanksMeasurement) {
  testing::TempDir dir;
  const auto fixture = fsdp_twin(dir, GetParam().world, GetParam().extra, GetParam().training_extra);
  for (const std::int64_t batch : {1, 2}) {
    const auto measured = run_probe(fixture, batch, kCpu);
    const auto estimated = estimate_probe(fixture, batch, EstimateTarget::kCpu);
    ASSERT_FALSE(measured.oom || estimated.oom);
    ASSERT_EQ(measured.ranks.size(), static_cast<std::size_t>(GetParam().world));
    ASSERT_EQ(estimated.ranks.size(), measured.ranks.size());
    for (std::size_t r = 0; r < measured.ranks.size(); ++r) {
      const auto& m = measured.ranks[r].components;
      const auto& e = estimated.ranks[r].components;
      const auto at = fmt::format("rank {} at batch {}", r, batch);
      EXPECT_EQ(e.params, m.params) << at;
      EXPECT_EQ(e.gradients, m.gradients) << at;
      EXPECT_EQ(e.optimizer_state, m.optimizer_state) << at;
      for (const auto* peak : {"activations", "forward_peak", "eval_peak", "step_peak"}) {
        EXPECT_LE(testing::error_pct(e.get(peak), m.get(peak)), 1.0)
            << at << ": " << peak << " " << e.get(peak) << " vs " << m.get(peak);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Ranks, FsdpEstimateTest,
    ::testing::Values(EstimateCase{2, "", "world2", ""}, EstimateCase{4, "", "world4", ""},
                      EstimateCase{2, "    reshard_after_forward: false\n", "world2_kept_gathered", ""},
                      EstimateCase{4, "    backward_prefetch: 2\n", "world4_prefetch2", ""},
                      EstimateCase{2, "", "world2_bf16", "  precision: bf16\n"},
                      EstimateCase{4, "    reduce_dtype: fp32\n", "world4_bf16_reduce_fp32", "  precision: bf16\n"},
                      // fp16 gradients overflow the scaler's first scales: the warm-up goes on until a step is
                      // taken, so the measurement has the optimizer's state the estimate has.
                      EstimateCase{2, "", "world2_fp16", "  precision: fp16\n"},
                      EstimateCase{4, "    reshard_after_forward: 2\n", "world4_reshard_to_2", ""},
                      EstimateCase{4, "    reshard_after_forward: 2\n", "world4_reshard_to_2_bf16", "  precision: bf16\n"},
                      // Ranks alike (rank_kinds: 1 to 4 own a row of the head, 5 to 7 none) are estimated once.
                      EstimateCase{8, "", "world8", ""},
                      EstimateCase{8, "    reshard_after_forward: 2\n", "world8_reshard_to_2", ""},
                      // FSDP2's CPUOffloadPolicy on the CPU: its copies are the tensors themselves.
                      EstimateCase{2, "    offload_policy: cpu\n", "world2_cpu_offload", ""},
                      EstimateCase{2, "    offload_policy: cpu\n", "world2_cpu_offload_bf16", "  precision: bf16\n"}),
    [](const ::testing::TestParamInfo<EstimateCase>& p) { return p.param.name; });

}  // namespace
}  // namespace memgate
