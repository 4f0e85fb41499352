// memgate report, compare and profile --html/--snapshot end to end, and the report rendered in a real browser
// (headless Chromium): the page loads without script errors, holds its plots, and paints them.
#include "memgate/allocator/snapshot_pickle.h"
#include "cli_fork.h"
#include "test_util.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>

namespace memgate {
namespace {

namespace fs = std::filesystem;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::count;

const std::string kCli = MEMGATE_CLI;

std::string profiles() { return testing::source_dir() + "/docs/profiles/"; }

TEST(ReportCliTest, ReportsTheCommittedProfilesAsOneSelfContainedPage) {
  testing::TempDir dir;
  std::string out;
  ASSERT_EQ(testing::run(fmt::format("{} report {p}vit_tiny_full.json {p}vit_tiny_lora.json {p}vit_tiny_lora_advice.json "
                                     "--output {}",
                                     kCli, dir / "r.html", fmt::arg("p", profiles())),
                         &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("wrote " + (dir / "r.html") + " (3 files)"));
  const auto html = testing::read_file(dir / "r.html");
  // The overview, two charts per profile, the advice's trials.
  EXPECT_EQ(count(html, "<svg class=\"memgate-chart"), 6);
  EXPECT_EQ(count(html, "https://"), 0);
  EXPECT_THAT(html, HasSubstr("Advice on <b>"));
}

TEST(ReportCliTest, ComparesVariantsSideBySideAndGatesOnAThreshold) {
  testing::TempDir dir;
  std::string out;
  const auto full = profiles() + "vit_tiny_full.json", lora = profiles() + "vit_tiny_lora.json";
  ASSERT_EQ(testing::run(fmt::format("{} compare {} {} --html {}", kCli, full, lora, dir / "c.html"), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("A  vit_tiny_full"));
  EXPECT_THAT(out, HasSubstr("batch size 8"));
  EXPECT_THAT(out, ::testing::ContainsRegex("optimizer_state +1\\.6 MiB +34\\.6 KiB +-1\\.6 MiB \\(-97\\.94%\\)"));
  EXPECT_EQ(count(testing::read_file(dir / "c.html"), "<table class=\"compare\">"), 4) << "batch sizes 1, 2, 4, 8";
  // LoRA adds adapters: its params exceed the full model's, so a gate on growth fails; the other way passes.
  EXPECT_EQ(testing::run(fmt::format("{} compare {} {} --threshold-pct 1", kCli, full, lora), &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("grew by more than 1% against A"));
  EXPECT_THAT(out, HasSubstr("B bs 1 params"));
  EXPECT_EQ(testing::run(fmt::format("{} compare {} {} --threshold-pct 5", kCli, full, lora), &out), 0) << out;
  EXPECT_EQ(testing::run(fmt::format("{} compare {}", kCli, full), &out), 2) << "one file is a usage error";
  EXPECT_EQ(testing::run(fmt::format("{} compare {} {} --html {}", kCli, full, lora, full), &out), 2)
      << "an output onto an input is a usage error: " << out;
  EXPECT_THAT(out, HasSubstr("--html " + full + ": is also an input (profile.json: " + full + ")"));
}

// A real GPU trace (tests/data/snapshots): exact, its JSON as docs/design.md gives it, a what-if on a capacity, the plot.
TEST(ReportCliTest, ReplaysARealGpuTraceAndAsksWhatIf) {
  testing::TempDir dir;
  std::string out;
  const auto trace = testing::source_dir() + "/tests/data/snapshots/decomfl_memory.pickle";
  ASSERT_EQ(testing::run(fmt::format("{} replay {} --capacity-mib 1750 --allocator expandable_segments:True "
                                     "--output {} --html {}",
                                     kCli, trace, dir / "r.json", dir / "r.html"),
                         &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("EXACT"));
  EXPECT_THAT(out, HasSubstr("OUT OF MEMORY at event"));
  const auto j = nlohmann::json::parse(testing::read_file(dir / "r.json"));
  ASSERT_EQ(j["devices"].size(), 1U);
  const auto& d = j["devices"][0];
  EXPECT_EQ(d["exact"], true);
  EXPECT_EQ(d["first_divergence"], nullptr);
  for (const auto* key : {"peak_reserved", "peak_allocated", "segment_allocs", "segment_frees"}) {
    EXPECT_EQ(d["recorded"][key], d["replayed"][key]) << key;
  }
  EXPECT_GT(d["replayed"]["peak_allocated_blocks"], d["replayed"]["peak_allocated"]) << "whole blocks, not requests";
  EXPECT_EQ(d["recorded"]["segment_allocs"], 61);
  ASSERT_EQ(d["what_if"].size(), 3U);
  EXPECT_EQ(d["what_if"][0]["capacity"], std::int64_t{1750} << 20);
  EXPECT_EQ(d["what_if"][0]["fits"], false);
  EXPECT_LT(d["what_if"][1]["replayed"]["peak_reserved"], d["replayed"]["peak_reserved"])
      << "expandable segments waste less on this trace";
  EXPECT_EQ(count(testing::read_file(dir / "r.html"), "<svg class=\"memgate-chart"), 1);
}

TEST(ReportCliTest, ProfileWritesItsHtmlAndOneSnapshotPerBatchSize) {
  testing::TempDir dir;
  std::string out;
  const auto fixture = testing::source_dir() + "/fixtures/models/vit_tiny_lora.yaml";
  ASSERT_EQ(testing::run_cli(fmt::format("MEMGATE_PROGRESS=1 {} profile --config {} --device cpu --batch-sizes 1,2 "
                                     "--html {} --snapshot {}",
                                     kCli, fixture, dir / "p.html", dir / "step.pickle"),
                         &out),
            0)
      << out;
  EXPECT_EQ(count(testing::read_file(dir / "p.html"), "<svg class=\"memgate-chart"), 2);
  EXPECT_GT(fs::file_size(dir / "step_bs1.pickle"), 1000U);
  EXPECT_GT(fs::file_size(dir / "step_bs2.pickle"), 1000U);
  EXPECT_THAT(out, HasSubstr("open it at https://pytorch.org/memory_viz"));
  // memgate's own snapshot reads back through the plain-data reader that memgate replay uses: one trace, whose
  // allocations (each its own segment on the CPU) are all freed or still live in `segments` at the end.
  const auto snapshot = load_plain_pickle(dir / "step_bs1.pickle");
  ASSERT_EQ(snapshot["device_traces"].size(), 1U);
  std::int64_t allocs = 0, frees = 0;
  for (const auto& e : snapshot["device_traces"][0]) {
    allocs += e["action"] == "segment_alloc" ? 1 : 0;
    frees += e["action"] == "segment_free" ? 1 : 0;
  }
  EXPECT_GT(allocs, 100);
  EXPECT_EQ(allocs - frees, static_cast<std::int64_t>(snapshot["segments"].size()));
  // memgate replay takes it too, and says that a CPU recording is nothing to compare the CUDA model with (exit 1).
  std::string replayed;
  ASSERT_EQ(testing::run(fmt::format("{} replay {} --output {}", kCli, dir / "step_bs1.pickle", dir / "r.json"),
                         &replayed),
            1)
      << replayed;
  EXPECT_THAT(replayed, HasSubstr("recorded by memgate's counting CPU allocator"));
  const auto replay = nlohmann::json::parse(testing::read_file(dir / "r.json"));
  EXPECT_EQ(replay["devices"][0]["compared"], false);
  EXPECT_EQ(replay["devices"][0]["recorded"]["segment_allocs"], allocs);
  // Progress on stderr, one line per probe in a log (not a terminal).
  EXPECT_THAT(out, HasSubstr("[memgate] vit_tiny_lora bs 1: step peak"));
  EXPECT_THAT(out, HasSubstr("[memgate] vit_tiny_lora bs 2: step peak"));
  ASSERT_EQ(testing::run_cli(fmt::format("MEMGATE_PROGRESS=0 {} profile --config {} --device cpu --batch-sizes 1", kCli,
                                     fixture),
                         &out),
            0);
  EXPECT_THAT(out, Not(HasSubstr("[memgate]"))) << "MEMGATE_PROGRESS=0 silences it";
}

// A distributed fixture's ranks each have an allocator of their own: one snapshot per rank, measured (each rank
// process records its own and the probe collects them) and estimated.
TEST(ReportCliTest, DistributedProfileAndEstimateWriteOneSnapshotPerRank) {
  testing::TempDir dir;
  std::string out;
  const auto fixture = testing::source_dir() + "/fixtures/models/vit_tiny_fsdp.yaml";
  const auto allocs_of = [](const nlohmann::json& snapshot) {
    std::int64_t allocs = 0;
    for (const auto& e : snapshot["device_traces"][0]) allocs += e["action"] == "segment_alloc" ? 1 : 0;
    return allocs;
  };
  ASSERT_EQ(testing::run_cli(fmt::format("{} profile --config {} --device cpu --batch-sizes 1 --snapshot {}", kCli,
                                     fixture, dir / "d.pickle"),
                         &out),
            0)
      << out;
  EXPECT_FALSE(fs::exists(dir / "d.pickle"));
  // Each rank's line; FSDP keeps no buckets between steps, so none are printed.
  EXPECT_THAT(out, HasSubstr("rank 1: step_peak"));
  EXPECT_THAT(out, Not(HasSubstr("buckets")));
  for (const auto* name : {"d_rank0.pickle", "d_rank1.pickle"}) {
    ASSERT_TRUE(fs::exists(dir / name)) << name << "\n" << out;
    EXPECT_GT(allocs_of(load_plain_pickle(dir / name)), 100) << name;
    EXPECT_THAT(out, HasSubstr(name));
  }
  ASSERT_EQ(testing::run_cli(fmt::format("{} estimate --config {} --batch-sizes 1,2 --snapshot {}", kCli, fixture,
                                     dir / "e.pickle"),
                         &out),
            0)
      << out;
  for (const auto* name : {"e_bs1_rank0.pickle", "e_bs1_rank1.pickle", "e_bs2_rank0.pickle", "e_bs2_rank1.pickle"}) {
    ASSERT_TRUE(fs::exists(dir / name)) << name << "\n" << out;
    EXPECT_GT(allocs_of(load_plain_pickle(dir / name)), 100) << name;
  }
  // DDP's ranks print their buckets.
  ASSERT_EQ(testing::run_cli(fmt::format("{} estimate --config {}/fixtures/models/vit_tiny_ddp.yaml --batch-sizes 1",
                                         kCli, testing::source_dir()),
                         &out),
            0)
      << out;
  EXPECT_THAT(out, ContainsRegex("rank 1: step_peak .*, DDP buckets .* \\([0-9]+ buckets\\)"));
  // memgate replay says what recorded an estimate's snapshot.
  std::string replayed;
  EXPECT_EQ(testing::run(fmt::format("{} replay {}", kCli, dir / "e_bs1_rank0.pickle"), &replayed), 1) << replayed;
  EXPECT_THAT(replayed, HasSubstr("recorded by memgate's estimate on the Meta device"));
}

TEST(ReportCliTest, EstimateWritesTheProfileJsonMarkedAsAnEstimate) {
  testing::TempDir dir;
  std::string out;
  const auto fixtures = testing::source_dir() + "/fixtures/models/";
  ASSERT_EQ(testing::run_cli(fmt::format("{} estimate --config {}retfound_green_lora.yaml --for cuda --output {} "
                                         "--html {}", kCli, fixtures, dir / "e.json", dir / "e.html"),
                             &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("memgate estimate: retfound_green_lora on estimate for CUDA"));
  EXPECT_THAT(out, HasSubstr("largest estimated batch size that fits"));
  EXPECT_THAT(out, Not(HasSubstr("step time"))) << "nothing ran on a device to time";
  const auto json = testing::read_file(dir / "e.json");
  EXPECT_THAT(json, HasSubstr("\"estimated\": true"));
  EXPECT_THAT(testing::read_file(dir / "e.html"), HasSubstr("retfound_green_lora [estimate]"));
  // A report of the estimate and a profile side by side reads both.
  ASSERT_EQ(testing::run(fmt::format("{} report {} {}vit_tiny_lora.json --output {}", kCli, dir / "e.json", profiles(),
                                     dir / "r.html"),
                         &out),
            0)
      << out;
  // The 7B fixture (bf16 autocast, frozen weights kept in bf16) on a machine without a GPU: 7.05 G parameters of
  // two bytes each, counted, not allocated.
  ASSERT_EQ(testing::run_cli(fmt::format("{} estimate --config {}lisa_7b_bf16.yaml --batch-sizes 2 --output {}", kCli,
                                     fixtures, dir / "lisa.json"),
                         &out),
            0)
      << out;
  const auto lisa = nlohmann::json::parse(testing::read_file(dir / "lisa.json"));
  const auto params = lisa.at("probes").at(0).at("components").at("params").get<std::int64_t>();
  EXPECT_GT(params, std::int64_t{7'000'000'000} * 2);
  EXPECT_LT(params, std::int64_t{7'100'000'000} * 2) << "the frozen weights in bf16, not fp32";
  EXPECT_EQ(testing::run_cli(fmt::format("{} estimate --config {}gpt_tiny.yaml --for tpu", kCli, fixtures), &out), 2);
}

// Budgets of full-size fixtures on a machine without a GPU: the GPU suite's, each from an estimate for CUDA.
// The largest batch per GPU from estimates: each answer is the boundary the plain estimate draws, batch by batch
// (its step fits the GPU's usable bytes, the next one's does not), and the micro-batch times the accumulation steps
// is the effective batch.
TEST(ReportCliTest, EstimateSearchesTheLargestBatchForEachGpu) {
  testing::TempDir dir;
  std::string out;
  const auto fixture = testing::source_dir() + "/fixtures/models/retfound_large_lora.yaml";
  ASSERT_EQ(testing::run_cli(fmt::format("{} estimate --config {} --gpu rtx_3070_8gb --gpu h100_80gb "
                                         "--effective-batch 256 --output {}",
                                         kCli, fixture, dir / "e.json"),
                         &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("Largest batch by estimate"));
  EXPECT_THAT(out, HasSubstr("rtx_3070_8gb*"));
  EXPECT_THAT(out, HasSubstr("* never measured by memgate"));
  const auto fits = nlohmann::json::parse(testing::read_file(dir / "e.json"))["largest_batch_by_estimate"];
  ASSERT_EQ(fits.size(), 2U);
  EXPECT_LT(fits[0]["largest_batch"], fits[1]["largest_batch"]) << "the larger GPU takes the larger batch";
  for (const auto& f : fits) {
    const auto largest = f["largest_batch"].get<std::int64_t>();
    ASSERT_GT(largest, 1) << f;
    // What a step needs is its reserved peak and the cuBLAS workspaces of that GPU (torch 2.11: two cuBLAS and one
    // cuBLASLt, 32 MiB each on compute capability 9.x, 8 MiB + 128 KiB elsewhere, and 1 MiB).
    const auto ws = f["library_workspace_bytes"].get<std::int64_t>();
    EXPECT_EQ(ws, f["gpu"] == "h100_80gb" ? 2 * 33'554'432 + 1'048'576 : 2 * 8'519'680 + 1'048'576) << f;
    EXPECT_EQ(f["required_bytes"].get<std::int64_t>(), f["step_peak_reserved"].get<std::int64_t>() + ws) << f;
    EXPECT_LE(f["required_bytes"], f["usable_bytes"]) << f;
    EXPECT_GT(f["next_step_peak_reserved"].get<std::int64_t>() + ws, f["usable_bytes"].get<std::int64_t>()) << f;
    EXPECT_EQ(f["gpu_measured"], false) << "neither GPU was ever measured by memgate";
    EXPECT_EQ(f["micro_batch"].get<std::int64_t>() * f["accumulation_steps"].get<std::int64_t>(), 256) << f;
    EXPECT_LE(f["micro_batch"], largest) << f;
    ASSERT_EQ(testing::run_cli(fmt::format("{} estimate --config {} --batch-sizes {},{} --output {}", kCli, fixture,
                                           largest, largest + 1, dir / "b.json"),
                           &out),
              0)
        << out;
    const auto probes = nlohmann::json::parse(testing::read_file(dir / "b.json"))["probes"];
    EXPECT_EQ(probes[0]["components"]["step_peak_reserved"], f["step_peak_reserved"]) << f;
    EXPECT_EQ(probes[1]["components"]["step_peak_reserved"], f["next_step_peak_reserved"]) << f;
  }
}

// Over several ranks every batch is per rank, and said to be; a batch the search stops at is not the largest.
TEST(ReportCliTest, EstimateSaysItsBatchesArePerRankAndWhereItsSearchStopped) {
  testing::TempDir dir;
  std::string out;
  const auto fixture = testing::source_dir() + "/fixtures/models/vit_tiny_ddp.yaml";
  ASSERT_EQ(testing::run_cli(fmt::format("{} estimate --config {} --batch-sizes 1 --world-size 4 --gpu h100_80gb "
                                     "--effective-batch 64 --output {}", kCli, fixture, dir / "e.json"),
                         &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("each of the 4 ranks on a GPU of its own: batches are per rank"));
  EXPECT_THAT(out, HasSubstr("for a batch of 64 per rank (global 256)"));
  EXPECT_THAT(out, HasSubstr(">=65536"));
  EXPECT_THAT(out, HasSubstr("the search stops at a batch of 65536"));
  const auto fits = nlohmann::json::parse(testing::read_file(dir / "e.json"))["largest_batch_by_estimate"];
  ASSERT_EQ(fits.size(), 1U);
  EXPECT_EQ(fits[0]["largest_batch"], 65536);
  EXPECT_EQ(fits[0]["search_capped"], true);
  EXPECT_EQ(fits[0]["world_size"], 4);
}

TEST(ReportCliTest, EstimateChecksASuitesBudgetsWithoutAGpu) {
  std::string out;
  const auto root = testing::source_dir() + "/fixtures";
  ASSERT_EQ(testing::run_cli(fmt::format("{} estimate --suite {}/suites/gpu.yaml", kCli, root), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("lisa_7b_bf16"));
  EXPECT_THAT(out, HasSubstr("7 of 7 budgets fit, by estimate"));
  // The distributed fixtures' budgets hold each rank on a GPU of its own.
  EXPECT_THAT(out, HasSubstr("llama_7b_fsdp"));
  EXPECT_THAT(out, HasSubstr("8 x NVIDIA A100-SXM4 (40 GB), per rank"));
  EXPECT_THAT(out, HasSubstr("4 x NVIDIA GeForce RTX 4090 (24 GB), per rank"));
  EXPECT_THAT(out, Not(HasSubstr("DOES NOT FIT")));
  // A budget no estimate can meet fails the check (exit 1) and says which.
  testing::TempDir dir;
  std::filesystem::create_directories(dir / "suites");
  std::filesystem::create_directories(dir / "models");
  std::filesystem::copy_file(root + "/models/retfound_large_full.yaml", dir / "models/retfound_large_full.yaml");
  testing::write_file(dir / "suites/tight.yaml",
                      "device: cuda\nfixtures: []\nbudgets:\n"
                      "  - {fixture: retfound_large_full, batch_size: 64, gpu: rtx_3070_8gb}\n");
  EXPECT_EQ(testing::run_cli(fmt::format("{} estimate --suite {} --gpus {}/gpus", kCli, dir / "suites/tight.yaml",
                                         root),
                             &out),
            1)
      << out;
  EXPECT_THAT(out, HasSubstr("DOES NOT FIT [estimate]"));
  EXPECT_THAT(out, HasSubstr("0 of 1 budgets fit"));
  // --suite is the whole run: a fixture or files beside it are a usage error.
  EXPECT_EQ(testing::run_cli(fmt::format("{} estimate --suite {}/suites/gpu.yaml --output x.json", kCli, root), &out),
            2);
}

// --- The browser ----------------------------------------------------------------------------------------------

// The page's DOM after its scripts ran, and a screenshot, from headless Chromium.
struct Rendered {
  std::string dom;
  std::string png;
};

Rendered render(const std::string& html, const std::string& png, int width, int height) {
  const std::string chromium = MEMGATE_CHROMIUM;
  if (chromium.empty() || chromium.ends_with("-NOTFOUND")) {
    ADD_FAILURE() << "no headless Chromium was found at configure time: apt-get install chromium-headless-shell "
                     "(ci/setup.sh installs it), then reconfigure";
    return {};
  }
  const auto flags = fmt::format("--headless --no-sandbox --disable-gpu --hide-scrollbars --window-size={},{}", width,
                                 height);
  Rendered r;
  std::string dump;
  EXPECT_EQ(testing::run(fmt::format("'{}' {} --dump-dom 'file://{}'", chromium, flags, html), &dump), 0) << dump;
  // Chromium's own log lines (no D-Bus in a container, no GPU) come first on stderr; the DOM follows.
  const auto start = dump.find("<!DOCTYPE html>");
  EXPECT_NE(start, std::string::npos) << dump;
  if (start != std::string::npos) r.dom = dump.substr(start);
  std::string out;
  EXPECT_EQ(testing::run(fmt::format("'{}' {} --screenshot='{}' 'file://{}'", chromium, flags, png, html), &out), 0)
      << out;
  r.png = testing::read_file(png);
  return r;
}

// The <html> and <body> start tags: where the page's script writes what happened.
std::string start_tag(const std::string& dom, const std::string& name) {
  const auto at = dom.find("<" + name);
  return at == std::string::npos ? "" : dom.substr(at, dom.find('>', at) - at + 1);
}

std::uint32_t big_endian(const std::string& s, std::size_t at) {
  return (std::uint32_t{static_cast<unsigned char>(s[at])} << 24) |
         (std::uint32_t{static_cast<unsigned char>(s[at + 1])} << 16) |
         (std::uint32_t{static_cast<unsigned char>(s[at + 2])} << 8) | std::uint32_t{static_cast<unsigned char>(s[at + 3])};
}

TEST(ReportBrowserTest, ChromiumLoadsTheReportWithoutScriptErrorsAndPaintsItsPlots) {
  testing::TempDir dir;
  std::string out;
  ASSERT_EQ(testing::run(fmt::format("{} report {p}resnet18_fewshot.json {p}vit_tiny_lora_advice.json --output {}", kCli,
                                     dir / "r.html", fmt::arg("p", profiles())),
                         &out),
            0)
      << out;
  const auto r = render(dir / "r.html", dir / "r.png", 1200, 1600);
  EXPECT_THAT(start_tag(r.dom, "body"), HasSubstr("data-ready=\"1\"")) << "the page's script ran to its end";
  EXPECT_THAT(start_tag(r.dom, "body"), HasSubstr("data-charts=\"3\"")) << "the browser found the three charts";
  EXPECT_EQ(start_tag(r.dom, "html"), "<html lang=\"en\">") << "no script error";
  EXPECT_EQ(count(r.dom, "<g class=\"series\""), 8 + 1) << "eight components, one advice target";
  // A PNG of the window's size, with far more in it than a blank page (about 5 KB).
  ASSERT_GE(r.png.size(), 24U);
  EXPECT_EQ(r.png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_EQ(big_endian(r.png, 16), 1200U);
  EXPECT_EQ(big_endian(r.png, 20), 1600U);
  EXPECT_GT(r.png.size(), 60'000U);

  // The check can fail: a page whose script throws is caught.
  auto broken = testing::read_file(dir / "r.html");
  broken.replace(broken.find("</body>"), 7, "<script>not_a_function();</script></body>");
  testing::write_file(dir / "broken.html", broken);
  const auto b = render(dir / "broken.html", dir / "broken.png", 800, 600);
  EXPECT_THAT(start_tag(b.dom, "html"),
              HasSubstr("data-script-errors=\"Uncaught ReferenceError: not_a_function is not defined"));
}

TEST(ReportBrowserTest, ChromiumRendersTheComparison) {
  testing::TempDir dir;
  std::string out;
  ASSERT_EQ(testing::run(fmt::format("{} compare {p}unet_tiny.json {p}unet_tiny_fp16.json --html {}", kCli,
                                     dir / "c.html", fmt::arg("p", profiles())),
                         &out),
            0)
      << out;
  const auto r = render(dir / "c.html", dir / "c.png", 1200, 1200);
  EXPECT_THAT(start_tag(r.dom, "body"), HasSubstr("data-ready=\"1\""));
  EXPECT_THAT(start_tag(r.dom, "body"), HasSubstr("data-charts=\"8\""));
  EXPECT_EQ(start_tag(r.dom, "html"), "<html lang=\"en\">") << "no script error";
  EXPECT_GT(r.png.size(), 40'000U);
}

}  // namespace
}  // namespace memgate
