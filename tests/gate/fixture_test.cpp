// Fixture loading: valid files load with defaults; bad input names the file, the key, the line and the expectation.
#include "memgate/base/error.h"
#include "memgate/gate/fixture.h"
#include "fixture_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace memgate {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::tiny_vit_yaml;
using testing::write_file;

std::string load_error(const std::string& yaml) {
  TempDir dir;
  const auto path = dir / "bad.yaml";
  write_file(path, yaml);
  try {
    (void)load_fixture(path);
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_THAT(message, HasSubstr("bad.yaml")) << "the error must name the file";
    return message;
  }
  ADD_FAILURE() << "loaded without error:\n" << yaml;
  return {};
}

TEST(FixtureTest, LoadsAVitWithLoraAndDefaults) {
  const auto f = testing::fixture_from(tiny_vit_yaml("  trainable: lora\n", "  lora: {rank: 4, alpha: 8}\n"), "tiny");
  EXPECT_EQ(f.name, "tiny");
  const auto& vit = std::get<VitOptions>(f.model.options);
  EXPECT_EQ(vit.embed_dim, 64);
  EXPECT_EQ(vit.lora.rank, 4);
  EXPECT_EQ(vit.lora.targets, std::vector<std::string>{"qkv"});
  EXPECT_EQ(f.training.trainable.kind, TrainableSpec::Kind::kLora);
  EXPECT_EQ(f.training.accumulation_steps, 1);
  EXPECT_EQ(f.batch_sizes, (std::vector<std::int64_t>{1, 2, 4, 8}));
  EXPECT_EQ(f.hash.rfind("fnv1a64:", 0), 0U);
}

TEST(FixtureTest, HashFollowsTheModelNotTheBatchSizesOrFormatting) {
  const auto a = testing::fixture_from(tiny_vit_yaml());
  auto reordered = tiny_vit_yaml();
  reordered.replace(reordered.find("batch_sizes: [1, 2, 4, 8]"), 25, "batch_sizes: [16]   # more");
  const auto b = testing::fixture_from(reordered);
  EXPECT_EQ(a.hash, b.hash);
  const auto c = testing::fixture_from(tiny_vit_yaml("", "  mlp_ratio: 2.0\n"));
  EXPECT_NE(a.hash, c.hash);
  const auto d = testing::fixture_from(tiny_vit_yaml("", "  mlp_ratio: 4.0\n"));  // the default, spelled out
  EXPECT_EQ(a.hash, d.hash);
  // An option added after fixtures were hashed leaves their hash alone when off, and changes it when on.
  EXPECT_EQ(a.hash, testing::fixture_from(tiny_vit_yaml("", "  proj_drop: 0.0\n")).hash);
  const auto dropout = testing::fixture_from(tiny_vit_yaml("", "  proj_drop: 0.1\n"));
  EXPECT_NE(a.hash, dropout.hash);
  EXPECT_DOUBLE_EQ(std::get<VitOptions>(dropout.model.options).proj_drop, 0.1);
  EXPECT_THAT(load_error(tiny_vit_yaml("", "  proj_drop: 1.0\n")), HasSubstr("model.proj_drop"));
}

