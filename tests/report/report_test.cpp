// The report layer: profile and advice JSON read back strictly, charts, the HTML report and the comparison.
#include "memgate/base/error.h"
#include "memgate/report/compare.h"
#include "memgate/report/html_report.h"
#include "memgate/report/profile_document.h"
#include "memgate/report/svg_chart.h"
#include "test_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <regex>
#include <string>
#include <vector>

namespace memgate {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::count;

// A profile JSON as `memgate profile --output` writes it: the k-th component (from 1) of probe b is
// k x (base + b x per_sample).
nlohmann::json profile_json(const std::string& model, const std::vector<std::int64_t>& batches,
                            std::int64_t per_sample = 1000, std::int64_t base = 100000,
                            std::int64_t oom_batch = 0) {
  nlohmann::json probes = nlohmann::json::array();
  for (const auto b : batches) {
    nlohmann::json p = {{"batch_size", b}, {"probe_seconds", 0.1}};
    if (b == oom_batch) {
      p["oom"] = true;
      p["error"] = "CUDA out of memory.\nsecond line";
    } else {
      nlohmann::json c;
      std::int64_t k = 0;  // the k-th component (from 1) is k x (base + b x per_sample)
      for (const auto& info : kComponentTable) c[std::string(info.name)] = ++k * (base + b * per_sample);
      p["components"] = c;
      p["step_seconds"] = 0.01 * static_cast<double>(b);
    }
    probes.push_back(p);
  }
  return {{"device", {{"name", "AMD EPYC"}, {"slug", "cpu"}}},
          {"model", {{"name", model}, {"total_params", 10}, {"trainable_params", 4}, {"frozen_params", 6}}},
          {"probes", probes}};
}

ProfileDocument doc(const nlohmann::json& j, const std::string& path = "") {
  auto d = profile_document_from_json(j, path.empty() ? "test.json" : path);
  d.path = path;
  d.label = d.model;
  return d;
}

std::string error_of(const nlohmann::json& j) {
  try {
    (void)profile_document_from_json(j, "out/a.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(ProfileDocumentTest, ReadsEveryComponentOfEveryProbe) {
  const auto d = doc(profile_json("vit", {1, 8, 32}, 1000, 100000, 32));
  EXPECT_EQ(d.kind, ProfileDocument::Kind::kProfile);
  EXPECT_EQ(d.model, "vit");
  EXPECT_EQ(d.device_slug, "cpu");
  EXPECT_EQ(d.trainable_params, 4);
  ASSERT_EQ(d.probes.size(), 3U);
  EXPECT_EQ(d.probes[1].components.params, 100000 + 8 * 1000);
  EXPECT_EQ(d.probes[1].components.step_peak_reserved, 800000 + 8 * 8000);
  EXPECT_TRUE(d.probes[2].oom);
  EXPECT_EQ(d.probes[2].error, "CUDA out of memory.") << "the first line of the error";
  EXPECT_NE(d.measured(8), nullptr);
  EXPECT_EQ(d.measured(32), nullptr) << "out of memory is not measured";
  EXPECT_EQ(d.measured(2), nullptr);
}

TEST(ProfileDocumentTest, ReadsAnAdvice) {
  const nlohmann::json j = {
      {"device", {{"name", "AMD EPYC"}, {"slug", "cpu"}}},
      {"model", {{"name", "vit"}}},
      {"total_probes", 4},
      {"targets",
       {{{"id", "rtx_4090_24gb"},
         {"name", "NVIDIA GeForce RTX 4090"},
         {"usable_bytes", 20 << 20},
         {"batch_size", 12},
         {"predicted_batch_size", 13},
         {"fit", {{"fixed_bytes", 1000}, {"per_sample_bytes", 20}, {"max_deviation_pct", nullptr}}},
         {"trials", {{{"batch_size", 12}, {"fits", true}, {"peak_bytes", 19 << 20}},
                     {{"batch_size", 13}, {"fits", false}, {"peak_bytes", nullptr}}}},
         {"accumulation", {{"effective_batch", 64}, {"micro_batch", 8}, {"steps", 8}, {"fits", true}}},
         {"wanted_batch", 64},
         {"variants", {{{"name", "bf16 autocast"}, {"change", "training.precision: bf16"}, {"batch_size", 20}}}}}}}};
  const auto d = doc(j);
  EXPECT_EQ(d.kind, ProfileDocument::Kind::kAdvice);
  ASSERT_EQ(d.targets.size(), 1U);
  const auto& t = d.targets[0];
  EXPECT_EQ(t.batch_size, 12);
  EXPECT_EQ(t.predicted, 13);
  ASSERT_EQ(t.trials.size(), 2U);
  EXPECT_FALSE(t.trials[1].peak_bytes.has_value());
  EXPECT_EQ(t.effective_batch, 64);
  EXPECT_EQ(t.accumulation_steps, 8);
  ASSERT_EQ(t.variants.size(), 1U);
  EXPECT_EQ(t.variants[0].batch_size, 20);
  EXPECT_EQ(largest_fitting_batch(d, GpuLine{"rtx_4090_24gb", "4090", 24LL << 30, 20LL << 30}), 12);
  EXPECT_EQ(largest_fitting_batch(d, GpuLine{"a100_40gb", "A100", 40LL << 30, 36LL << 30}), std::nullopt)
      << "an advice says nothing about a GPU it was not run for";
}

TEST(ProfileDocumentTest, BadFieldsAreErrorsThatNameTheFileAndThePath) {
  auto j = profile_json("vit", {1, 2});
  j["probes"][1]["components"]["activations"] = "12";
  EXPECT_THAT(error_of(j), HasSubstr("out/a.json: probes[1].components.activations: expected an integer, got string"));
  j = profile_json("vit", {1, 2});
  j["probes"][0]["components"].erase("gradients");
  EXPECT_THAT(error_of(j), HasSubstr("probes[0].components.gradients: missing"));
  j = profile_json("vit", {1, 2});
  j["probes"][0]["components"]["params"] = -4;
  EXPECT_THAT(error_of(j), HasSubstr("probes[0].components.params: expected bytes (>= 0), got -4"));
  j = profile_json("vit", {1, 2});
  j["probes"][0]["batch_size"] = 0;
  EXPECT_THAT(error_of(j), HasSubstr("probes[0].batch_size: expected an integer >= 1"));
  j = profile_json("vit", {1});
  j.erase("probes");
  EXPECT_THAT(error_of(j), HasSubstr("out/a.json: probes: missing"));
  j = profile_json("vit", {1});
  j["device"] = "cpu";
  EXPECT_THAT(error_of(j), HasSubstr("device: expected an object, got string"));
  EXPECT_THAT(error_of(nlohmann::json::array()), HasSubstr("out/a.json: (top level): expected a JSON object"));
  j = profile_json("vit", {1});
  j["a_newer_field"] = {{"anything", 1}};
  EXPECT_EQ(error_of(j), "no error") << "fields a newer memgate adds are ignored";
}

TEST(ProfileDocumentTest, AFileThatIsNotJsonIsAnErrorNamingIt) {
  testing::TempDir dir;
  testing::write_file(dir / "a.json", "{\"device\": ");
  EXPECT_THROW(
      {
        try {
          (void)load_profile_document(dir / "a.json");
        } catch (const Error& e) {
          EXPECT_THAT(e.what(), HasSubstr(dir / "a.json"));
          EXPECT_THAT(e.what(), HasSubstr("not valid JSON"));
          throw;
        }
      },
      Error);
  EXPECT_THROW((void)load_profile_document(dir / "missing.json"), Error);
}

TEST(ProfileDocumentTest, LabelsAreUniqueAndSayWhatIsAnEstimate) {
  std::vector<ProfileDocument> docs{doc(profile_json("vit", {1}), "out/fp32.json"),
                                    doc(profile_json("vit", {1}), "out/bf16.json"),
                                    doc(profile_json("unet", {1}), "a/unet.json"),
                                    doc(profile_json("vit", {1}), "b/fp32.json")};
  docs[2].estimated = true;
  label_documents(docs);
  EXPECT_EQ(docs[0].label, "vit (fp32) #1");
  EXPECT_EQ(docs[1].label, "vit (bf16)");
  EXPECT_EQ(docs[2].label, "unet [estimate]");
  EXPECT_EQ(docs[3].label, "vit (fp32) #2");
}

TEST(ProfileDocumentTest, TheLargestFittingBatchIsTheLargestMeasuredUnderTheAllocatorsShare) {
  const auto d = doc(profile_json("vit", {1, 8, 32, 64}, 1000, 100000, 64));
  // step_peak_reserved = 800000 + b x 8000: 808000, 864000, 1056000.
  EXPECT_EQ(largest_fitting_batch(d, GpuLine{"g", "g", 0, 1056000}), 32);
  EXPECT_EQ(largest_fitting_batch(d, GpuLine{"g", "g", 0, 1055999}), 8);
  EXPECT_EQ(largest_fitting_batch(d, GpuLine{"g", "g", 0, 807999}), std::nullopt);
}

TEST(SvgChartTest, ByteTicksUseABinaryUnitAndCoverTheMaximum) {
  const auto t = byte_ticks(3.4 * 1048576);
  EXPECT_EQ(t.unit, "MiB");
  EXPECT_GE(t.top_bytes, 3.4 * 1048576);
  EXPECT_LE(t.top_bytes / t.step_bytes, 7.0);
  EXPECT_EQ(t.label(2.5 * 1048576), "2.5 MiB");
  const auto g = byte_ticks(70.0 * 1073741824);
  EXPECT_EQ(g.unit, "GiB");
  EXPECT_EQ(g.step_bytes, 20.0 * 1073741824);
  EXPECT_EQ(g.top_bytes, 80.0 * 1073741824);
  EXPECT_EQ(byte_ticks(0).unit, "B");
  EXPECT_GE(byte_ticks(3).step_bytes, 1.0) << "no fraction of a byte";
}

TEST(SvgChartTest, ALineChartDrawsEverySeriesAndTheLevelsInReach) {
  LineChart chart;
  chart.title = "a <title> & more";
  chart.series.push_back({"params", "#4e79a7", {{1, 100.0, ""}, {8, 100.0, ""}}, false});
  chart.series.push_back({"activations", "#76b7b2", {{1, 50.0, ""}, {8, 400.0, "custom"}}, true});
  chart.levels = {{"small GPU", 600.0}, {"huge GPU", 1e12}};
  const auto svg = render_line_chart(chart);
  EXPECT_EQ(count(svg, "<g class=\"series\""), 2);
  EXPECT_EQ(count(svg, "<circle"), 4);
  EXPECT_EQ(count(svg, "<g class=\"level\""), 1) << "600 B is within 2x of 400 B; 1 TB is not";
  EXPECT_THAT(svg, HasSubstr("Not drawn, more than 2x the largest value above: huge GPU"));
  EXPECT_THAT(svg, HasSubstr("a &lt;title&gt; &amp; more"));
  EXPECT_THAT(svg, Not(HasSubstr("a <title> &")));
  EXPECT_THAT(svg, HasSubstr("<title>custom</title>"));
  EXPECT_THAT(svg, HasSubstr("stroke-dasharray"));
  EXPECT_THAT(svg, HasSubstr("batch size (log scale)")) << "1 to 8 spans a factor of 8";
}

TEST(SvgChartTest, StackedBarsDrawEachLayerAndMarkAndSayOom) {
  StackedBars chart;
  chart.layer_names = {"params", "activations"};
  chart.layer_colors = {"#111", "#222"};
  chart.mark_names = {"peak"};
  chart.bars = {{"bs 1", {100.0, 50.0}, {170.0}, false, "OOM"}, {"bs 2", {}, {}, true, "OOM"}};
  const auto svg = render_stacked_bars(chart);
  EXPECT_EQ(count(svg, "<rect class=\"layer\""), 2);
  EXPECT_EQ(count(svg, "<line class=\"mark\""), 2) << "one on the bar, one in the legend";
  EXPECT_THAT(svg, HasSubstr(">OOM</text>"));
  EXPECT_THAT(svg, HasSubstr("bs 1, activations: 50 B (50 bytes)"));
}

TEST(CompareTest, EveryComponentAtEveryCommonBatchSizeAgainstTheFirst) {
  std::vector<ProfileDocument> docs{doc(profile_json("full", {1, 2, 4, 8}, 1000)),
                                    doc(profile_json("lora", {1, 4, 8}, 1100, 100000, 8))};
  const auto c = compare_documents(docs, {GpuLine{"g", "Small GPU", 2 << 20, 820000}});
  EXPECT_EQ(c.common_batch_sizes, (std::vector<std::int64_t>{1, 4})) << "8 ran out of memory in lora";
  ASSERT_EQ(c.differences.size(), 2U * kComponentTable.size());
  const auto& d = c.differences[kComponentTable.size() + 3];  // bs 4, activations
  EXPECT_EQ(d.batch_size, 4);
  EXPECT_EQ(d.component, "activations");
  EXPECT_EQ(d.reference, 400000 + 4 * 4000);
  EXPECT_EQ(d.value, 400000 + 4 * 4400);
  EXPECT_EQ(d.delta(), 1600);
  EXPECT_NEAR(*d.pct(), 100.0 * 1600 / 416000, 1e-9);
  EXPECT_FALSE(c.failed()) << "no threshold: a comparison, not a gate";
  EXPECT_THAT(c.text, HasSubstr("batch size 4"));
  EXPECT_THAT(c.text, HasSubstr("+1.6 KiB (+0.38%)"));
  EXPECT_THAT(c.text, Not(HasSubstr("batch size 2\n")));
  // The small GPU has 820000 usable: step_peak_reserved 808000 (bs 1 full), 808800 (bs 1 lora),
  // 816000 (bs 2 full), 835200 (bs 4 lora).
  EXPECT_THAT(c.text, ::testing::ContainsRegex("Small GPU +2 +1\n"));
}

TEST(CompareTest, AThresholdFailsOnWhatGrewBeyondIt) {
  std::vector<ProfileDocument> docs{doc(profile_json("a", {1, 2})), doc(profile_json("b", {1, 2}, 1000, 101000))};
  const auto loose = compare_documents(docs, {}, {.threshold_pct = 1.0});
  EXPECT_FALSE(loose.failed()) << "every component grew by less than 1%";
  const auto tight = compare_documents(docs, {}, {.threshold_pct = 0.1});
  EXPECT_TRUE(tight.failed());
  EXPECT_EQ(tight.over_threshold.size(), 2U * kComponentTable.size());
  EXPECT_THAT(tight.text, HasSubstr("components grew by more than 0.1% against A"));
  EXPECT_THROW((void)compare_documents({docs[0]}, {}), Error);
}

TEST(CompareTest, SaysWhenNoBatchSizeIsShared) {
  std::vector<ProfileDocument> docs{doc(profile_json("a", {1, 2})), doc(profile_json("b", {4, 8}, 1000, 100000, 8))};
  const auto c = compare_documents(docs, {});
  EXPECT_TRUE(c.common_batch_sizes.empty());
  EXPECT_THAT(c.text, HasSubstr("no batch size was measured in every profile"));
  EXPECT_THAT(c.text, HasSubstr("B: 4,8 (OOM)"));
}

TEST(HtmlReportTest, ThePageIsSelfContainedAndHoldsThePlots) {
  std::vector<ProfileDocument> docs{doc(profile_json("vit<script>", {1, 2, 4}, 1000, 100000, 4)),
                                    doc(profile_json("unet", {1, 2}))};
  const std::vector<GpuLine> gpus{{"g", "Big GPU", 80LL << 30, 70LL << 30}, {"s", "Tiny GPU", 1 << 20, 900000}};
  const auto html = render_report_html(docs, gpus, {.title = "", .generator = "memgate test"});
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0U);
  EXPECT_EQ(count(html, "http://"), 0) << "nothing fetched when the page is opened";
  EXPECT_EQ(count(html, "https://"), 0);
  EXPECT_EQ(count(html, "src="), 0);
  // An overview, then per profile a component chart and a stacked bar chart.
  EXPECT_EQ(count(html, "<svg class=\"memgate-chart"), 5);
  EXPECT_GT(count(html, "vit&lt;script&gt;"), 0);
  EXPECT_EQ(count(html, "vit<script>"), 0) << "names are escaped";
  EXPECT_GT(count(html, "<g class=\"level\"><line"), 0) << "a GPU line within reach is drawn";
  EXPECT_GT(count(html, "Tiny GPU: 0.9 MiB usable"), 0) << "a GPU's usable memory, as every output prints it";
  EXPECT_GT(count(html, ">OOM<"), 0);
  EXPECT_GT(count(html, "Made by memgate test"), 0);
  const auto compare = compare_documents(docs, gpus);
  const auto chtml = render_comparison_html(docs, gpus, compare);
  EXPECT_EQ(count(chtml, "<svg class=\"memgate-chart"), static_cast<int>(kComponentTable.size()));
  EXPECT_EQ(count(chtml, "<table class=\"compare\">"), 2) << "batch sizes 1 and 2";
  EXPECT_GT(count(chtml, "class=\"same\""), 0);
}

// A profile with a per-module breakdown (a Python fixture's on the CPU) shows which modules hold the bytes of its
// largest batch size, escaped; a breakdown that is not bytes by module is an error naming the key.
TEST(HtmlReportTest, APerModuleBreakdownIsShown) {
  auto j = profile_json("seg", {1, 2});
  j["probes"][1]["modules"] = {{"activations", {{"decoder.up<x>", 4096}, {"encoder", 512}}},
                               {"step_peak", {{"(building the model)", 9000}, {"decoder.up<x>", 4096}}}};
  const auto d = doc(j);
  ASSERT_EQ(d.probes[1].modules.find("activations")->at("encoder"), 512);
  const auto html = render_report_html({d}, {}, {.title = "", .generator = "memgate test"});
  EXPECT_EQ(count(html, "<h3>By module, batch size 2</h3>"), 1);
  EXPECT_EQ(count(html, "<td>decoder.up&lt;x&gt;</td>"), 1) << "one row per module";
  EXPECT_EQ(count(html, "<td>(building the model)</td>"), 1);
  EXPECT_LT(html.find("(building the model)"), html.find("decoder.up&lt;x&gt;</td>")) << "the largest first";
  EXPECT_GT(count(html, "<td title=\"4096 bytes\">4.0 KiB</td>"), 0);
  EXPECT_EQ(count(render_report_html({doc(profile_json("plain", {1}))}, {}, {}), "By module"), 0);
  j["probes"][1]["modules"] = {{"activations", {{"encoder", "big"}}}};
  EXPECT_THAT(error_of(j), HasSubstr("out/a.json: probes[1].modules.activations.encoder: expected a whole number"));
}

}  // namespace
}  // namespace memgate
