// Baseline files: strict reading, tolerance arithmetic, in-place updates that keep other entries and churn nothing.
#include "memgate/gate/baseline.h"
#include "memgate/gate/verdict.h"
#include "memgate/base/error.h"
#include "fixture_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

namespace memgate {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::cpu_info;
using testing::TempDir;

ProbeResult result(std::int64_t bs, std::int64_t scale) {
  ProbeResult r;
  r.batch_size = bs;
  std::int64_t v = scale;
  for (const auto& info : kComponentTable) r.components.*info.member = (v += 1000);
  return r;
}

// What describe_device says of an x86-64 CPU, with the kernels a probe ran.
DeviceInfo cpu(std::string name, std::string isa, std::string features, std::string_view kernels) {
  auto d = cpu_info();
  d.name = std::move(name);
  d.cpu_isa = std::move(isa);
  d.cpu_features = std::move(features);
  set_cpu_kernels(d, *parse_enum(kCpuKernelsNames, kernels));
  return d;
}
// Two CPUs of other classes: the recorder's and a runner's.
DeviceInfo epyc(std::string_view kernels) { return cpu("AMD EPYC 9B14", "avx512_core_bf16", "avx512_bf16", kernels); }
DeviceInfo xeon(std::string_view kernels) {
  return cpu("Intel(R) Xeon(R) Platinum 8481C", "avx512_core_amx", "avx512_bf16 avx512_fp16 amx_bf16", kernels);
}

TEST(BaselineTest, UpdateWritesReadsBackAndKeepsOtherProbes) {
  TempDir dir;
  const auto f = testing::fixture_from(testing::tiny_vit_yaml(), "tiny");
  const auto path = baseline_path(dir.path().string(), "cpu", f.name);
  EXPECT_TRUE(update_baseline(path, f, cpu_info(), {result(1, 10), result(8, 80)}, "abc"));
  EXPECT_TRUE(update_baseline(path, f, cpu_info(), {result(4, 40)}, "def"));
  const auto b = load_baseline(path);
  ASSERT_EQ(b.probes.size(), 3U);
  EXPECT_EQ(b.probes[0].batch_size, 1);
  EXPECT_EQ(b.probes[1].batch_size, 4);
  EXPECT_EQ(b.probes[2].batch_size, 8);
  EXPECT_EQ(b.find(8)->components, result(8, 80).components);
  EXPECT_EQ(b.find(1)->provenance["commit"], "abc");
  EXPECT_EQ(b.find(4)->provenance["commit"], "def");
  EXPECT_EQ(b.find(4)->fixture_hash(), f.hash);
}

TEST(BaselineTest, UnchangedMeasurementsLeaveTheFileByteForByte) {
  TempDir dir;
  const auto f = testing::fixture_from(testing::tiny_vit_yaml(), "tiny");
  const auto path = baseline_path(dir.path().string(), "cpu", f.name);
  ASSERT_TRUE(update_baseline(path, f, cpu_info(), {result(2, 20)}, "first-commit"));
  const auto before = testing::read_file(path);
  EXPECT_FALSE(update_baseline(path, f, cpu_info(), {result(2, 20)}, "later-commit"));
  EXPECT_EQ(testing::read_file(path), before);
  EXPECT_TRUE(update_baseline(path, f, cpu_info(), {result(2, 21)}, "later-commit"));
  EXPECT_NE(testing::read_file(path), before);
}

// A record from a tree with uncommitted changes names a commit nobody can check out: the same bytes recorded from a
// clean commit replace it (and only then: a dirty tree never replaces a clean record with the same bytes).
TEST(BaselineTest, TheSameBytesFromACleanCommitReplaceARecordFromADirtyTree) {
  TempDir dir;
  const auto f = testing::fixture_from(testing::tiny_vit_yaml(), "tiny");
  const auto path = baseline_path(dir.path().string(), "cpu", f.name);
  ASSERT_TRUE(update_baseline(path, f, cpu_info(), {result(2, 20), result(4, 40)}, "abc+dirty"));
  EXPECT_FALSE(update_baseline(path, f, cpu_info(), {result(2, 20), result(4, 40)}, "def+dirty"));
  EXPECT_EQ(load_baseline(path).find(2)->provenance["commit"], "abc+dirty");
  EXPECT_TRUE(update_baseline(path, f, cpu_info(), {result(2, 20), result(4, 40)}, "def"));
  const auto b = load_baseline(path);
  EXPECT_EQ(b.find(2)->provenance["commit"], "def");
  EXPECT_EQ(b.find(4)->provenance["commit"], "def");
  EXPECT_EQ(b.find(2)->components, result(2, 20).components);
  EXPECT_FALSE(update_baseline(path, f, cpu_info(), {result(2, 20), result(4, 40)}, "ghi+dirty"));
  EXPECT_EQ(load_baseline(path).find(2)->provenance["commit"], "def");
}

// The portable kernels' bytes are every CPU's: a runner with another CPU, at another commit, that measured the same
// bytes rewrites nothing, so a pull request that updates one fixture shows one file changed.
TEST(BaselineTest, AnotherCpuWithTheSameBytesRewritesNothingUnderPortableKernels) {
  TempDir dir;
  const auto f = testing::fixture_from(testing::tiny_vit_yaml(), "tiny");
  const auto path = baseline_path(dir.path().string(), "cpu", f.name);
  ASSERT_TRUE(update_baseline(path, f, epyc("portable"), {result(2, 20), result(4, 40)}, "recorded-on-epyc"));
  const auto before = testing::read_file(path);
  EXPECT_FALSE(update_baseline(path, f, xeon("portable"), {result(2, 20), result(4, 40)}, "later-on-xeon"));
  EXPECT_EQ(testing::read_file(path), before);
  const auto recorded = load_baseline(path).find(2)->provenance;
  for (const char* key : {"device", "cpu_isa", "cpu_features"}) {
    EXPECT_FALSE(recorded.contains(key)) << key << " cannot change a portable byte: " << recorded.dump();
  }
  EXPECT_EQ(recorded["cpu_kernels"], "portable");
  EXPECT_EQ(recorded["cpu_threads"], 1);
  // One probe's bytes change: that probe is rewritten, with the runner's commit; the other keeps its own.
  EXPECT_TRUE(update_baseline(path, f, xeon("portable"), {result(2, 21), result(4, 40)}, "later-on-xeon"));
  const auto b = load_baseline(path);
  EXPECT_EQ(b.find(2)->provenance["commit"], "later-on-xeon");
  EXPECT_EQ(b.find(4)->provenance["commit"], "recorded-on-epyc");
}

// The host's kernels follow its CPU: their baselines say which (name, oneDNN class, reduced-precision features),
// live in a folder per class, and a CPU of another class never shares them.
TEST(BaselineTest, HostKernelsRecordTheCpuTheirBytesFollow) {
  EXPECT_EQ(epyc("host").slug, "cpu-avx512-core-bf16");
  EXPECT_EQ(xeon("host").slug, "cpu-avx512-core-amx");
  EXPECT_EQ(epyc("portable").slug, "cpu");
  EXPECT_EQ(xeon("portable").slug, "cpu");
  TempDir dir;
  const auto f = testing::fixture_from(testing::tiny_vit_yaml(), "tiny");
  const auto path = baseline_path(dir.path().string(), epyc("host").slug, f.name);
  ASSERT_TRUE(update_baseline(path, f, epyc("host"), {result(2, 20)}, "c"));
  const auto recorded = load_baseline(path).find(2)->provenance;
  EXPECT_EQ(recorded["cpu_kernels"], "host");
  EXPECT_EQ(recorded["cpu_isa"], "avx512_core_bf16");
  EXPECT_EQ(recorded["cpu_features"], "avx512_bf16");
  EXPECT_EQ(recorded["device"], "AMD EPYC 9B14");
  // Within a class, the features ATen reads still change kernels: the same bytes under other features are
  // recorded as such.
  auto other = epyc("host");
  other.cpu_features = "avx512_bf16 avx512_fp16";
  EXPECT_TRUE(update_baseline(path, f, other, {result(2, 20)}, "c"));
  EXPECT_EQ(load_baseline(path).find(2)->provenance["cpu_features"], "avx512_bf16 avx512_fp16");
}

// A failure says which of what can change the bytes differs from the recorder's setup; for the portable kernels the
// CPU is not among them, so another CPU is not named as a cause.
TEST(BaselineTest, AFailureNamesTheSetupThatDiffersFromTheRecorders) {
  BaselineProbe recorded;
  recorded.provenance = probe_provenance(epyc("host"), "fnv1a64:0", "c");
  auto same_class = epyc("host");
  same_class.name = "AMD EPYC 9654";
  same_class.cpu_features = "avx512_bf16 avx512_fp16";
  same_class.cpu_threads = 2;
  const auto said = provenance_differences(recorded, same_class);
  EXPECT_THAT(said, HasSubstr("device AMD EPYC 9B14 -> AMD EPYC 9654"));
  EXPECT_THAT(said, HasSubstr("cpu_features avx512_bf16 -> avx512_bf16 avx512_fp16"));
  EXPECT_THAT(said, HasSubstr("cpu_threads 1 -> 2"));
  EXPECT_THAT(said, Not(HasSubstr("cpu_isa"))) << "the same class";
  auto other_class = xeon("host");
  EXPECT_THAT(provenance_differences(recorded, other_class), HasSubstr("cpu_isa avx512_core_bf16 -> avx512_core_amx"));

  recorded.provenance = probe_provenance(epyc("portable"), "fnv1a64:0", "c");
  EXPECT_EQ(provenance_differences(recorded, xeon("portable")), "") << "another CPU changes no portable byte";
  // A baseline recorded before the portable kernels (with the recorder's CPU in it) is read as it is.
  recorded.provenance["cpu_isa"] = "avx512_core_bf16";
  recorded.provenance["device"] = "AMD EPYC 9B14";
  EXPECT_EQ(provenance_differences(recorded, xeon("portable")), "");
  recorded.provenance["torch"] = "2.10.0";
  EXPECT_EQ(provenance_differences(recorded, xeon("portable")), "torch 2.10.0 -> 2.11.0");
}

// A distributed fixture's baseline keeps each rank's components and buckets; each rank's component is judged
// against that rank's record, and a failure lists every rank's bytes (the imbalance).
TEST(BaselineTest, RanksAreRecordedAndJudgedOneByOne) {
  TempDir dir;
  const auto f = testing::fixture_from(testing::tiny_vit_yaml("  distributed: {strategy: ddp, world_size: 2}\n"), "tiny_ddp");
  const auto path = baseline_path(dir.path().string(), "cpu", f.name);
  auto recorded = result(2, 20);
  recorded.ranks = {{0, result(2, 20).components, 4096, 3}, {1, result(2, 20).components, 4096, 3}};
  ASSERT_TRUE(update_baseline(path, f, cpu_info(), {recorded}, "abc"));
  const auto b = load_baseline(path);
  ASSERT_EQ(b.find(2)->ranks.size(), 2U);
  EXPECT_EQ(b.find(2)->ranks, recorded.ranks);
  EXPECT_FALSE(update_baseline(path, f, cpu_info(), {recorded}, "def")) << "the same bytes change nothing";

  auto grown = recorded;
  grown.ranks[1].components.gradients += 100000;
  grown.components = max_over_ranks(grown.ranks);
  const auto rank0 = evaluate_component(f, grown, rank_component_name(0, "gradients"), &b, path, cpu_info());
  const auto rank1 = evaluate_component(f, grown, rank_component_name(1, "gradients"), &b, path, cpu_info());
  EXPECT_EQ(rank0.status, Status::kOk) << rank0.message;
  EXPECT_EQ(rank1.status, Status::kRegression) << rank1.message;
  EXPECT_THAT(rank1.message, HasSubstr("rank 1's gradients grew"));
  EXPECT_THAT(rank1.message, HasSubstr("imbalance 100000 bytes"));
  EXPECT_EQ(rank_component_name(1, "gradients"), "rank1_gradients");
  EXPECT_EQ(parse_rank_component("rank12_step_peak"), (std::pair<int, std::string>{12, "step_peak"}));
  EXPECT_FALSE(parse_rank_component("gradients"));
  EXPECT_FALSE(parse_rank_component("rank1_weights"));
  EXPECT_FALSE(parse_rank_component("rankx_params"));

  // More ranks than were recorded: the fixture changed (its world size is part of its hash), and says so.
  const auto wider = testing::fixture_from(testing::tiny_vit_yaml("  distributed: {strategy: ddp, world_size: 4}\n"),
                                           "tiny_ddp");
  auto four = recorded;
  four.ranks.push_back({2, result(2, 20).components, 4096, 3});
  four.ranks.push_back({3, result(2, 20).components, 4096, 3});
  const auto rank3 = evaluate_component(wider, four, rank_component_name(3, "gradients"), &b, path, cpu_info());
  EXPECT_EQ(rank3.status, Status::kChanged) << rank3.message;
  EXPECT_THAT(rank3.message, HasSubstr("the model changed"));

  // A rank out of order is corrupt, named by its key.
  auto text = testing::read_file(path);
  text.replace(text.find("\"rank\": 1"), 9, "\"rank\": 5");
  testing::write_file(path, text);
  try {
    (void)load_baseline(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("probes[0].ranks[1].rank"));
  }
}

TEST(BaselineTest, CorruptFilesNameTheFileAndTheKey) {
  TempDir dir;
  const auto path = dir / "broken.json";
  testing::write_file(path, "{\"schema\": 1, \"fixture\": \"x\"");
  try {
    (void)load_baseline(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("broken.json"));
    EXPECT_THAT(e.what(), HasSubstr("not valid JSON"));
  }
  const auto f = testing::fixture_from(testing::tiny_vit_yaml(), "x");
  ASSERT_TRUE(update_baseline(path + ".good", f, cpu_info(), {result(2, 20)}, "c"));
  auto text = testing::read_file(path + ".good");
  text.replace(text.find("\"activations\": "), 15, "\"activations\": -");
  testing::write_file(path, text);
  try {
    (void)load_baseline(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("probes[0].components.activations"));
    EXPECT_THAT(e.what(), HasSubstr("an integer >= 0"));
  }
  // An update never overwrites a corrupt file: it stops with the same error, and the file is kept.
  EXPECT_THROW(update_baseline(path, f, cpu_info(), {result(2, 20)}, "c"), Error);
  EXPECT_EQ(testing::read_file(path), text);
}

// What the writer never writes is an error, never dropped by the next update: unknown keys, a batch size twice, a
// header naming another fixture or device (a file copied or renamed by hand).
TEST(BaselineTest, StrictReadingAndAnUpdateKeepsWhatItRefuses) {
  TempDir dir;
  const auto f = testing::fixture_from(testing::tiny_vit_yaml(), "x");
  const auto good = dir / "cpu/x.json";
  ASSERT_TRUE(update_baseline(good, f, cpu_info(), {result(2, 20), result(4, 40)}, "c"));
  const auto text = testing::read_file(good);
  auto mutated = [&](const std::string& from, const std::string& to) {
    auto t = text;
    t.replace(t.find(from), from.size(), to);
    return t;
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {mutated("\"schema\": 1", "\"schema\": 1, \"note\": \"by hand\""), "note: expected none of this name"},
      {mutated("\"slug\": \"cpu\"", "\"slug\": \"cpu\", \"name\": \"x\""), "device.name"},
      {mutated("\"batch_size\": 4", "\"batch_size\": 2"), "probes[1].batch_size: expected each batch size once"},
      {mutated("\"activations\"", "\"kv_cache\": 1, \"activations\""), "components.kv_cache"},
      {mutated("\"fixture\": \"x\"", "\"fixture\": \"y\""), "fixture: expected \"x\" (the file's name), got \"y\""},
      {mutated("\"slug\": \"cpu\"", "\"slug\": \"nvidia-h100\""), "device.slug: expected \"cpu\" (its folder)"},
  };
  for (const auto& [bad, says] : cases) {
    testing::write_file(good, bad);
    try {
      (void)load_baseline(good, "x", "cpu");
      ADD_FAILURE() << "loaded: " << says;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(says));
    }
    EXPECT_THROW(update_baseline(good, f, cpu_info(), {result(2, 20)}, "c"), Error) << says;
    EXPECT_EQ(testing::read_file(good), bad) << "an update must not overwrite what it refused to read: " << says;
  }
}

