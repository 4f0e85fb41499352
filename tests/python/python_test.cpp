// Python fixtures (arch: python): a user's own nn.Module, built by their Python code and measured by memgate's C++
// protocol in a Python process that imports memgate's extension. One protocol: timm's ViT with PEFT's LoRA and
// torchvision's ResNet equal the zoo's twins to the byte, per rank under DDP too; a transformers LLaMA that
// TorchScript cannot take is estimated within 1% and gated; bad input names the fixture, the key and the Python
// error's last line.
#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/gate/baseline.h"
#include "memgate/gate/fixture.h"
#include "memgate/gate/verdict.h"
#include "memgate/launch/estimate.h"
#include "memgate/launch/run.h"
#include "cli_fork.h"
#include "fixture_util.h"
#include "twins.h"
#include "test_util.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace memgate {
namespace {

using ::testing::HasSubstr;

using testing::kCpu;

using testing::expect_cuda_estimate_twins;
using testing::expect_equal_components;
using testing::expect_twins;

Fixture fixture(const std::string& name) { return testing::model_fixture(name); }

// The zoo's GPT frees in eval what eager PyTorch frees: c_fc's output before c_proj runs, the embeddings once the
// positions are added, ln_1's output once attn returns (a C++ temporary lives to the end of its whole expression; it
// kept each of these alive: eval_peak 4.4%, 7.2% and 10.5% above PyTorch's at batch 1, 2 and 4), and it keeps the
// positions until the body returns, as a Python local. The plain GPT's task (sum) has no targets: the zoo's batch
// holds B x seq_len int64 targets more, and that is the whole difference.
TEST(PythonFixtureTest, PlainPyTorchGptEvalForwardEqualsTheZoos) {
  const auto python = fixture("py_gpt_tiny_plain");
  const auto zoo = fixture("gpt_tiny");
  for (const std::int64_t b : {1, 4}) {
    const auto p = run_probe(python, b, kCpu);
    const auto z = run_probe(zoo, b, kCpu);
    ASSERT_FALSE(p.oom || z.oom) << p.error << z.error;
    const std::int64_t targets = b * std::get<GptOptions>(zoo.model.options).seq_len * 8;
    EXPECT_EQ(z.components.eval_peak, p.components.eval_peak + targets) << "batch " << b;
    EXPECT_EQ(p.components.params, z.components.params) << "batch " << b;
  }
}

// The zoo's linear layers are aten::linear, as nn.Linear's: under autocast the input, weight and bias are cast, a
// trainable weight's cast cached for the region (LibTorch's functional::linear cast a transposed view anew on every
// call and added the fp32 bias into the bf16 output through two fp32 temporaries: eval_peak up to 34% and
// forward_peak up to 269% away from eager PyTorch's on generated GPTs). Its LoRA casts a bf16 input to the adapter's
// fp32 first, as PEFT does. Every component of a plain-PyTorch twin, in bf16 with LoRA on qkv, proj and fc2, equals it.
TEST(PythonFixtureTest, PlainPyTorchGptTwinInBf16WithLoraEqualsTheZooToTheByte) {
  expect_twins("py_gpt_tiny_twin_bf16_lora", "gpt_tiny_bf16_lora", {1, 3});
}

// One launch of a reference tool (tools/fsdp_reference.py or ddp_reference.py) for several runs, `args` after the
// script: its runs (one run's object alone, as a list of one). Importing torch, timm and FSDP2 is most of a launch (5
// to 9 s here), so every run a test needs is asked of one launch, which forks each run's ranks afresh.
std::vector<nlohmann::json> reference_runs(const std::string& script, const std::string& args) {
  testing::TempDir dir;
  std::string log;
  const auto out = dir / "reference.json";
  if (testing::run(fmt::format("({} {}/tools/{} {} 2>/dev/null) > {}", MEMGATE_TORCH_PYTHON, testing::source_dir(),
                               script, args, out),
                   &log) != 0) {
    ADD_FAILURE() << script << " " << args << " failed: " << log;
    return {};
  }
  auto doc = nlohmann::json::parse(read_text_file(out, "the reference's JSON"));
  if (!doc.contains("runs")) return {std::move(doc)};
  return doc.at("runs").get<std::vector<nlohmann::json>>();
}

// One reference probe of a run: the rank's at the batch size.
const nlohmann::json* reference_probe(const nlohmann::json& run, std::size_t rank, std::int64_t batch) {
  for (const auto& e : run.at("ranks").at(rank)) {
    if (e.at("batch_size").get<std::int64_t>() == batch) return &e;
  }
  return nullptr;
}

// vit_tiny_fsdp over 4 ranks in bf16, resharding to groups of 2 after forward with an fp32 reduce, `trainable` as
// given: its YAML.
std::string vit_fsdp_bf16_yaml(const std::string& trainable) {
  auto yaml = read_text_file(testing::source_dir() + "/fixtures/models/vit_tiny_fsdp.yaml", "a fixture");
  const auto replace = [&yaml](const std::string& from, const std::string& to) {
    yaml.replace(yaml.find(from), from.size(), to);
  };
  replace("world_size: 2", "world_size: 4");
  replace("    units: blocks\n", "    units: blocks\n    reshard_after_forward: 2\n    reduce_dtype: fp32\n");
  replace("  trainable: all\n", "  trainable: " + trainable + "\n  precision: bf16\n");
  return yaml;
}

std::string issue72_gpt_yaml(bool tied, int world);
std::string gpt_offload_yaml(const std::string& offload, bool bf16);
std::string gpt_ddp_yaml(int world);

// FsdpReferenceTest's runs of FSDP2 and DdpReferenceTest's of DDP (tools/fsdp_reference.py, which runs a DDP fixture
// as tools/ddp_reference.py does), all in one launch (each run's ranks forked afresh from it, as in a launch of their
// own; importing torch, timm and FSDP2 is most of a launch; the two suites run in one process, GROUPS): the runs of
// `name`, one of "vit" (vit_fsdp_bf16_yaml("all") and ("head") at batch 1), "gpt" (issue72_gpt_yaml's tied then
// untied GPT, each without ranks and over 2 and 4, at batches 1 and 4), "offload" (gpt_offload_yaml("cpu") in fp32
// then bf16 over the fixture's 2 ranks at batch 1) and "ddp" (the TorchScript LM of torchscript_lm_ddp_yaml then the
// GPT of gpt_ddp_yaml, each over 2 and 4 ranks at batches 1 and 3), in that order. Made by the first test that asks.
std::vector<nlohmann::json> fsdp_reference_runs(const std::string& name) {
  struct Case {
    std::string test, file, yaml, worlds, batches;
  };
  static const std::vector<Case> cases{{"ddp", "ts_lm_ddp", testing::torchscript_lm_ddp_yaml(2), "2,4", "1,3"},
                                       {"ddp", "gpt_ddp", gpt_ddp_yaml(2), "2,4", "1,3"},
                                       {"vit", "vit_all", vit_fsdp_bf16_yaml("all"), "fixture", "1"},
                                       {"vit", "vit_head", vit_fsdp_bf16_yaml("head"), "fixture", "1"},
                                       {"gpt", "gpt_tied_301", issue72_gpt_yaml(true, 2), "0,2,4", "1,4"},
                                       {"gpt", "gpt_untied_250", issue72_gpt_yaml(false, 2), "0,2,4", "1,4"},
                                       {"offload", "gpt_offload", gpt_offload_yaml("cpu", false), "fixture", "1"},
                                       {"offload", "gpt_offload_bf16", gpt_offload_yaml("cpu", true), "fixture", "1"}};
  static const auto runs = [] {
    testing::TempDir dir;
    std::string args;
    for (const auto& c : cases) {
      write_file_atomically(dir / (c.file + ".yaml"), c.yaml);
      args += fmt::format(" --case {} {} {}", dir / (c.file + ".yaml"), c.worlds, c.batches);
    }
    return reference_runs("fsdp_reference.py", args);
  }();
  std::vector<nlohmann::json> mine;
  std::size_t next = 0;
  for (const auto& c : cases) {
    const auto count = c.worlds == "fixture" ? 1 : std::count(c.worlds.begin(), c.worlds.end(), ',') + 1;
    for (std::ptrdiff_t i = 0; i < count; ++i, ++next) {
      if (c.test == name && next < runs.size()) mine.push_back(runs[next]);
    }
  }
  EXPECT_EQ(runs.size(), next) << "tools/fsdp_reference.py: one run per case and world size";
  return mine;
}

// FSDP2 itself (tools/fsdp_reference.py: torch's fully_shard over Gloo ranks, timm's ViT, measured as memgate
// measures) against memgate's FSDP with bf16 parameters, an fp32 reduce and 4 ranks resharding to 2: there the
// unit's last gradient, which foreach_reduce's loop variable keeps until it returns, is part of the step's peak
// (memgate freed it and was 140 bytes low on every rank). There too Gloo averages the reduce-scatter's sum: it
// all-reduces a clone of the input and divides it by N on its worker thread, div_ making a 0-dim int64 of N (8 B) and
// its fp32 copy (4 B) while the clone lives, on top of the step's peak (memgate all-reduced with SUM and was 12 bytes
// low on every rank; torch.profiler's events of the reference show both on Gloo's thread). vit_fsdp_bf16_yaml(trainable)
// against FSDP2's own run: every component of every rank equal.
void expect_fsdp_reference(const std::string& trainable) {
  const auto runs = fsdp_reference_runs("vit");
  ASSERT_EQ(runs.size(), 2U);
  const auto& reference = runs[trainable == "all" ? 0 : 1];
  testing::TempDir dir;
  const auto path = dir / "vit_fsdp_bf16.yaml";
  write_file_atomically(path, vit_fsdp_bf16_yaml(trainable));
  const auto measured = run_probe(load_fixture(path), 1, kCpu);
  ASSERT_FALSE(measured.oom) << measured.error;
  ASSERT_EQ(measured.ranks.size(), 4U);
  for (const auto& rank : reference.at("ranks")) {
    for (const auto& e : rank) {
      const auto r = e.at("rank").get<std::size_t>();
      const auto& m = measured.ranks.at(r).components;
      for (const auto* c : {"params", "gradients", "optimizer_state", "activations", "forward_peak", "eval_peak",
                            "step_peak"}) {
        EXPECT_EQ(m.get(c), e.at(c).get<std::int64_t>()) << "rank " << r << ": " << c;
      }
    }
  }
}

TEST(FsdpReferenceTest, ForeachReduceKeepsTheLastGradientAsFsdp2Does) { expect_fsdp_reference("all"); }

// Frozen blocks (only the head trains): no gradient reaches them, so no pre-backward unshards them, and FSDP2's final
// post-backward reshards them from their post-forward parts to their shards without freeing those parts
// (FSDPParam.to_sharded; to_unsharded frees them only from SHARDED_POST_FORWARD). The next forward all-gathers the
// shards (a copy-in of a quarter of the unit) while the stale parts live on until the post-forward replaces them.
// memgate all-gathered from the stale parts (a copy-in of half): forward_peak and step_peak one quarter of a block's
// bf16 parameters too high (+6.8% and +4.4% on a generated ViT in the corpus's first sweep).
TEST(FsdpReferenceTest, FrozenUnitsReshardedToAGroupAllGatherTheirShardsAsFsdp2Does) { expect_fsdp_reference("head"); }

// Issue 72's two GPT patterns, each against PyTorch's own run: a GPT with tied embeddings and a vocabulary that is not
// a multiple of 8 (301: nor of 2 or 4, so the embedding's shards are padded), and an untied one (LLaMA's pieces:
// SwiGLU, RMSNorm, no learned positions or biases; vocabulary 250, padded over 4 ranks), each block an FSDP unit,
// reshard_after_forward unset (FSDP2's default). Over 2 and 4 ranks (FSDP2's fully_shard on Gloo) and without ranks
// (the plain model: what of a gap would be the model's own eval pass), at batches 1 and 4, every component of every
// rank equals PyTorch's to the byte (the untied GPT's step_peak at 2 ranks and batch 1 is a reduce-scatter's, with
// Gloo's average on top: see above). The issue's eval_peak (memgate 835,944 B against FSDP2's 861,024 B at 2 ranks and batch 4; 6,864 B low
// without ranks) shows on neither pattern, nor did it on the fixtures of earlier sweeps; nothing in memgate's FSDP,
// its GPT or its eval pass, nor in the reference, changed since the commit it was measured on.
std::string issue72_gpt_yaml(bool tied, int world) {
  const std::string model = tied ? "  vocab_size: 301\n  seq_len: 16\n  n_layer: 2\n  n_embd: 32\n  n_head: 4\n"
                                   "  mlp: gelu\n  norm: layernorm\n  position: learned\n  bias: true\n"
                                   "  tied_embeddings: true\n"
                                 : "  vocab_size: 250\n  seq_len: 16\n  n_layer: 2\n  n_embd: 48\n  n_head: 4\n"
                                   "  mlp: swiglu\n  norm: rmsnorm\n  position: none\n  bias: false\n"
                                   "  tied_embeddings: false\n";
  const auto distributed = world == 0 ? std::string()
                                      : fmt::format("  distributed:\n    strategy: fsdp\n    world_size: {}\n"
                                                    "    units: blocks\n", world);
  return "model:\n  arch: gpt\n" + model + "training:\n  optimizer: adamw\n  trainable: all\n" + distributed +
         "batch_sizes: [1, 4]\n";
}

TEST(FsdpReferenceTest, TiedGptWithAnOddVocabularyAndUntiedGptMeasureAsPyTorchWithAndWithoutRanks) {
  testing::TempDir dir;
  const auto runs = fsdp_reference_runs("gpt");
  ASSERT_EQ(runs.size(), 6U);
  std::size_t run_index = 0;
  for (const bool is_tied : {true, false}) {
    for (const int world : {0, 2, 4}) {
      const auto& run = runs[run_index++];
      ASSERT_EQ(run.at("world_size").get<int>(), world);
      const auto path = dir / fmt::format("gpt_{}.yaml", world);
      write_file_atomically(path, issue72_gpt_yaml(is_tied, world));
      const auto fixture = load_fixture(path);
      for (const std::int64_t batch : {1, 4}) {
        const auto measured = run_probe(fixture, batch, kCpu);
        ASSERT_FALSE(measured.oom) << measured.error;
        const auto ranks = static_cast<std::size_t>(std::max(world, 1));
        ASSERT_EQ(measured.ranks.size(), world == 0 ? 0U : ranks);
        for (std::size_t r = 0; r < ranks; ++r) {
          const auto at = fmt::format("{} GPT, {} ranks, rank {} at batch {}", is_tied ? "tied" : "untied", world, r,
                                      batch);
          const auto* e = reference_probe(run, r, batch);
          ASSERT_NE(e, nullptr) << at;
          const auto& m = world == 0 ? measured.components : measured.ranks.at(r).components;
          for (const auto* c : {"params", "gradients", "optimizer_state", "activations", "forward_peak", "eval_peak",
                                "step_peak"}) {
            EXPECT_EQ(m.get(c), e->at(c).get<std::int64_t>()) << at << ": " << c;
          }
        }
      }
    }
  }
}

// issue72_gpt_yaml's tied GPT over 2 ranks with FSDP2's offload_policy `offload` (training.distributed), in bf16
// (FSDP2's param_dtype) or not.
std::string gpt_offload_yaml(const std::string& offload, bool bf16) {
  auto yaml = issue72_gpt_yaml(true, 2);
  const auto insert_after = [&yaml](const std::string& line, const std::string& next) {
    yaml.insert(yaml.find(line) + line.size(), next);
  };
  insert_after("    units: blocks\n", "    offload_policy: " + offload + "\n");
  if (bf16) insert_after("  trainable: all\n", "  precision: bf16\n");
  return yaml;
}

// FSDP2's CPUOffloadPolicy(pin_memory=False) on Gloo CPU ranks (tools/fsdp_reference.py, the fixture's
// offload_policy: cpu): the shards, their gradients and AdamW's state are CPU tensors already, so FSDP2's `.to(cpu)`
// and `.to(device)` return them and nothing is copied; under a param_dtype the offloaded shards skip the foreach
// copy-in and are cast one by one (FSDPParam.all_gather_inputs), as memgate's do. In fp32 and bf16, every component of
// every rank equals PyTorch's, and equals memgate's own run of the fixture without offload.
TEST(FsdpReferenceTest, CpuOffloadOnCpuRanksMeasuresAsFsdp2DoesAndAsWithoutIt) {
  testing::TempDir dir;
  const auto fp32 = dir / "gpt_offload.yaml";
  const auto bf16 = dir / "gpt_offload_bf16.yaml";
  write_file_atomically(fp32, gpt_offload_yaml("cpu", false));
  write_file_atomically(bf16, gpt_offload_yaml("cpu", true));
  const auto runs = fsdp_reference_runs("offload");
  ASSERT_EQ(runs.size(), 2U);
  for (const bool is_bf16 : {false, true}) {
    const auto& run = runs[is_bf16 ? 1 : 0];
    ASSERT_EQ(run.at("fsdp").at("offload_policy").get<std::string>(), "cpu");
    const auto measured = run_probe(load_fixture(is_bf16 ? bf16 : fp32), 1, kCpu);
    ASSERT_FALSE(measured.oom) << measured.error;
    ASSERT_EQ(measured.ranks.size(), 2U);
    const auto plain_path = dir / "gpt_plain.yaml";
    write_file_atomically(plain_path, gpt_offload_yaml("none", is_bf16));
    const auto plain = run_probe(load_fixture(plain_path), 1, kCpu);
    ASSERT_FALSE(plain.oom) << plain.error;
    ASSERT_EQ(plain.ranks.size(), 2U);
    for (std::size_t r = 0; r < 2; ++r) {
      const auto at = fmt::format("{}, rank {}", is_bf16 ? "bf16" : "fp32", r);
      const auto* e = reference_probe(run, r, 1);
      ASSERT_NE(e, nullptr) << at;
      const auto& m = measured.ranks.at(r).components;
      for (const auto* c : {"params", "gradients", "optimizer_state", "activations", "forward_peak", "eval_peak",
                            "step_peak"}) {
        EXPECT_EQ(m.get(c), e->at(c).get<std::int64_t>()) << at << ": " << c;
        EXPECT_EQ(m.get(c), plain.ranks.at(r).components.get(c)) << at << ": " << c << " without offload";
      }
    }
  }
}

// The zoo's tied GPT of issue72_gpt_yaml (vocabulary 301) under DDP with its gradients as bucket views in buckets of
// 0.05 MB (several: 142,464 B of them), over `world` ranks.
std::string gpt_ddp_yaml(int world) {
  auto yaml = issue72_gpt_yaml(true, 0);
  yaml.insert(yaml.find("batch_sizes:"), fmt::format("  distributed:\n    strategy: ddp\n    world_size: {}\n"
                                                     "    gradient_as_bucket_view: true\n    bucket_cap_mb: 0.05\n",
                                                     world));
  return yaml;
}

// memgate's measurement of `yaml(world)` at 2 and 4 ranks and batches 1 and 3 against PyTorch's runs `first` and
// `first + 1` of fsdp_reference_runs("ddp"): activations, gradients, optimizer_state, forward_peak and DDP's bucket
// bytes equal on every rank; params, eval_peak and step_peak (read from before the build) the reference's less `loaded`
// bytes (what Python's loader keeps and memgate's does not: 0, or a TorchScript module's debug records, up to 64 KiB)
// on every rank, step_peak that or a few bytes more in PyTorch's (the Reducer's rebuild broadcasts, below).
void expect_ddp_reference(const std::function<std::string(int)>& yaml, std::size_t first, bool torchscript) {
  const auto runs = fsdp_reference_runs("ddp");
  ASSERT_EQ(runs.size(), 4U);
  testing::TempDir dir;
  for (const int world : {2, 4}) {
    const auto path = dir / fmt::format("ddp{}.yaml", world);
    write_file_atomically(path, yaml(world));
    const auto& reference = runs[first + (world == 2 ? 0 : 1)];
    ASSERT_EQ(reference.at("world_size").get<int>(), world);
    const auto fixture = load_fixture(path);
    for (const std::int64_t batch : {1, 3}) {
      const auto measured = run_probe(fixture, batch, kCpu);
      ASSERT_FALSE(measured.oom) << measured.error;
      ASSERT_EQ(measured.ranks.size(), static_cast<std::size_t>(world));
      std::int64_t checked = 0;
      for (const auto& rank : reference.at("ranks")) {
        for (const auto& e : rank) {
          if (e.at("batch_size").get<std::int64_t>() != batch) continue;
          const auto r = e.at("rank").get<std::size_t>();
          const auto& m = measured.ranks.at(r);
          const auto at = fmt::format("{} ranks, rank {} at batch {}", world, r, batch);
          for (const auto* c : {"activations", "gradients", "optimizer_state", "forward_peak"}) {
            EXPECT_EQ(m.components.get(c), e.at(c).get<std::int64_t>()) << at << ": " << c;
          }
          EXPECT_EQ(m.comm_buffer_bytes, e.at("comm_buffer_bytes").get<std::int64_t>()) << at;
          const auto loaded = e.at("params").get<std::int64_t>() - m.components.params;
          if (torchscript) {
            EXPECT_GT(loaded, 0) << at;
            EXPECT_LT(loaded, 64 * 1024) << at << ": more than the debug records of a 77 KB file";
          } else {
            EXPECT_EQ(loaded, 0) << at;
          }
          EXPECT_EQ(e.at("eval_peak").get<std::int64_t>() - m.components.eval_peak, loaded) << at;
          // What a bucket rebuild's broadcast may leave in PyTorch's count: its bucket sizes, its indices, or both.
          const auto sizes = 4 * e.at("comm_buffers").get<std::int64_t>();
          const auto indices = 4 * (testing::trainable_tensors(fixture) + 1);
          EXPECT_THAT(e.at("step_peak").get<std::int64_t>() - m.components.step_peak - loaded,
                      ::testing::AnyOf(0, sizes, indices, sizes + indices))
              << at;
          ++checked;
        }
      }
      EXPECT_EQ(checked, world) << "batch " << batch;
    }
  }
}

// PyTorch's own DistributedDataParallel (tools/ddp_reference.py) over the TorchScript token LM (task sum) with its
// gradients as bucket views: `loaded` is the source-range debug records that Python's torch.jit.load keeps and
// memgate's loader does not read (load_debug_files=false; 20,813 B for this module). step_peak is that, or a few bytes
// more in PyTorch's on a rank at random: the Reducer's bucket rebuild (the second iteration's forward) broadcasts the
// bucket sizes (an int32 per bucket) and the rebuilt indices (an int32 per parameter, and one) from C++, and Gloo's
// worker thread sometimes drops such a broadcast last, freeing its tensor where torch.profiler does not see the free
// (4 B on one rank of four in some runs; memgate lets Gloo go before it goes on). The reference's buffer sync before
// each forward did the same with its flat buffer (DDP's broadcast_coalesced: 1,024 B for this LM's buffers, in
// eval_peak and step_peak on one or two ranks of four in most runs); the reference now runs that broadcast fenced on
// the rank's thread.
TEST(DdpReferenceTest, ATorchScriptLmWithBucketViewsMeasuresAsPyTorchsDdp) {
  expect_ddp_reference(testing::torchscript_lm_ddp_yaml, 0, /*torchscript=*/true);
}

// The zoo's GPT (tied, vocabulary 301) in several buckets: every component of every rank equal, step_peak or those
// few bytes more in PyTorch's.
TEST(DdpReferenceTest, AZooGptWithBucketViewsInSeveralBucketsMeasuresAsPyTorchsDdp) {
  expect_ddp_reference(gpt_ddp_yaml, 2, /*torchscript=*/false);
}

TEST(PythonFixtureTest, TimmVitWithPeftLoraEqualsTheZooTwinToTheByte) {
  expect_twins("py_vit_tiny_lora_timm", "vit_tiny_lora", {1, 4});
}

TEST(PythonFixtureTest, TorchvisionResNetEqualsTheZooTwinToTheByte) {
  expect_twins("py_resnet_tiny_torchvision", "resnet_tiny_classify", {1, 2});
}

// DDP and FSDP over 2 ranks (each rank a Python process, real Gloo collectives), against the zoo's twin over 2 ranks:
// the same model, so every rank equals to the byte. Both fixtures are the suite's ResNet twins with a distributed
// block; FSDP's units are the Python model's blocks ("layer*.*": torchvision's BasicBlocks) and the zoo's.
void expect_distributed_twins(const std::string& distributed, bool buckets) {
  testing::TempDir dir;
  const auto models = testing::source_dir() + "/fixtures/models/";
  for (const auto* name : {"py_resnet_tiny_torchvision", "resnet_tiny_classify"}) {
    auto text = read_text_file(models + name + std::string(".yaml"), "a fixture");
    text.replace(text.find("  trainable: all\n"), 17, "  trainable: all\n" + distributed);
    if (const auto at = text.find("entry: python/"); at != std::string::npos) text.replace(at, 14, "entry: " + models + "python/");
    write_file_atomically(dir / (std::string(name) + "_ranks.yaml"), text);
  }
  const auto python = load_fixture(dir / "py_resnet_tiny_torchvision_ranks.yaml");
  const auto zoo = load_fixture(dir / "resnet_tiny_classify_ranks.yaml");
  ASSERT_TRUE(python.training.distributed.enabled());
  const auto p = run_probe(python, 2, kCpu);
  const auto z = run_probe(zoo, 2, kCpu);
  ASSERT_FALSE(p.oom) << p.error;
  ASSERT_EQ(p.ranks.size(), 2U);
  ASSERT_EQ(z.ranks.size(), 2U);
  for (std::size_t r = 0; r < 2; ++r) {
    expect_equal_components(p.ranks[r].components, z.ranks[r].components, fmt::format("rank {}", r));
    EXPECT_EQ(p.ranks[r].comm_buffer_bytes, z.ranks[r].comm_buffer_bytes) << "rank " << r;
    EXPECT_EQ(p.ranks[r].comm_buffers, z.ranks[r].comm_buffers) << "rank " << r;
    if (buckets) {
      EXPECT_GT(p.ranks[r].comm_buffers, 1) << "several buckets";
    }
  }
}

TEST(PythonFixtureTest, DdpOverTwoRanksEqualsTheZooTwinRankByRank) {
  expect_distributed_twins("  distributed:\n    strategy: ddp\n    world_size: 2\n    bucket_cap_mb: 0.25\n", true);
}

TEST(PythonFixtureTest, FsdpOverTwoRanksEqualsTheZooTwinRankByRank) {
  expect_distributed_twins("  distributed:\n    strategy: fsdp\n    world_size: 2\n    units: blocks\n", false);
}

TEST(PythonFixtureTest, AProfileCountsTheParametersInThePythonProcess) {
  const auto python = run_profile(fixture("py_vit_tiny_lora_timm"), {1}, kCpu);
  const auto zoo = workload_param_counts(fixture("vit_tiny_lora"));
  EXPECT_EQ(python.params.total, zoo.total);
  EXPECT_EQ(python.params.trainable, zoo.trainable);
  EXPECT_EQ(python.params.frozen, zoo.frozen);
  EXPECT_GT(python.params.trainable, 0);
}

TEST(PythonFixtureTest, TheSameProbeTwiceGivesTheSameBytes) {
  const auto llama = fixture("py_llama_tiny_lora");
  const auto a = run_probe(llama, 2, kCpu);
  const auto b = run_probe(llama, 2, kCpu);
  ASSERT_FALSE(a.oom) << a.error;
  expect_equal_components(a.components, b.components, "py_llama_tiny_lora at batch 2, twice");
}

TEST(PythonFixtureTest, CheckpointingThePythonBlocksKeepsFewerActivations) {
  auto plain = fixture("py_llama_tiny_lora");
  auto checkpointed = plain;
  checkpointed.training.gradient_checkpointing = true;
  // The probe's process reads the fixture's file: the variant is a file of its own beside it.
  testing::TempDir dir;
  auto text = read_text_file(plain.source, "a fixture");
  text.replace(text.find("training:\n"), 10, "training:\n  gradient_checkpointing: true\n");
  const auto path = testing::source_dir() + "/fixtures/models/py_llama_tiny_lora_ckpt_test.yaml";
  write_file_atomically(path, text);
  struct Remove {
    std::string path;
    ~Remove() { std::remove(path.c_str()); }
  } remove{path};
  checkpointed = load_fixture(path);
  ASSERT_TRUE(checkpointed.training.gradient_checkpointing);
  const auto p = run_probe(plain, 4, kCpu);
  const auto c = run_probe(checkpointed, 4, kCpu);
  ASSERT_FALSE(c.oom) << c.error;
  EXPECT_LT(c.components.activations, p.components.activations);
  EXPECT_EQ(c.components.params, p.components.params);
  EXPECT_EQ(c.components.gradients, p.components.gradients);
  EXPECT_EQ(c.components.optimizer_state, p.components.optimizer_state);
}

// The estimate runs the Python module on the Meta device in the Python process, through the same Meta kernels and
// caching-allocator model as the zoo's: for CUDA too, where the twins' estimates are equal. (The CPU estimate of
// the suite's Python fixtures against their measurement: EstimateAccuracyTest, tests/launch.)
TEST(PythonFixtureTest, TheEstimateForCudaOfTheTimmTwinEqualsTheZoosToTheByte) {
  expect_cuda_estimate_twins("py_vit_tiny_lora_timm", "vit_tiny_lora", {2, 8});
}

// The same for torchvision's ResNet. Its Python builder once built the full-width ResNet-18 on the probe's device and
// replaced its modules: the freed segments stayed reserved, 64 MiB in the estimate for CUDA as on an H200, where the
// zoo twin holds 4 MiB. With cuDNN's workspaces in the estimate, eval_peak alone may differ by one 8 KiB activation
// block at batch 1: torchvision's block frees a tensor a moment later than the zoo's C++ block does (its Python local
// outlives it), and a convolution's workspace is held at that moment (1,024 B apart, seen in the two snapshots).
TEST(PythonFixtureTest, TheEstimateForCudaOfTheTorchvisionTwinEqualsTheZoosToTheByte) {
  expect_cuda_estimate_twins("py_resnet_tiny_torchvision", "resnet_tiny_classify", {1, 4}, 8192);
}

// A pull request that adds dropout to the LLaMA's LoRA adapters (models.py's LLAMA_LORA_DROPOUT), with the fixture
// unchanged: the gate judges the changed Python code against the baseline of the unchanged code, and fails the
// components whose memory grew (dropout keeps its mask and output for backward, in training only).
TEST(PythonFixtureTest, TheGateFailsAPythonCodeChangeThatKeepsMoreActivations) {
  testing::TempDir dir;
  const auto source = testing::source_dir() + "/fixtures/models/";
  write_file_atomically(dir / "py_llama_tiny_lora.yaml", read_text_file(source + "py_llama_tiny_lora.yaml", "a fixture"));
  const auto code = read_text_file(source + "python/models.py", "a Python file");
  write_file_atomically(dir / "python/models.py", code);
  const auto fixture = load_fixture(dir / "py_llama_tiny_lora.yaml");
  const auto info = describe_probe_device(kCpu, fixture);
  const auto path = baseline_path(dir / "baselines", info.slug, fixture.name);
  const std::int64_t batch = 4;
  const auto before = run_probe(fixture, batch, kCpu);
  ASSERT_TRUE(update_baseline(path, fixture, info, {before}, "test"));
  const auto baseline = load_baseline(path);

  auto mutated = code;
  const std::string from = "LLAMA_LORA_DROPOUT = 0.0";
  ASSERT_NE(mutated.find(from), std::string::npos);
  mutated.replace(mutated.find(from), from.size(), "LLAMA_LORA_DROPOUT = 0.1");
  write_file_atomically(dir / "python/models.py", mutated);
  const auto after = run_probe(fixture, batch, kCpu);
  ASSERT_FALSE(after.oom) << after.error;
  std::cout << fmt::format("activations {} -> {} bytes (+{:.1f}%)\n", before.components.activations,
                           after.components.activations,
                           100.0 * static_cast<double>(after.components.activations - before.components.activations) /
                               static_cast<double>(before.components.activations));
  const std::set<std::string> grows = {"activations", "forward_peak", "step_peak", "step_peak_reserved"};
  for (const auto& c : kComponentTable) {
    if (!keeps_component(fixture.training, c)) continue;
    const auto v = evaluate_component(fixture, after, std::string(c.name), &baseline, path, info);
    const auto expected = grows.contains(std::string(c.name)) ? Status::kRegression : Status::kOk;
    EXPECT_EQ(name_of(kStatusNames, v.status), name_of(kStatusNames, expected))
        << c.name << ": " << v.baseline.value_or(-1) << " -> " << v.measured.value_or(-1) << "\n" << v.message;
  }
}

// A fixture of fixtures/models whose entry is fixtures/models/python/models.py:`callable`, through a noting.py that
// notes each process importing it (its pid and its parent's), with `build_code` after it; its copy is dir/f.yaml.
std::string noting_fixture(const testing::TempDir& dir, const std::string& fixture_name = "py_vit_tiny_lora_timm",
                           const std::string& callable = "timm_vit_lora", const std::string& build_code = "") {
  const auto models = testing::source_dir() + "/fixtures/models/";
  testing::write_file(dir / "noting.py", "import os\nimport sys\n\nsys.path.insert(0, r'" + models + "python')\n" +
                                             "with open(r'" + (dir / "pids.txt") + "', 'a') as f:\n" +
                                             "    f.write(f'{os.getpid()} {os.getppid()}\\n')\n" +
                                             "from models import " + callable + "  # noqa: E402\n" + build_code);
  auto yaml = read_text_file(models + fixture_name + ".yaml", "a fixture");
  yaml.replace(yaml.find("entry: python/models.py:"), 24, "entry: " + (dir / "noting.py:"));
  write_file_atomically(dir / "f.yaml", yaml);
  return dir / "f.yaml";
}

// The processes that imported the model's module, in order, each with its parent (pids.txt has a line per import:
// a process may import it more than once).
std::vector<std::pair<long, long>> noted(const testing::TempDir& dir) {
  std::vector<std::pair<long, long>> out;
  std::istringstream lines(testing::read_file(dir / "pids.txt"));
  for (long pid = 0, parent = 0; lines >> pid >> parent;) {
    if (std::find(out.begin(), out.end(), std::pair{pid, parent}) == out.end()) out.emplace_back(pid, parent);
  }
  return out;
}

// torch.compile: the compiled module's step, measured by the same protocol. Parameters, gradients and optimizer state
// are the module's and the optimizer's, as in eager; what the forward keeps and the peaks are Inductor's (fused
// kernels save other tensors than eager's ops), and repeat to the byte.
TEST(PythonCompileTest, ACompiledStepIsMeasuredAndItsActivationsAreInductors) {
  // Inductor checks every x86 vector ISA the CPU has by loading a test library in a Python subprocess that imports
  // torch, in each process that compiles (ten of them here, 13 s of a compiled probe's 18 s with its caches warm).
  // TORCHINDUCTOR_VEC_ISA_OK=1 skips the checks of the plain ISAs, which cpuid has already vouched for; the ISA it
  // picks, its kernels and their bytes are the same. The checks of the AVX-512 extensions remain (six, 11 s): the
  // compiled probes' fork server (_forkserver.py --inductor) makes them once for both.
  ::setenv("TORCHINDUCTOR_VEC_ISA_OK", "1", 0);
  const auto eager = fixture("py_resnet_tiny_torchvision");
  // The compiled fixture through a models.py that notes each process importing it (its pid and its parent's).
  testing::TempDir dir;
  const auto compiled =
      load_fixture(noting_fixture(dir, "py_resnet_tiny_torchvision_compiled", "torchvision_resnet"));
  const std::int64_t b = 4;
  const auto e = run_probe(eager, b, kCpu);
  const auto c = run_probe(compiled, b, kCpu);
  const auto again = run_probe(compiled, b, kCpu);
  // Both compiled probes forked from one server, which made Inductor's checks before it was ready: a server that
  // refused (a thread left by its checks, say) would leave each probe to make them itself, seconds each.
  const auto forks = noted(dir);
  ASSERT_EQ(forks.size(), 2U);
  EXPECT_EQ(forks[0].second, forks[1].second) << "one server";
  EXPECT_NE(forks[0].second, static_cast<long>(::getpid())) << "forked by the server, not started by this process";
  ASSERT_FALSE(c.oom) << c.error;
  EXPECT_EQ(c.components.params, e.components.params);
  EXPECT_EQ(c.components.gradients, e.components.gradients);
  EXPECT_EQ(c.components.optimizer_state, e.components.optimizer_state);
  EXPECT_NE(c.components.activations, e.components.activations);
  expect_equal_components(again.components, c.components, "the compiled probe twice");
  for (const auto& info : kComponentTable) {
    const auto x = e.components.*info.member, y = c.components.*info.member;
    std::cout << fmt::format("[ COMPILE  ] {:<20} eager {:>10} compiled {:>10} ({:+.1f}%)\n", info.name, x, y,
                             x == 0 ? 0.0 : 100.0 * static_cast<double>(y - x) / static_cast<double>(x));
  }
}

// --- The fork server: a process's Python probes forked from one warm Python (src/launch/fork_server.h) -----------

// Two probes in this process are two processes, each forked from the same Python (not this process): the first
// imports timm and PEFT itself, the second finds them imported in the server. Each measures to the byte what a
// process started directly measures (MEMGATE_FORK_SERVER=0; one such process, which imports torch, timm and PEFT
// itself: 3.6 s here).
TEST(PythonForkServerTest, ProbesAreForkedFromOneWarmPythonAndMeasureAsProcessesStartedDirectly) {
  testing::TempDir dir;
  const auto f = load_fixture(noting_fixture(dir));
  const std::int64_t batch = 2;
  std::vector<ProbeResult> forked;
  for (int i = 0; i < 2; ++i) forked.push_back(run_probe(f, batch, kCpu));
  const auto forks = noted(dir);
  ASSERT_EQ(forks.size(), 2U);
  for (const auto& [pid, parent] : forks) {
    EXPECT_EQ(parent, forks.front().second) << "one server";
    EXPECT_NE(parent, static_cast<long>(::getpid())) << "forked by the server, not started by this process";
  }
  EXPECT_NE(forks[0].first, forks[1].first) << "a process per probe";
  ::setenv("MEMGATE_FORK_SERVER", "0", 1);
  const auto direct = run_probe(f, batch, kCpu);
  ::unsetenv("MEMGATE_FORK_SERVER");
  const auto all = noted(dir);
  ASSERT_EQ(all.size(), 3U);
  EXPECT_EQ(all[2].second, static_cast<long>(::getpid())) << "started directly";
  ASSERT_FALSE(direct.oom) << direct.error;
  for (std::size_t i = 0; i < forked.size(); ++i) {
    ASSERT_FALSE(forked[i].oom) << forked[i].error;
    expect_equal_components(forked[i].components, direct.components,
                            fmt::format("probe {} ({}) forked and one started directly", i,
                                        i == 0 ? "importing timm and PEFT itself" : "finding them imported"));
  }
}

// A forked probe that dies is named as one started directly is, with the same cause; the server forks the next.
TEST(PythonForkServerTest, AForkedProbeThatIsKilledIsNamedWithItsSignal) {
  testing::TempDir dir;
  const auto path = noting_fixture(dir, "py_vit_tiny_lora_timm", "timm_vit_lora",
                                   "\n\ndef killed(**kwargs):\n    import signal\n"
                                   "    os.kill(os.getpid(), signal.SIGSEGV)\n");
  auto yaml = testing::read_file(path);
  yaml.replace(yaml.find("noting.py:timm_vit_lora"), 23, "noting.py:killed");
  testing::write_file(dir / "killed.yaml", yaml);
  const auto messages = [&] {
    try {
      (void)run_probe(load_fixture(dir / "killed.yaml"), 1, kCpu);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const auto forked = messages();
  EXPECT_THAT(forked, HasSubstr("its Python probe was killed by signal 11"));
  ::setenv("MEMGATE_FORK_SERVER", "0", 1);
  const auto direct = messages();
  ::unsetenv("MEMGATE_FORK_SERVER");
  EXPECT_THAT(direct, HasSubstr("its Python probe was killed by signal 11"));
  const auto after = run_probe(load_fixture(path), 1, kCpu);
  EXPECT_FALSE(after.oom) << after.error;
  const auto pids = noted(dir);
  ASSERT_EQ(pids.size(), 3U);
  EXPECT_EQ(pids[2].second, pids[0].second) << "the same server forks the next probe";
}

// --- Bad input: exit 3, naming the fixture, the key and the Python error's last line -------------------------------

struct BadPython {
  std::string name;
  std::string fixture_model;  ///< the fixture's model: section (after `model:\n`)
  std::string code;           ///< models.py beside the fixture
  std::string env;            ///< before the command
  std::vector<std::string> says;
};

void PrintTo(const BadPython& c, std::ostream* os) { *os << c.name; }

const std::string kInputs = "  inputs:\n    - {shape: [B, 4], dtype: float32}\n  task: sum\n";
const std::string kCode = "import torch\n\ndef build():\n    return torch.nn.Linear(4, 2)\n\n"
                          "def boom():\n    raise ValueError('no such variant: vit_huge')\n\n"
                          "def not_a_module():\n    return 42\n";

std::vector<BadPython> bad_inputs() {
  const auto model = [](const std::string& entry, const std::string& extra = "") {
    return "  arch: python\n  entry: " + entry + "\n" + kInputs + extra;
  };
  return {
      {"entry_file_missing", model("nothere.py:build"), kCode, "", {"f.yaml", "model.entry", "nothere.py", "not there"}},
      {"entry_not_a_pair", model("models.py"), kCode, "", {"f.yaml", "model.entry", "<file.py or dotted.module>:<callable>"}},
      {"callable_missing", model("models.py:nope"), kCode, "", {"f.yaml", "model.entry", "has no attribute 'nope'"}},
      {"callable_raises", model("models.py:boom"), kCode, "", {"f.yaml", "model.entry", "ValueError: no such variant: vit_huge"}},
      {"not_a_module", model("models.py:not_a_module"), kCode, "", {"f.yaml", "model.entry", "expected a torch.nn.Module"}},
      {"import_error", model("models.py:build"), "import not_a_module_anywhere\n" + kCode, "",
       {"f.yaml", "model.entry", "ModuleNotFoundError: No module named 'not_a_module_anywhere'"}},
      {"dotted_module_missing", model("no_such_pkg.models:build"), kCode, "",
       {"f.yaml", "model.entry", "ModuleNotFoundError: No module named 'no_such_pkg'"}},
      {"blocks_match_nothing", model("models.py:build", "  blocks: \"layers.*\"\n"), kCode, "",
       {"f.yaml", "model.blocks", "'layers.*' matches no module"}},
      {"python_not_there", model("models.py:build", "  python: /nonexistent/python3\n"), kCode, "",
       {"f.yaml", "/nonexistent/python3", "model.python", "which is not there"}},
      {"python_without_torch", model("models.py:build"), kCode, "MEMGATE_PYTHON=/usr/bin/python3",
       {"f.yaml", "/usr/bin/python3", "memgate needs torch", "which has none"}},
      {"python_with_another_torch", model("models.py:build"), kCode, "PYTHONPATH={dir}/faketorch",
       {"f.yaml", "built for torch", "has torch 1.13.1"}},
  };
}

// A Python fixture's profile probes every batch size in one Python process, its imports paid once (issue 43: three
// processes each importing torch and the user's libraries cost seconds), and each probe there gives the bytes of a
// Python process of its own.
TEST(PythonProfileTest, ProbesEveryBatchSizeInOnePythonProcessWithEachProbesOwnBytes) {
  testing::TempDir dir;
  const auto imports = dir / "imports.txt";
  // Each process that builds the model leaves its pid (the model's module may run more than once in a process).
  testing::write_file(dir / "models.py", "import os\nimport torch\n\nwith open(r'" + imports + "', 'a') as f:\n"
                                         "    f.write(f'{os.getpid()}\\n')\n\n"
                                         "def build():\n"
                                         "    return torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.ReLU(),\n"
                                         "                               torch.nn.Linear(64, 2))\n");
  testing::write_file(dir / "f.yaml", "model:\n  arch: python\n  entry: models.py:build\n" + kInputs +
                                          "batch_sizes: [1, 2, 4]\n");
  const auto f = load_fixture(dir / "f.yaml");
  const auto profile = run_profile(f, {1, 2, 4}, kCpu);
  const auto processes = [&] {
    std::set<std::string> pids;
    std::istringstream lines(testing::read_file(imports));
    for (std::string line; std::getline(lines, line);) pids.insert(line);
    return pids.size();
  };
  EXPECT_EQ(processes(), 1U) << "one Python process for the profile";
  ASSERT_EQ(profile.probes.size(), 3U);
  EXPECT_GT(profile.params.total, 0);
  for (const auto& p : profile.probes) {
    ASSERT_FALSE(p.oom) << p.error;
    const auto alone = run_probe(f, p.batch_size, kCpu);
    expect_equal_components(p.components, alone.components,
                            "batch " + std::to_string(p.batch_size) + " in the profile's process and in its own");
  }
  EXPECT_EQ(processes(), 4U) << "and one for each probe of its own";
  EXPECT_GT(profile.probes[2].components.activations, profile.probes[0].components.activations);
}

class BadPythonTest : public ::testing::TestWithParam<BadPython> {};

TEST_P(BadPythonTest, ExitsWithThreeNamingTheFixtureTheKeyAndThePythonError) {
  const auto& c = GetParam();
  testing::TempDir dir;
  testing::write_file(dir / "f.yaml", "model:\n" + c.fixture_model + "batch_sizes: [1]\n");
  testing::write_file(dir / "models.py", c.code);
  testing::write_file(dir / "faketorch/torch/__init__.py", "__version__ = '1.13.1'\n");
  auto env = c.env;
  if (const auto at = env.find("{dir}"); at != std::string::npos) env.replace(at, 5, dir.path().string());
  // Forked from this program (tests/common/cli_fork.h), its probes from this program's Python fork server where their
  // Python and environment are this program's (lend_python_fork_server: ~1.5 CPU-s of a case's ~1.7).
  const auto run = testing::run_memgate(dir.path().string(), env,
                                        fmt::format("profile --config {} --device cpu", dir / "f.yaml"),
                                        /*real=*/false, /*lend_python_server=*/true);
  const std::string& output = run.output;
  EXPECT_EQ(run.exit_code, 3) << output;
  for (const auto& s : c.says) EXPECT_THAT(output, HasSubstr(s)) << c.name;
  EXPECT_THAT(output, ::testing::Not(HasSubstr("Traceback"))) << "a traceback instead of one line";
}

std::string bad_name(const ::testing::TestParamInfo<BadPython>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(Catalogue, BadPythonTest, ::testing::ValuesIn(bad_inputs()), bad_name);

}  // namespace
}  // namespace memgate

namespace memgate {
namespace {

// One built module serves every batch size of an estimate process (issue 59: the build was most of a ViT-B's 0.2 s
// per estimate): the builder runs for the parameter count and the first probe, and the later probes replay the
// first's build (CountingMetaAllocator::BuildRecord) with the module as it left it. A module that a probe leaves
// otherwise (a tensor it keeps from its first forward, a hook it adds) is built anew for the next probe. Either way
// each estimate equals, to the byte, that of a process of its own, for CUDA and for the CPU. First of its suite: its
// 24 estimates fork from a server that has imported torch alone (0.10 CPU-s each), not from one that the next test's
// timm, PEFT and transformers have grown (0.20 each).
TEST(PythonEstimateSpeedTest, OneBuiltModuleServesEveryBatchSizeUnlessAProbeLeftItChanged) {
  testing::TempDir dir;
  testing::write_file(dir / "models.py",
                      "import torch\n\n"
                      "def _noted(kind):\n"
                      "    with open(r'" + (dir / "builds.txt") + "', 'a') as f:\n"
                      "        f.write(kind + '\\n')\n\n"
                      "class Net(torch.nn.Module):\n"
                      "    def __init__(self, keeps):\n"
                      "        super().__init__()\n"
                      "        self.keeps = keeps\n"
                      "        self.cache = None\n"
                      "        self.body = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.ReLU(), "
                      "torch.nn.Linear(64, 2))\n\n"
                      "    def forward(self, x):\n"
                      "        if self.keeps == 'tensor' and self.cache is None:\n"
                      "            self.cache = torch.zeros(64, 64, device=x.device)\n"
                      "        if self.keeps == 'hook' and not self._forward_hooks:\n"
                      "            self.register_forward_hook(lambda module, args, out: None)\n"
                      "        return self.body(x)\n\n"
                      "def build(keeps):\n"
                      "    _noted(keeps)\n"
                      "    return Net(keeps)\n");
  const std::vector<std::int64_t> batches = {2, 5, 3};
  for (const auto* keeps : {"nothing", "tensor", "hook"}) {
    testing::write_file(dir / "f.yaml", fmt::format("model:\n  arch: python\n  entry: models.py:build\n  args: "
                                                    "{{keeps: {}}}\n{}batch_sizes: [2]\n", keeps, kInputs));
    const auto f = load_fixture(dir / "f.yaml");
    for (const auto target : {EstimateTarget::kCuda, EstimateTarget::kCpu}) {
      const auto what = fmt::format("a module that keeps {}, estimated for {}", keeps,
                                    target == EstimateTarget::kCuda ? "CUDA" : "the CPU");
      std::vector<ProbeResult> alone;
      for (const auto b : batches) alone.push_back(estimate_probe(f, b, target));
      std::filesystem::remove(dir / "builds.txt");
      const auto together = estimate_profile(f, batches, target);
      std::istringstream lines(testing::read_file(dir / "builds.txt"));
      int builds = 0;
      for (std::string line; std::getline(lines, line);) ++builds;
      // The parameter count's build, then the first probe's; the others' too where the module was changed.
      EXPECT_EQ(builds, std::string(keeps) == "nothing" ? 2 : 1 + static_cast<int>(batches.size())) << what;
      ASSERT_EQ(together.probes.size(), batches.size());
      for (std::size_t i = 0; i < batches.size(); ++i) {
        ASSERT_FALSE(alone[i].failed || together.probes[i].failed) << alone[i].error << together.probes[i].error;
        expect_equal_components(together.probes[i].components, alone[i].components,
                                fmt::format("{} at batch {}: in one process, and in a process of its own", what,
                                            batches[i]));
      }
    }
  }
}

}  // namespace
}  // namespace memgate

namespace memgate {
namespace {

// A Python fixture's estimates as a search makes them (issue 59: a ViT-B with LoRA took 0.8 s per estimate, 54 s for
// --all-gpus): several batch sizes in one Python process, forked from a server whose imports Python's collector no
// longer walks (gc.freeze). Each component of each batch size equals, to the byte, the estimate of a process of its
// own as memgate made it before (MEMGATE_GC_FREEZE=0: every object walked by each collection; such a probe forks from
// the same server and unfreezes what it froze), for the timm ViT with PEFT's LoRA and for the transformers LLaMA. (The
// search, every GPU's in step: tests/advise.)
TEST(PythonEstimateSpeedTest, EstimatesInOneProcessEqualEachInAProcessOfItsOwn) {
  const std::vector<std::int64_t> batches = {1, 3, 8};
  for (const auto* name : {"py_vit_tiny_lora_timm", "py_llama_tiny_lora"}) {
    const auto f = fixture(name);
    for (const auto target : {EstimateTarget::kCuda, EstimateTarget::kCpu}) {
      const auto for_what = target == EstimateTarget::kCuda ? "CUDA" : "the CPU";
      ::setenv("MEMGATE_GC_FREEZE", "0", 1);
      std::vector<ProbeResult> alone;
      for (const auto b : batches) alone.push_back(estimate_probe(f, b, target));
      ::unsetenv("MEMGATE_GC_FREEZE");
      const auto together = estimate_profile(f, batches, target);
      ASSERT_EQ(together.probes.size(), batches.size());
      for (std::size_t i = 0; i < batches.size(); ++i) {
        ASSERT_FALSE(alone[i].failed || together.probes[i].failed) << alone[i].error << together.probes[i].error;
        expect_equal_components(together.probes[i].components, alone[i].components,
                                fmt::format("{}, estimate for {} at batch {}: in one process with the others, and "
                                            "in a process of its own", name, for_what, batches[i]));
        EXPECT_TRUE(together.probes[i].modules == alone[i].modules) << name << " batch " << batches[i];
      }
    }
  }
}

}  // namespace
}  // namespace memgate