TEST(FixtureTest, DistributedTrainingReadsPyTorchsDefaultsAndNamesBadKeys) {
  const auto plain = testing::fixture_from(tiny_vit_yaml());
  EXPECT_FALSE(plain.training.distributed.enabled());
  const auto ddp = testing::fixture_from(tiny_vit_yaml("  distributed: {strategy: ddp, world_size: 4}\n"));
  const auto& d = ddp.training.distributed;
  EXPECT_EQ(d.strategy, DistributedStrategy::kDdp);
  EXPECT_EQ(d.world_size, 4);
  EXPECT_FALSE(d.gradient_as_bucket_view);
  EXPECT_EQ(d.bucket_bytes_cap(), 25 << 20) << "DistributedDataParallel's default bucket_cap_mb";
  EXPECT_EQ(d.first_bucket_bytes_cap(), 1 << 20) << "dist._DEFAULT_FIRST_BUCKET_BYTES when bucket_cap_mb is unset";
  EXPECT_NE(ddp.hash, plain.hash) << "training over ranks is another workload";
  const auto capped = testing::fixture_from(
      tiny_vit_yaml("  distributed: {strategy: ddp, world_size: 2, bucket_cap_mb: 0.5, gradient_as_bucket_view: true}\n"));
  EXPECT_EQ(capped.training.distributed.bucket_bytes_cap(), 512 << 10);
  EXPECT_EQ(capped.training.distributed.first_bucket_bytes_cap(), 512 << 10) << "a given cap caps the first bucket too";
  EXPECT_TRUE(capped.training.distributed.gradient_as_bucket_view);

  EXPECT_THAT(load_error(tiny_vit_yaml("  distributed: {world_size: 2}\n")), HasSubstr("training.distributed.strategy"));
  EXPECT_THAT(load_error(tiny_vit_yaml("  distributed: {strategy: zero3, world_size: 2}\n")),
              HasSubstr("training.distributed.strategy"));
  EXPECT_THAT(load_error(tiny_vit_yaml("  distributed: {strategy: ddp}\n")), HasSubstr("training.distributed.world_size"));
  EXPECT_THAT(load_error(tiny_vit_yaml("  distributed: {strategy: ddp, world_size: 0}\n")),
              HasSubstr("training.distributed.world_size"));
  EXPECT_THAT(load_error(tiny_vit_yaml("  distributed: {strategy: ddp, world_size: 2, bucket_cap_mb: 0}\n")),
              HasSubstr("training.distributed.bucket_cap_mb"));
  EXPECT_THAT(load_error(tiny_vit_yaml("  distributed: {strategy: ddp, world_size: 2, buckets: 3}\n")),
              HasSubstr("training.distributed.buckets"));

  const auto fsdp = testing::fixture_from(tiny_vit_yaml("  distributed: {strategy: fsdp, world_size: 4}\n"));
  const auto& f = fsdp.training.distributed;
  EXPECT_EQ(f.strategy, DistributedStrategy::kFsdp);
  EXPECT_EQ(f.units, "blocks");
  EXPECT_FALSE(f.reshard_after_forward.has_value()) << "fully_shard's None: the blocks reshard, the root does not";
  EXPECT_EQ(f.backward_prefetch, 1);
  const auto reshard = [](const std::string& value) {
    return testing::fixture_from(tiny_vit_yaml("  distributed: {strategy: fsdp, world_size: 4, reshard_after_forward: " +
                                               value + "}\n"))
        .training.distributed;
  };
  EXPECT_EQ(reshard("true").reshard_after_forward, std::optional<bool>(true));
  EXPECT_EQ(reshard("false").reshard_after_forward, std::optional<bool>(false));
  // The group a unit reshards to (0: none), for a block and for the root.
  EXPECT_EQ(f.reshard_group(false), 4) << "FSDP2's None: a block reshards fully";
  EXPECT_EQ(f.reshard_group(true), 0) << "FSDP2's None: the root keeps its parameters";
  EXPECT_EQ(reshard("true").reshard_group(true), 4);
  EXPECT_EQ(reshard("false").reshard_group(false), 0);
  EXPECT_EQ(reshard("4").reshard_group(true), 4) << "the world size: the whole group, as true";
  EXPECT_EQ(reshard("1").reshard_group(false), 0) << "1: no reshard, as false";
  EXPECT_EQ(reshard("2").reshard_group(false), 2) << "a divisor: FSDP2's post-forward mesh of 2 ranks";
  EXPECT_EQ(reshard("2").reshard_group(true), 2) << "given, the root too";
  EXPECT_THAT(load_error(tiny_vit_yaml("  distributed: {strategy: fsdp, world_size: 4, reshard_after_forward: 3}\n")),
              AllOf(HasSubstr("training.distributed.reshard_after_forward"),
                    HasSubstr("an integer that divides the world size 4"), HasSubstr("'3'")));
  EXPECT_THAT(load_error(tiny_vit_yaml("  distributed: {strategy: fsdp, world_size: 4, reshard_after_forward: 0}\n")),
              HasSubstr("training.distributed.reshard_after_forward"));
  EXPECT_THAT(load_error(tiny_vit_yaml("  distributed: {strategy: fsdp, world_size: 2, reshard_after_forward: yes}\n")),
              HasSubstr("training.distributed.reshard_after_forward"));
  EXPECT_THAT(load_error(tiny_vit_yaml("  distributed: {strategy: fsdp, world_size: 2, units: layers}\n")),
              AllOf(HasSubstr("training.distributed.units"), HasSubstr("blocks")));
  EXPECT_THAT(load_error(tiny_vit_yaml("  distributed: {strategy: fsdp, world_size: 2, backward_prefetch: 0}\n")),
              HasSubstr("training.distributed.backward_prefetch"));
  EXPECT_THAT(load_error(tiny_vit_yaml("  distributed: {strategy: fsdp, world_size: 2, bucket_cap_mb: 25}\n")),
              HasSubstr("no DDP key with strategy fsdp"));
  EXPECT_THAT(load_error(tiny_vit_yaml("  distributed: {strategy: ddp, world_size: 2, units: blocks}\n")),
              HasSubstr("no FSDP key with strategy ddp"));
  EXPECT_FALSE(f.reduce_dtype.has_value()) << "MixedPrecisionPolicy's None: the gradients' dtype";
  EXPECT_EQ(testing::fixture_from(tiny_vit_yaml("  distributed: {strategy: fsdp, world_size: 2, reduce_dtype: fp32}\n"))
                .training.distributed.reduce_dtype,
            std::optional(Precision::kFp32));
  EXPECT_THAT(load_error(tiny_vit_yaml("  distributed: {strategy: fsdp, world_size: 2, reduce_dtype: float8}\n")),
              AllOf(HasSubstr("training.distributed.reduce_dtype"), HasSubstr("bf16")));
  EXPECT_THAT(load_error(tiny_vit_yaml("  distributed: {strategy: ddp, world_size: 2, reduce_dtype: fp32}\n")),
              HasSubstr("no FSDP key with strategy ddp"));
}

