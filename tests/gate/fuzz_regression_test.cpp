// Inputs the fuzz targets once found mishandled (fuzz/regressions/<target>/), replayed by every build: each must get
// memgate::Error (a clear error about the input) or load, and nothing else.
#include "memgate/base/error.h"
#include "memgate/bench/bench_compare.h"
#include "memgate/gate/baseline.h"
#include "memgate/gate/budget.h"
#include "memgate/gate/fixture.h"
#include "memgate/gate/suite.h"
#include "memgate/report/summary.h"
#include "memgate/report/compare.h"
#include "memgate/report/html_report.h"
#include "memgate/report/profile_document.h"
#include "memgate/allocator/replay.h"
#include "memgate/report/replay_report.h"
#include "memgate/allocator/snapshot_pickle.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <map>

namespace memgate {
namespace {

TEST(FuzzRegressionTest, EveryKeptCrasherIsNowAClearErrorOrLoads) {
  const std::map<std::string, std::pair<std::string, std::function<void(const std::string&)>>> readers = {
      {"fixture", {"models/fixture.yaml", [](const std::string& p) { (void)load_fixture(p); }}},
      {"suite", {"suites/suite.yaml", [](const std::string& p) {
                   (void)load_suite(p, testing::source_dir() + "/fixtures/models");
                 }}},
      {"gpu", {"gpus/gpu.yaml", [](const std::string& p) { (void)load_gpu(p); }}},
      {"baseline", {"cpu/vit_tiny_lora.json", [](const std::string& p) {
                      (void)load_baseline(p, "vit_tiny_lora", "cpu");
                    }}},
      {"bench", {"bench.json", [](const std::string& p) { (void)load_bench_json(p); }}},
      {"results", {"results.jsonl", [](const std::string& p) { (void)summarize_results(p); }}},
      {"profile", {"profile.json", [](const std::string& p) {
                     std::vector<ProfileDocument> docs{load_profile_document(p), load_profile_document(p)};
                     label_documents(docs);
                     const auto c = compare_documents(docs, {GpuLine{"g", "GPU", 1 << 30, 900 << 20}});
                     (void)render_report_html(docs, {});
                     (void)render_comparison_html(docs, {}, c);
                   }}},
      {"snapshot", {"snapshot.pickle", [](const std::string& p) {
                      // The streamed reader memgate replay uses, then the general reader and read_snapshot's tree.
                      try {
                        (void)replay_html(replay_snapshot(load_snapshot(p), {{"64 MiB", {}, 64 << 20}}));
                      } catch (const Error&) {
                      }
                      const auto data = load_plain_pickle(p, {.max_values = 1 << 20, .max_depth = 256});
                      const auto report = replay_snapshot(read_snapshot(data, p), {{"64 MiB", {}, 64 << 20}});
                      (void)replay_html(report);
                    }}},
  };
  int replayed = 0;
  for (const auto& [target, reader] : readers) {
    const auto dir = std::filesystem::path(testing::source_dir()) / "fuzz" / "regressions" / target;
    if (!std::filesystem::is_directory(dir)) continue;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      testing::TempDir tmp;
      const auto path = tmp / reader.first;
      std::filesystem::create_directories(std::filesystem::path(path).parent_path());
      std::filesystem::copy_file(entry.path(), path);
      try {
        reader.second(path);
      } catch (const Error&) {
      } catch (const std::exception& e) {
        ADD_FAILURE() << entry.path() << ": " << typeid(e).name() << ": " << e.what();
      }
      ++replayed;
    }
  }
  RecordProperty("replayed", replayed);
}

}  // namespace
}  // namespace memgate
