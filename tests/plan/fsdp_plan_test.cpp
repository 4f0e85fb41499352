// memgate plan --world-size (issue 70): FSDP over the ranks as a lever. A batch that does not fit one device but fits
// sharded over 2 ranks gets the FSDP plan, alone and with checkpointing; its change merged into the fixture estimates
// to its bytes again (from a fixture on one device and from a DDP one); that fixture measured on 2 Gloo CPU ranks
// equals its estimate on every component of every rank; and the plan's communication is what the measured ranks'
// shards send.
#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/base/units.h"
#include "memgate/estimate/estimate_context.h"
#include "memgate/gate/fixture.h"
#include "memgate/launch/estimate.h"
#include "memgate/models/zoo.h"
#include "memgate/plan/communication.h"
#include "memgate/plan/plan.h"
#include "estimate_check.h"
#include "test_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace memgate {
namespace {

std::string zoo_fixture(const std::string& name) { return testing::source_dir() + "/fixtures/models/" + name + ".yaml"; }

// vit_tiny_full at batch 2 needs 3,605,064 B estimated for the CPU on one device; sharded over 2 ranks its largest
// rank 2,960,328 B.
constexpr std::int64_t kBatch = 2;
constexpr std::int64_t kFitsOnlySharded = 3'000'000;

PlanOptions over_ranks(std::int64_t world, PlanOptions::Search search = PlanOptions::Search::kExhaustive) {
  PlanOptions o;
  o.batch = kBatch;
  o.world_size = world;
  o.search = search;
  o.target = EstimateTarget::kCpu;
  return o;
}

// The plans of one fixture share its points' estimates (issue 69: a search at another capacity, or the greedy one
// after the exhaustive one, revisits them): each search's plans, its count of estimates and its order are what it
// returns without the memo (plan.h's PlanEstimateMemo).
PlanResult plan_at(const std::string& path, std::int64_t capacity, const PlanOptions& options) {
  static const auto memo = std::make_shared<PlanEstimateMemo>();
  auto memoized = options;
  memoized.memo = memo;
  return plan(load_fixture(path), {"capacity", std::to_string(capacity) + " B", capacity}, memoized);
}

const Plan* first_sharded(const PlanResult& r) {
  const auto it = std::find_if(r.plans.begin(), r.plans.end(), [](const Plan& p) { return p.strategy == "fsdp"; });
  return it == r.plans.end() ? nullptr : &*it;
}

// `plan`'s change merged into the fixture's YAML, written to `dir` and loaded.
Fixture applied(const testing::TempDir& dir, const std::string& path, const Plan& plan, const std::string& name) {
  write_file_atomically(dir / name, apply_change(read_text_file(path, "a fixture"), plan.change));
  return load_fixture(dir / name);
}

// One device, and DDP over 2 ranks (its buckets, 0.25 MiB, and gradients as views into them): neither fits 3,000,000
// B at batch 2; FSDP over the 2 ranks does, and is the first plan. Its change (for DDP: the DDP keys removed) merged
// into the fixture and estimated for the CPU gives the plan's bytes again, as the largest rank's. At 2,700,000 B FSDP
// alone does not fit: FSDP and checkpointed blocks together do, and estimate to their bytes again too. The greedy
// search's first plan is the exhaustive one's.
TEST(FsdpPlanTest, ABatchThatFitsOnlyShardedGetsTheFsdpPlanWhoseChangeEstimatesToItsBytes) {
  testing::TempDir dir;
  auto ddp = read_text_file(zoo_fixture("vit_tiny_full"), "a fixture");
  const std::string trainable = "  trainable: all\n";
  ddp.insert(ddp.find(trainable) + trainable.size(),
             "  distributed:\n    strategy: ddp\n    world_size: 2\n    bucket_cap_mb: 0.25\n"
             "    gradient_as_bucket_view: true\n");
  write_file_atomically(dir / "vit_tiny_ddp.yaml", ddp);
  for (const auto& path : {zoo_fixture("vit_tiny_full"), dir / "vit_tiny_ddp.yaml"}) {
    SCOPED_TRACE(path);
    // The fixture's own ranks (one device, or DDP's 2) fit no plan: the sharding is what fits.
    PlanOptions own = over_ranks(2);
    own.world_size.reset();
    EXPECT_THROW((void)plan_at(path, kFitsOnlySharded, own), Error);
    for (const auto& [capacity, checkpointed] : {std::pair{kFitsOnlySharded, false}, std::pair{2'700'000L, true}}) {
      SCOPED_TRACE(capacity);
      const auto r = plan_at(path, capacity, over_ranks(2));
      EXPECT_EQ(r.sharding, "FSDP over 2 ranks");
      ASSERT_TRUE(r.as_is);
      EXPECT_FALSE(r.as_is->fits);
      ASSERT_FALSE(r.plans.empty());
      const auto* p = first_sharded(r);
      ASSERT_NE(p, nullptr) << "an FSDP plan";
      EXPECT_EQ(p, &r.plans.front()) << "the first plan fits sharded";
      EXPECT_TRUE(p->fits);
      EXPECT_EQ(p->world_size, 2);
      EXPECT_EQ(p->global_batch, 2 * kBatch) << "the batch is each rank's";
      EXPECT_EQ(p->checkpointed.empty(), !checkpointed);
      ASSERT_TRUE(p->communication_bytes);
      EXPECT_GT(*p->communication_bytes, 0);
      EXPECT_EQ(p->levers.front(), fmt::format("FSDP over 2 ranks ({} sent per rank per step)",
                                               format_bytes(*p->communication_bytes)));
      for (const auto& q : r.plans) {
        if (q.strategy != "fsdp") {
          EXPECT_EQ(q.communication_bytes, 0) << q.change.dump();
        }
      }
      SCOPED_TRACE(p->change.dump());
      const auto fixture = applied(dir, path, *p, "plan.yaml");
      EXPECT_EQ(fixture.training.distributed.strategy, DistributedStrategy::kFsdp);
      EXPECT_EQ(fixture.training.distributed.world_size, 2);
      EXPECT_FALSE(fixture.training.distributed.bucket_cap_mb) << "DDP's keys removed";
      EXPECT_EQ(fixture.batch_sizes, std::vector<std::int64_t>{kBatch});
      const auto e = estimate_probe(fixture, kBatch, EstimateTarget::kCpu);
      ASSERT_EQ(e.ranks.size(), 2U);
      EXPECT_EQ(e.components.step_peak, p->step_peak);
      EXPECT_EQ(e.components.step_peak_reserved, p->step_peak_reserved);
      EXPECT_LE(e.components.step_peak, capacity);
      // The greedy search (its blocks ordered again for the sharded step) finds the same first plan.
      const auto greedy = plan_at(path, capacity, over_ranks(2, PlanOptions::Search::kGreedy));
      ASSERT_FALSE(greedy.plans.empty());
      EXPECT_EQ(greedy.plans.front().change, p->change);
      EXPECT_LT(greedy.estimates, r.estimates);
    }
  }
}

// The FSDP plan's fixture measured on 2 Gloo CPU ranks (rank processes of the memgate CLI, each measuring its own
// components) and estimated for the CPU on the Meta device: every component of every rank equal, to the byte; so is
// the plan with FSDP and checkpointed blocks at 2,700,000 B.
// Ranks/FsdpEstimateTest holds the FSDP estimate to the measurement and FsdpReferenceTest the measurement to PyTorch's
// own fully_shard; this ties the plan's lever to both. Then the plan's communication against the measured ranks'
// shards: each rank's `params` are its padded dim-0 shards (fp32), what each all-gather sends; its `gradients` the
// reduce-scatter's padded output; FSDP2's default reshards the blocks after forward, not the root, whose parameters
// (the patch embedding, the tokens, the final norm and the head) are all-gathered once. Over 2 ranks each rank sends
// its shard to the other: once forward, once more backward for the blocks, once reduced.
// `plan`'s fixture measured on its Gloo CPU ranks and estimated for the CPU: every component of every rank equal; the
// measurement, within `capacity`.
ProbeResult measured_equal_to_its_estimate(const Fixture& fixture, const Plan& plan, std::int64_t capacity) {
  const auto pair = testing::measure_and_estimate_for_cpu(fixture, {kBatch});
  const auto& measured = pair.at(0).measured;
  const auto& estimated = pair.at(0).estimated;
  EXPECT_EQ(measured.ranks.size(), 2U);
  EXPECT_EQ(estimated.ranks.size(), 2U);
  EXPECT_EQ(estimated.components.step_peak, plan.step_peak);
  EXPECT_LE(measured.components.step_peak, capacity) << "measured, the plan fits its capacity";
  for (std::size_t i = 0; i < std::min(measured.ranks.size(), estimated.ranks.size()); ++i) {
    const auto& m = measured.ranks[i].components;
    const auto& e = estimated.ranks[i].components;
    SCOPED_TRACE("rank " + std::to_string(measured.ranks[i].rank));
    for (const auto& [what, mb, eb] :
         {std::tuple{"params", m.params, e.params}, std::tuple{"gradients", m.gradients, e.gradients},
          std::tuple{"optimizer_state", m.optimizer_state, e.optimizer_state},
          std::tuple{"activations", m.activations, e.activations}, std::tuple{"eval_peak", m.eval_peak, e.eval_peak},
          std::tuple{"forward_peak", m.forward_peak, e.forward_peak}, std::tuple{"step_peak", m.step_peak, e.step_peak},
          std::tuple{"step_peak_reserved", m.step_peak_reserved, e.step_peak_reserved}}) {
      EXPECT_GT(mb, 0) << what;
      EXPECT_EQ(eb, mb) << what;
    }
  }
  return measured;
}

TEST(FsdpPlanTest, TheFsdpPlanMeasuresOnGlooRanksWhatItsEstimateSaysAndSendsItsMeasuredShards) {
  const auto r = plan_at(zoo_fixture("vit_tiny_full"), kFitsOnlySharded, over_ranks(2));
  const auto* p = first_sharded(r);
  ASSERT_NE(p, nullptr);
  testing::TempDir dir;
  const auto fixture = applied(dir, zoo_fixture("vit_tiny_full"), *p, "plan.yaml");
  const auto measured = measured_equal_to_its_estimate(fixture, *p, kFitsOnlySharded);
  ASSERT_EQ(measured.ranks.size(), 2U);
  {
    // FSDP with checkpointed blocks, measured too.
    SCOPED_TRACE("at 2,700,000 B");
    const auto both = plan_at(zoo_fixture("vit_tiny_full"), 2'700'000, over_ranks(2));
    ASSERT_NE(first_sharded(both), nullptr);
    EXPECT_FALSE(first_sharded(both)->checkpointed.empty());
    (void)measured_equal_to_its_estimate(applied(dir, zoo_fixture("vit_tiny_full"), *first_sharded(both), "both.yaml"),
                                         *first_sharded(both), 2'700'000);
  }
  // The root's parameters' padded shards, from their sizes: what the backward's all-gathers leave out.
  const auto model = build_model(fixture.model, c10::Device(c10::DeviceType::Meta));
  std::int64_t root = 0;
  for (const auto& named : model->module().named_parameters()) {
    if (named.key().starts_with("blocks.")) continue;
    const auto& t = named.value();
    root += (t.size(0) + 1) / 2 * (t.numel() / t.size(0)) * static_cast<std::int64_t>(t.element_size());
  }
  const auto& rank0 = measured.ranks[0].components;
  EXPECT_EQ(measured.ranks[1].components.params, rank0.params) << "padded shards, equal on every rank";
  EXPECT_EQ(*p->communication_bytes, rank0.params + (rank0.params - root) + rank0.gradients);
  // Without the backward's all-gathers (reshard_after_forward: false), the root's with them (true), in bf16
  // (MixedPrecisionPolicy's param_dtype: all-gathered and reduce-scattered in 2 bytes, not 4), and over 2
  // micro-batches (FSDP2 all-gathers and reduce-scatters each).
  auto w = static_cast<const Workload&>(fixture);
  w.training.distributed.reshard_after_forward = false;
  EXPECT_EQ(fsdp_communication(w)->total(), rank0.params + rank0.gradients);
  EXPECT_EQ(fsdp_communication(w)->all_gather_backward, 0);
  w.training.distributed.reshard_after_forward = true;
  EXPECT_EQ(fsdp_communication(w)->total(), 2 * rank0.params + rank0.gradients);
  w.training.distributed.reshard_after_forward.reset();
  w.training.precision = Precision::kBf16;
  EXPECT_EQ(fsdp_communication(w)->total(), *p->communication_bytes / 2);
  w.training.precision = Precision::kFp32;
  w.training.accumulation_steps = 2;
  EXPECT_EQ(fsdp_communication(w)->total(), 2 * *p->communication_bytes);
}

// Sharding is dearer than none at equal recomputation and accumulation: where the fixture fits as it is, no FSDP plan
// is listed (the plan as it is beats it on every cost); over --effective-batch, the FSDP plan without accumulation
// comes before accumulation on one device, and an FSDP plan that also accumulates is dropped, beaten by the one
// that does not. The JSON says the batch each rank runs and the communication (0 without sharding).
TEST(FsdpPlanTest, ShardingCostsItsCommunicationAfterRecomputationAndAccumulation) {
  const auto fits = plan_at(zoo_fixture("vit_tiny_full"), 64 << 20, over_ranks(2));
  ASSERT_EQ(fits.plans.size(), 1U);
  EXPECT_TRUE(fits.plans.front().levers.empty());
  EXPECT_EQ(fits.plans.front().strategy, "none");
  auto options = over_ranks(2, PlanOptions::Search::kGreedy);
  options.batch.reset();
  options.effective_batch = 8;  // 6,495,864 B on one device; 5,684,984 B sharded; 2 micro-batches of 4: 5,424,728 B
  const auto r = plan_at(zoo_fixture("vit_tiny_full"), 6'000'000, options);
  ASSERT_GE(r.plans.size(), 2U);
  EXPECT_EQ(r.plans[0].strategy, "fsdp");
  EXPECT_EQ(r.plans[0].accumulation_steps, 1);
  EXPECT_EQ(r.plans[1].strategy, "none");
  EXPECT_EQ(r.plans[1].accumulation_steps, 2);
  for (const auto& p : r.plans) {
    EXPECT_FALSE(p.strategy == "fsdp" && p.accumulation_steps > 1 && p.recompute_flops == 0) << p.change.dump();
  }
  const auto j = plan_to_json(r);
  EXPECT_EQ(j.at("sharding"), "FSDP over 2 ranks");
  EXPECT_EQ(j.at("plans")[0].at("communication_bytes"), *r.plans[0].communication_bytes);
  EXPECT_EQ(j.at("plans")[0].at("global_batch"), 16);
  EXPECT_EQ(j.at("plans")[0].at("world_size"), 2);
  EXPECT_EQ(j.at("plans")[1].at("communication_bytes"), 0);
  EXPECT_EQ(j.at("plans")[1].at("global_batch"), 8);
}

// A ViT whose parameters, gradients and AdamW state outweigh its activations (embed_dim 512, 2 blocks, 4 tokens:
// 6,410,245 parameters). Estimated for CUDA at batch 1 it needs 134 MiB reserved on one device, and as much under FSDP
// over 2 ranks (its collectives' buffers in pools of their own streams); 102 MiB with the shards offloaded.
constexpr const char* kWideVit =
    "model:\n  arch: vit\n  img_size: 16\n  patch_size: 8\n  embed_dim: 512\n  depth: 2\n  num_heads: 8\n"
    "  num_classes: 5\ntraining:\n  optimizer: adamw\n  trainable: all\nbatch_sizes: [1]\n";

// FSDP2's CPUOffloadPolicy as a lever (for CUDA, with --world-size). In 110 MiB nothing that keeps the shards on the
// device fits: every point estimated apart through the fixture's keys (one device, activation offload, FSDP over 2
// ranks, FSDP with its shards offloaded; each subset of the 2 blocks; both allocator settings) fits only with the
// shards offloaded. Both searches find that plan alone: FSDP over 2 ranks, offload_policy cpu_pinned, nothing
// checkpointed. Its change merged into the fixture estimates to the plan's workload on every component, host_state
// (= host_bytes) included, and to the plan's peaks; its host_transfer_bytes are counted here from the parameters'
// shapes: each padded shard to the device before its unit's forward all-gather, again before backward for the
// blocks (they reshard after forward, the root does not), and each gradient back (rank 0 owns each parameter's
// first chunk whole: its padded shard). A fixture already under FSDP gets the offload alone. Where the fixture fits as
// it is, no plan offloads.
TEST(FsdpPlanTest, WhereOnlyOffloadedShardsFitTheFsdpOffloadPlanIsFoundAndItsChangeEstimatesToItsBytes) {
  testing::TempDir dir;
  write_file_atomically(dir / "wide.yaml", kWideVit);
  const auto path = dir / "wide.yaml";
  const auto fixture = load_fixture(path);
  constexpr std::int64_t kCapacity = std::int64_t{110} << 20;
  const EstimateContextGuard for_gpu(estimate_context_for_gpu({}));
  auto blocks = build_model(fixture.model, c10::Device(c10::DeviceType::Meta))->checkpoint_prefixes();
  ASSERT_EQ(blocks.size(), 2U);
  for (auto& b : blocks) b.pop_back();
  int fitting = 0;
  for (const std::string allocator : {"", "expandable_segments:True"}) {
    for (std::uint64_t mask = 0; mask < 4; ++mask) {
      for (const auto& [layout, fsdp, offload] : {std::tuple{"one device", false, false},
                                                  std::tuple{"activation offload", false, true},
                                                  std::tuple{"FSDP", true, false},
                                                  std::tuple{"FSDP offloaded", true, true}}) {
        Workload w = fixture;
        w.training.allocator = allocator;
        w.training.gradient_checkpointing = mask != 0;
        for (std::size_t i = 0; i < blocks.size(); ++i) {
          if (mask & (std::uint64_t{1} << i)) w.training.checkpoint_blocks.push_back(blocks[i]);
        }
        if (fsdp) {
          w.training.distributed.strategy = DistributedStrategy::kFsdp;
          w.training.distributed.world_size = 2;
          if (offload) w.training.distributed.offload_policy = FsdpOffload::kCpuPinned;
        } else if (offload) {
          w.training.activation_offload = ActivationOffload::kCpuPinned;
        }
        const auto reserved = estimate_probe(w, 1, EstimateTarget::kCuda).components.step_peak_reserved;
        const bool fits = reserved <= kCapacity;
        EXPECT_EQ(fits, fsdp && offload) << layout << ", blocks " << mask << ", '" << allocator << "': " << reserved;
        fitting += fits ? 1 : 0;
      }
    }
  }
  EXPECT_GT(fitting, 0);
  PlanOptions options;
  options.batch = 1;
  options.world_size = 2;
  for (const auto search : {PlanOptions::Search::kExhaustive, PlanOptions::Search::kGreedy}) {
    options.search = search;
    const auto r = plan_at(path, kCapacity, options);
    SCOPED_TRACE(r.search);
    ASSERT_TRUE(r.as_is);
    EXPECT_FALSE(r.as_is->fits);
    ASSERT_EQ(r.plans.size(), 1U);
    const auto& p = r.plans.front();
    SCOPED_TRACE(p.change.dump());
    EXPECT_EQ(p.change, nlohmann::json::parse(R"({"training":{"distributed":{"offload_policy":"cpu_pinned",)"
                                              R"("strategy":"fsdp","world_size":2}}})"));
    EXPECT_EQ(p.strategy, "fsdp");
    EXPECT_EQ(p.recompute_flops, 0);
    ASSERT_EQ(p.levers.size(), 2U);
    EXPECT_EQ(p.levers.back(), fmt::format("parameters and optimizer state offloaded to pinned host memory ({} held, "
                                           "{} moved per step)", format_bytes(p.host_bytes),
                                           format_bytes(p.host_transfer_bytes)));
    // The change merged: the plan's workload, estimated for CUDA, on every component.
    const auto merged = applied(dir, path, p, "offloaded.yaml");
    ASSERT_EQ(merged.training.distributed.offload_policy, FsdpOffload::kCpuPinned);
    const auto e = estimate_probe(merged, 1, EstimateTarget::kCuda).components;
    const auto w = estimate_probe(p.workload, 1, EstimateTarget::kCuda).components;
    ASSERT_TRUE(e.offloads_state);
    for (const auto& c : kComponentTable) {
      EXPECT_EQ(has_component(e, c), has_component(w, c)) << c.name;
      EXPECT_EQ(e.*c.member, w.*c.member) << c.name;
    }
    EXPECT_EQ(e.step_peak, p.step_peak);
    EXPECT_EQ(e.step_peak_reserved, p.step_peak_reserved);
    EXPECT_EQ(e.host_state, p.host_bytes);
    // What moves over rank 0's host link, from the parameters' shapes.
    std::int64_t moved = 0;
    const auto model = build_model(merged.model, c10::Device(c10::DeviceType::Meta));
    for (const auto& named : model->module().named_parameters()) {
      const auto rows = named.value().size(0);
      const auto padded = (rows + 1) / 2 * (named.value().numel() / rows) * 4;
      moved += padded * (named.key().starts_with("blocks.") ? 3 : 2);
    }
    EXPECT_EQ(p.host_transfer_bytes, moved);
    const auto j = plan_to_json(r).at("plans")[0];
    EXPECT_EQ(j.at("host_bytes"), p.host_bytes);
    EXPECT_EQ(j.at("host_transfer_bytes"), p.host_transfer_bytes);
  }
  options.search = PlanOptions::Search::kAuto;
  // A fixture under FSDP that keeps its shards on the device: the offload is its one distributed lever.
  auto fsdp = std::string(kWideVit);
  const std::string trainable = "  trainable: all\n";
  fsdp.insert(fsdp.find(trainable) + trainable.size(), "  distributed: {strategy: fsdp, world_size: 2}\n");
  write_file_atomically(dir / "wide_fsdp.yaml", fsdp);
  const auto own = plan_at(dir / "wide_fsdp.yaml", kCapacity, options);
  ASSERT_EQ(own.plans.size(), 1U);
  EXPECT_EQ(own.plans.front().change, nlohmann::json::parse(R"({"training":{"distributed":{"offload_policy":)"
                                                            R"("cpu_pinned"}}})"));
  EXPECT_GT(own.plans.front().host_transfer_bytes, 0);
  const auto roomy = plan_at(path, std::int64_t{140} << 20, options);
  ASSERT_EQ(roomy.plans.size(), 1U);
  EXPECT_TRUE(roomy.plans.front().levers.empty()) << "as it is beats every plan that offloads";
  EXPECT_EQ(roomy.plans.front().host_transfer_bytes, 0);
}

TEST(FsdpPlanTest, OneRankOnOneDeviceIsRefusedAndWhatFsdpRefusesIsNotSharded) {
  try {
    (void)plan_at(zoo_fixture("vit_tiny_full"), kFitsOnlySharded, over_ranks(1));
    FAIL() << "FSDP over one rank";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("vit_tiny_full.yaml: --world-size 1: the fixture trains on one device, "
                                               "and FSDP over one rank shards nothing: expected 2 or more ranks"));
  }
  const auto r = plan_at(zoo_fixture("ts_vit_tiny_timm"), 64 << 20, over_ranks(2));
  EXPECT_EQ(r.sharding, "a TorchScript model's parameters cannot be sharded");
  for (const auto& p : r.plans) EXPECT_EQ(p.strategy, "none");
  // Activation offload is refused over ranks: its plans are not sharded either.
  testing::TempDir dir;
  auto offload = read_text_file(zoo_fixture("vit_tiny_full"), "a fixture");
  const std::string trainable = "  trainable: all\n";
  offload.insert(offload.find(trainable) + trainable.size(), "  activation_offload: cpu\n");
  write_file_atomically(dir / "offload.yaml", offload);
  const auto o = plan_at(dir / "offload.yaml", 64 << 20, over_ranks(2));
  EXPECT_EQ(o.sharding, "no activation offload over ranks (training.activation_offload)");
  for (const auto& p : o.plans) EXPECT_EQ(p.strategy, "none");
}

}  // namespace
}  // namespace memgate
