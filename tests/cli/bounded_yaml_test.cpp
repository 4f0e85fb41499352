// Bounded reading of YAML: a fixture, a suite or a GPU file that is too large, holds too many values once its
// aliases are expanded (a "billion laughs" of 736 bytes), or nests too deep, is an error naming the file, the bound
// and what was expected; found in time and memory close to those of any other bad file (the reference: an unknown
// key), not in minutes and gigabytes. The files are generated here.
#include "memgate/spec/yaml_reader.h"
#include "spawn_util.h"
#include "test_util.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <string>
#include <vector>

namespace memgate {
namespace {

using ::testing::HasSubstr;

const std::string kTiny =
    "model:\n  arch: vit\n  img_size: 32\n  patch_size: 8\n  embed_dim: 64\n  depth: 4\n  num_heads: 4\n"
    "  num_classes: 5\ntraining:\n  optimizer: adamw\nbatch_sizes: [1]\n";

// A Python fixture whose `args` hold `value` (YAML, after "args: ").
std::string python_fixture(const std::string& anchors, const std::string& value) {
  return anchors + "model:\n  arch: python\n  entry: m.py:build\n  args: " + value +
         "\n  inputs:\n    - {shape: [B, 4], dtype: float32}\n  task: sum\ntraining:\n  optimizer: sgd\n"
         "batch_sizes: [1]\n";
}

// Nine levels of nine: 9^9 scalars once expanded, from well under a KiB.
std::string laughs() {
  std::string text = "x0: &a0 [x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 9; ++i) {
    const auto prev = fmt::format("*a{}", i - 1);
    text += fmt::format("x{}: &a{} [{}, {}, {}, {}, {}, {}, {}, {}, {}]\n", i, i, prev, prev, prev, prev, prev, prev,
                        prev, prev, prev);
  }
  return text;
}

std::string nested(int levels) { return std::string(levels, '[') + "1" + std::string(levels, ']'); }

std::string long_list(std::size_t bytes) {
  std::string list = "[";
  while (list.size() < bytes) list += "12345678, ";
  return list + "0]";
}

struct Case {
  std::string name;
  std::string kind;  // fixture | suite | gpu
  std::string text;
  std::vector<std::string> says;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> cases() {
  const auto laughs_text = laughs();
  const std::vector<std::string> too_many{"more than 100000 YAML values", "an alias counted as all that its anchor holds",
                                          "expected at most 100000"};
  const std::vector<std::string> too_deep{"nested deeper than 64 levels", "expected at most 64"};
  const std::vector<std::string> too_big{"11534336 bytes: expected a YAML file of at most 1048576 bytes"};
  // `x0` ... `x8` are unknown keys, never read: the bound holds before any key is.
  std::vector<Case> c{
      {"fixture_billion_laughs", "fixture", python_fixture(laughs_text, "{data: *a8}"), too_many},
      {"fixture_ten_thousand_levels", "fixture", python_fixture("", nested(10000)), too_deep},
      {"fixture_sixty_five_levels", "fixture", python_fixture("", nested(65)), too_deep},
      {"fixture_eleven_mib", "fixture", python_fixture("", long_list(11 * 1024 * 1024 - 200)), too_big},
      {"fixture_many_values", "fixture", python_fixture("", long_list(1000 * 1000)), too_many},
      {"suite_billion_laughs", "suite", laughs_text + "device: cpu\nfixtures: [tiny]\n", too_many},
      {"suite_ten_thousand_levels", "suite", "device: cpu\nfixtures: " + nested(10000) + "\n", too_deep},
      {"gpu_billion_laughs", "gpu", laughs_text + "name: G\nmemory_gib: 16\n", too_many},
      {"gpu_ten_thousand_levels", "gpu", "name: G\nmemory_gib: " + nested(10000) + "\n", too_deep},
  };
  // The eleven-MiB fixture is 11534336 bytes exactly.
  auto& big = c[3].text;
  big.insert(big.find("]"), std::string(11534336 - big.size(), ' '));
  return c;
}

// The command that reads a case's file, in `dir`.
std::vector<std::string> command_for(const std::string& kind, const std::string& dir) {
  if (kind == "suite") return {MEMGATE_CLI, "check", "--suite", dir + "/fixtures/suites/s.yaml"};
  if (kind == "gpu") {
    return {MEMGATE_CLI, "advise", "--config", dir + "/tiny.yaml", "--gpus", dir + "/gpus", "--gpu", "g", "--device",
            "cpu"};
  }
  return {MEMGATE_CLI, "profile", "--config", dir + "/f.yaml", "--device", "cpu"};
}

std::string file_for(const std::string& kind) {
  return kind == "suite" ? "fixtures/suites/s.yaml" : kind == "gpu" ? "gpus/g.yaml" : "f.yaml";
}

void write_case(const testing::TempDir& dir, const std::string& kind, const std::string& text) {
  testing::write_file(dir / "tiny.yaml", kTiny);
  testing::write_file(dir / "fixtures/models/tiny.yaml", kTiny);
  testing::write_file(dir / "m.py", "def build(**kwargs):\n    raise RuntimeError('never called')\n");
  testing::write_file(dir / file_for(kind), text);
}

// The same command on a file with an unknown key: what any bad file costs (a LibTorch process that starts and stops).
testing::Spawned reference(const std::string& kind) {
  testing::TempDir dir;
  const std::map<std::string, std::string> unknown{{"fixture", kTiny + "epochs: 3\n"},
                                                   {"suite", "device: cpu\nfixtures: [tiny]\nextra: 1\n"},
                                                   {"gpu", "name: G\nmemory_gib: 16\ntdp_watts: 300\n"}};
  write_case(dir, kind, unknown.at(kind));
  auto run = testing::spawn(command_for(kind, dir.path().string()), dir.path().string());
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_THAT(run.output, HasSubstr("unknown key"));
  return run;
}

class BoundedYamlTest : public ::testing::TestWithParam<Case> {};

TEST_P(BoundedYamlTest, IsAnErrorNamingTheBoundFoundFastInLittleMemory) {
  const auto& c = GetParam();
  static std::map<std::string, testing::Spawned> references;
  if (!references.contains(c.kind)) references[c.kind] = reference(c.kind);
  const auto& ref = references.at(c.kind);
  testing::TempDir dir;
  write_case(dir, c.kind, c.text);
  const auto run = testing::spawn(command_for(c.kind, dir.path().string()), dir.path().string());
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_THAT(run.output, HasSubstr(dir / file_for(c.kind)));
  for (const auto& s : c.says) EXPECT_THAT(run.output, HasSubstr(s));
  EXPECT_THAT(run.output, ::testing::Not(HasSubstr("not valid YAML")));
  EXPECT_THAT(run.output, ::testing::Not(HasSubstr("unexpected error")));
  // Unbounded, these took 30 s to minutes and 1 GiB to all of memory.
  EXPECT_LT(run.seconds, ref.seconds + 5.0) << "reference " << ref.seconds << " s";
  EXPECT_LT(run.peak_rss_kib, ref.peak_rss_kib + 64 * 1024) << "reference " << ref.peak_rss_kib << " KiB";
  std::cout << fmt::format("{}: {:.2f} s, peak {} MiB (reference: a bad key, {:.2f} s, {} MiB)\n", c.name,
                           run.seconds, run.peak_rss_kib / 1024, ref.seconds, ref.peak_rss_kib / 1024);
}

INSTANTIATE_TEST_SUITE_P(Catalogue, BoundedYamlTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& p) { return p.param.name; });

// --- the bounds themselves, at the edge ------------------------------------------------------------------------

class YamlBoundsTest : public ::testing::Test {
 protected:
  std::string load_error(const std::string& text) {
    const auto path = dir_ / "b.yaml";
    testing::write_file(path, text);
    try {
      (void)detail::load_yaml_file(path);
    } catch (const Error& e) {
      return e.what();
    }
    return {};
  }
  testing::TempDir dir_;
};

TEST_F(YamlBoundsTest, SixtyFourLevelsAreReadAndSixtyFiveAreNot) {
  EXPECT_EQ(load_error("a: " + nested(63) + "\n"), "");  // the top-level map is the first level
  EXPECT_THAT(load_error("a: " + nested(64) + "\n"), HasSubstr("b.yaml:1: maps and lists nested deeper than 64"));
}

TEST_F(YamlBoundsTest, AnAliasIsAsDeepAsWhatItsAnchorHolds) {
  // 40 levels, then an alias of 30 more inside 40: 70 once expanded.
  const auto text = "a: &deep " + nested(30) + "\nb: " + std::string(39, '[') + "*deep" + std::string(39, ']') + "\n";
  EXPECT_THAT(load_error(text), HasSubstr("nested deeper than 64 levels"));
}

TEST_F(YamlBoundsTest, AHundredThousandValuesAreReadAndOneMoreIsNot) {
  // The top-level map, its key `a` and a list: 3 values, then scalars.
  const auto list = [](int n) {
    std::string s = "a: [";
    for (int i = 0; i < n; ++i) s += i ? ",1" : "1";
    return s + "]\n";
  };
  EXPECT_EQ(load_error(list(100000 - 3)), "");
  EXPECT_THAT(load_error(list(100000 - 2)), HasSubstr("more than 100000 YAML values"));
}

TEST_F(YamlBoundsTest, AnAliasCountsAllThatItsAnchorHolds) {
  // 10 values behind &t; 10,001 aliases of it are 100,010 values (and 10,001 alias nodes of the list's).
  std::string text = "t: &t [1, 2, 3, 4, 5, 6, 7, 8, 9]\nu: [";
  for (int i = 0; i < 10001; ++i) text += i ? ", *t" : "*t";
  EXPECT_THAT(load_error(text + "]\n"), HasSubstr("more than 100000 YAML values"));
  EXPECT_EQ(load_error("t: &t [1, 2]\nu: [*t, *t, *t]\n"), "");
}

TEST_F(YamlBoundsTest, OneMibIsReadAndOneByteMoreIsNot) {
  std::string text = "a: 1\n";
  text += "#" + std::string(detail::kMaxYamlBytes - text.size() - 2, ' ') + "\n";
  ASSERT_EQ(text.size(), detail::kMaxYamlBytes);
  EXPECT_EQ(load_error(text), "");
  EXPECT_THAT(load_error(text + "\n"), HasSubstr("b.yaml: 1048577 bytes: expected a YAML file of at most 1048576"));
}

}  // namespace
}  // namespace memgate