// FSDP2's offload_policy: none unless given; `none` written hashes as a fixture without it (added later: no
// baseline moves), cpu and cpu_pinned are other workloads; a DDP fixture or another word is refused, naming the key.
TEST(FixtureTest, OffloadPolicyIsFsdpsOwnAndNoneKeepsTheHash) {
  const auto fsdp = [](const std::string& extra) {
    return testing::fixture_from(tiny_vit_yaml("  distributed: {strategy: fsdp, world_size: 2" + extra + "}\n"));
  };
  const auto plain = fsdp("");
  EXPECT_EQ(plain.training.distributed.offload_policy, FsdpOffload::kNone);
  EXPECT_EQ(fsdp(", offload_policy: none").hash, plain.hash);
  const auto cpu = fsdp(", offload_policy: cpu");
  EXPECT_EQ(cpu.training.distributed.offload_policy, FsdpOffload::kCpu);
  EXPECT_NE(cpu.hash, plain.hash);
  const auto pinned = fsdp(", offload_policy: cpu_pinned");
  EXPECT_EQ(pinned.training.distributed.offload_policy, FsdpOffload::kCpuPinned);
  EXPECT_NE(pinned.hash, cpu.hash);
  EXPECT_THAT(load_error(tiny_vit_yaml("  distributed: {strategy: fsdp, world_size: 2, offload_policy: gpu}\n")),
              AllOf(HasSubstr("training.distributed.offload_policy"), HasSubstr("cpu_pinned"), HasSubstr("gpu")));
  EXPECT_THAT(load_error(tiny_vit_yaml("  distributed: {strategy: ddp, world_size: 2, offload_policy: cpu}\n")),
              AllOf(HasSubstr("training.distributed.offload_policy"), HasSubstr("no FSDP key with strategy ddp")));
}

TEST(FixtureTest, NullOptionalKeyIsNotSetAndMisspelledOnePointsToIt) {
  const auto a = testing::fixture_from(tiny_vit_yaml());
  // A null is "not set", as if the key were absent: the same training and the same hash.
  const auto nulls = testing::fixture_from(tiny_vit_yaml("  max_grad_norm: null\n  ema: ~\n  distributed:\n"));
  EXPECT_EQ(nulls.training.max_grad_norm, a.training.max_grad_norm);
  EXPECT_EQ(nulls.training.ema_decay, a.training.ema_decay);
  EXPECT_FALSE(nulls.training.distributed.enabled());
  EXPECT_EQ(nulls.hash, a.hash);
  // A misspelling is an unknown key, and the keys the map takes include the optional ones, set or not.
  for (const auto& [typo, meant] : {std::pair{"  max_grad_norms: 1.0\n", "max_grad_norm"},
                                     std::pair{"  ema_decay: 0.99\n", "ema"}}) {
    const auto message = load_error(tiny_vit_yaml(typo));
    EXPECT_THAT(message, HasSubstr(std::string("unknown key: did you mean '") + meant + "'?")) << message;
    EXPECT_THAT(message, HasSubstr(" ema,")) << message;
    EXPECT_THAT(message, HasSubstr(" max_grad_norm,")) << message;
  }
  // Nothing near: no guess, the list alone.
  EXPECT_THAT(load_error(tiny_vit_yaml("  epochs: 3\n")), ::testing::Not(HasSubstr("did you mean")));
}

TEST(FixtureTest, UnknownKeyNamesKeyAndLine) {
  auto yaml = tiny_vit_yaml("  optimiser_typo: sgd\n");
  const auto message = load_error(yaml);
  EXPECT_THAT(message, HasSubstr("training.optimiser_typo"));
  EXPECT_THAT(message, HasSubstr("unknown key"));
  EXPECT_THAT(message, HasSubstr("bad.yaml:11:"));
}