TEST(BaselineTest, ProvenanceCommitIsDirtyForSourceChangesOnly) {
  // A git tree with a fixture and a baseline: rewriting baselines/ (what an update does) keeps the commit clean.
  ::unsetenv("MEMGATE_COMMIT");  // it would stand in for git
  TempDir dir;
  testing::write_file(dir / "fixtures/models/a.yaml", "model: {}\n");
  testing::write_file(dir / "baselines/cpu/a.json", "{}\n");
  const std::string git = "git -C '" + dir.path().string() + "' -c user.name=t -c user.email=t@t ";
  ASSERT_EQ(testing::run(git + "init -q && " + git + "add -A && " + git + "commit -qm init"), 0);
  std::string head;
  ASSERT_EQ(testing::run(git + "rev-parse --short=12 HEAD", &head), 0);
  head = head.substr(0, 12);
  EXPECT_EQ(source_commit(dir.path().string()), head);
  testing::write_file(dir / "baselines/cpu/a.json", "{\"probes\": []}\n");
  EXPECT_EQ(source_commit(dir.path().string()), head) << "a baseline being rewritten is not a source change";
  testing::write_file(dir / "fixtures/models/a.yaml", "model: {arch: vit}\n");
  EXPECT_EQ(source_commit(dir.path().string()), head + "+dirty");
}