TEST(FixtureTest, BatchSizeZeroIsRejected) {
  auto yaml = tiny_vit_yaml();
  yaml.replace(yaml.find("[1, 2, 4, 8]"), 12, "[0, 4]");
  const auto message = load_error(yaml);
  EXPECT_THAT(message, HasSubstr("batch_sizes"));
  EXPECT_THAT(message, HasSubstr("integers >= 1"));
  EXPECT_THAT(message, HasSubstr("'0'"));
}

TEST(FixtureTest, HeadsMustDivideTheWidth) {
  auto yaml = tiny_vit_yaml();
  yaml.replace(yaml.find("num_heads: 4"), 12, "num_heads: 5");
  const auto message = load_error(yaml);
  EXPECT_THAT(message, HasSubstr("model.num_heads"));
  EXPECT_THAT(message, HasSubstr("divisor of embed_dim (64)"));
  EXPECT_THAT(message, HasSubstr(":7:"));
}

TEST(FixtureTest, LoraRankZeroIsRejected) {
  const auto message = load_error(tiny_vit_yaml("", "  lora: {rank: 0}\n"));
  EXPECT_THAT(message, HasSubstr("model.lora.rank"));
  EXPECT_THAT(message, HasSubstr("from 1 to"));
}

TEST(FixtureTest, MissingRequiredKeyAndWrongTypeAreNamed) {
  auto missing = tiny_vit_yaml();
  missing.replace(missing.find("  depth: 4\n"), 11, "");
  EXPECT_THAT(load_error(missing), HasSubstr("model.depth: expected an integer"));
  auto wrong = tiny_vit_yaml();
  wrong.replace(wrong.find("embed_dim: 64"), 13, "embed_dim: [64]");
  EXPECT_THAT(load_error(wrong), HasSubstr("model.embed_dim: expected an integer"));
  EXPECT_THAT(load_error(tiny_vit_yaml("  precision: fp8\n")), HasSubstr("one of fp32, fp16, bf16"));
  EXPECT_THAT(load_error(tiny_vit_yaml("  trainable: last_blocks:0\n")), HasSubstr("last_blocks:N"));
  EXPECT_THAT(load_error(tiny_vit_yaml("  trainable: lora\n")), HasSubstr("lora"));
}

TEST(FixtureTest, TrainablePatternsAreAListUnderTrain) {
  const auto f = testing::fixture_from(tiny_vit_yaml("  trainable: {train: [\"head.*\", \"*.lora_*\"]}\n"));
  EXPECT_EQ(f.training.trainable.kind, TrainableSpec::Kind::kPatterns);
  EXPECT_EQ(f.training.trainable.patterns, (std::vector<std::string>{"head.*", "*.lora_*"}));
  EXPECT_EQ(f.training.trainable.str(), "train:[head.*,*.lora_*]");
  EXPECT_NE(f.hash, testing::fixture_from(tiny_vit_yaml("  trainable: {train: [\"head.*\"]}\n")).hash);
  EXPECT_THAT(load_error(tiny_vit_yaml("  trainable: {train: []}\n")), HasSubstr("training.trainable.train: expected at least one"));
  EXPECT_THAT(load_error(tiny_vit_yaml("  trainable: {train: [\"\"]}\n")), HasSubstr("non-empty name patterns"));
  EXPECT_THAT(load_error(tiny_vit_yaml("  trainable: {freeze: [\"x\"]}\n")), HasSubstr("training.trainable.train"));
  EXPECT_THAT(load_error(tiny_vit_yaml("  trainable: {train: [\"x\"], freeze: [\"y\"]}\n")),
              HasSubstr("freeze"));
}

TEST(FixtureTest, MalformedYamlAndMissingFileAreErrors) {
  EXPECT_THAT(load_error("model: {arch: vit\n"), HasSubstr("not valid YAML"));
  EXPECT_THROW((void)load_fixture("/nonexistent/fixture.yaml"), Error);
}

}  // namespace
}  // namespace memgate

namespace memgate {
namespace {

// A fixture listed twice would register its tests twice (CTest refuses duplicate names): the suite file is wrong.
TEST(SuiteTest, AFixtureListedTwiceIsAnErrorNamingTheSuiteAndBothEntries) {
  testing::TempDir dir;
  testing::write_file(dir / "models/a.yaml", testing::tiny_vit_yaml());
  testing::write_file(dir / "suites/cpu.yaml", "device: cpu\nfixtures:\n  - a\n  - {fixture: a, batch_sizes: [2]}\n");
  try {
    (void)load_suite(dir / "suites/cpu.yaml", dir / "models");
    FAIL() << "loaded";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_THAT(message, ::testing::HasSubstr("cpu.yaml"));
    EXPECT_THAT(message, ::testing::HasSubstr("fixtures[1]"));
    EXPECT_THAT(message, ::testing::HasSubstr("'a' again (it is fixtures[0] too)"));
  }
}

}  // namespace
}  // namespace memgate