TEST(BaselineTest, ToleranceIsTheLargerOfRelativeAndAbsolute) {
  const Tolerance t{0.01, 64 * 1024, 0.05, 32 << 20};  // 1% or 64 KiB; reserved: 5% or 32 MiB
  const std::int64_t mib = 1 << 20;
  EXPECT_EQ(compare_component("f", 1, "activations", 100 * mib, 101 * mib, t).verdict, Verdict::kWithin);
  EXPECT_EQ(compare_component("f", 1, "activations", 100 * mib, 101 * mib + 1, t).verdict, Verdict::kRegression);
  EXPECT_EQ(compare_component("f", 1, "activations", 100 * mib, 99 * mib - 1, t).verdict, Verdict::kStale);
  EXPECT_EQ(compare_component("f", 1, "gradients", 1000, 1000 + 64 * 1024, t).verdict, Verdict::kWithin);
  EXPECT_EQ(compare_component("f", 1, "gradients", 1000, 1001 + 64 * 1024, t).verdict, Verdict::kRegression);
  EXPECT_EQ(compare_component("f", 1, "step_peak_reserved", 100 * mib, 132 * mib, t).verdict, Verdict::kWithin);
  EXPECT_EQ(compare_component("f", 1, "step_peak_reserved", 1000 * mib, 1051 * mib, t).verdict, Verdict::kRegression);
}

TEST(BaselineTest, RegressionMessageSaysWhatGrewByHowMuchAndWhatToDo) {
  const auto c = compare_component("retfound_large_lora", 32, "activations", 1000 << 20, 1412 << 20,
                                   Tolerance{0.01, 64 * 1024, 0.05, 32 << 20});
  const auto m = c.message();
  EXPECT_THAT(m, HasSubstr("retfound_large_lora at batch 32: activations grew beyond its baseline"));
  EXPECT_THAT(m, HasSubstr("1000.0 MiB"));
  EXPECT_THAT(m, HasSubstr("measured:  1.38 GiB (1480589312 bytes)"));
  EXPECT_THAT(m, HasSubstr("+412.0 MiB"));
  // A small component in a unit that shows it, not "0.0 MiB".
  EXPECT_THAT(compare_component("f", 1, "activations", 4100, 8196, Tolerance{0.0025, 0, 0.0025, 0}).message(),
              HasSubstr("baseline:  4.0 KiB (4100 bytes)"));
  EXPECT_THAT(m, HasSubstr("+41.20%"));
  EXPECT_THAT(m, HasSubstr("tolerance: 10.0 MiB"));
  EXPECT_THAT(m, HasSubstr("update-baselines"));
}

// The defaults follow what is exact: on the CPU and for CUDA's allocated bytes a +0.5% growth fails at any size
// (no absolute floor); CUDA's reserved bytes get one allocator segment.
TEST(ToleranceTest, DefaultsCatchHalfAPercentAnywhereAndOneSegmentOfReservedOnCuda) {
  const auto f = testing::fixture_from(testing::tiny_vit_yaml(), "tiny");
  for (const bool cuda : {false, true}) {
    const auto t = effective_tolerance(f, cuda);
    for (const auto& info : kComponentTable) {
      if (cuda && info.kind == ComponentKind::kReserved) continue;
      for (const std::int64_t base : {std::int64_t{200}, std::int64_t{174'600}, std::int64_t{3} << 30}) {
        const auto grown = base + (base * 5 + 999) / 1000;  // +0.5%, rounded up
        EXPECT_EQ(compare_component("f", 1, info.name, base, grown, t).verdict, Verdict::kRegression)
            << info.name << " at " << base << " bytes, cuda " << cuda;
        EXPECT_EQ(compare_component("f", 1, info.name, base, base, t).verdict, Verdict::kWithin);
      }
    }
  }
  const auto cuda = effective_tolerance(f, true);
  EXPECT_EQ(compare_component("f", 1, "step_peak_reserved", 1 << 30, (1 << 30) + (20 << 20), cuda).verdict,
            Verdict::kWithin);
  EXPECT_EQ(compare_component("f", 1, "step_peak_reserved", 1 << 30, (1 << 30) + (20 << 20) + 1, cuda).verdict,
            Verdict::kRegression);
}

TEST(ToleranceTest, AFixtureOverridesOnlyWhatItSets) {
  const auto f = testing::fixture_from(testing::tiny_vit_yaml() + "gate: {relative: 0.02, reserved_absolute_mib: 64}\n",
                                       "loose");
  const auto cpu = effective_tolerance(f, false);
  EXPECT_DOUBLE_EQ(cpu.relative, 0.02);
  EXPECT_EQ(cpu.absolute, 0);
  EXPECT_DOUBLE_EQ(cpu.reserved_relative, kExactRelative);
  EXPECT_EQ(cpu.reserved_absolute, std::int64_t{64} << 20);
  EXPECT_THROW((void)testing::fixture_from(testing::tiny_vit_yaml() + "gate: {absolute_kib: 9007199254740991}\n"),
               Error)
      << "a floor that would overflow when scaled to bytes is refused";
}

}  // namespace
}  // namespace memgate
