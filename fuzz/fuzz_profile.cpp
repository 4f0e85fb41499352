// Profile and advice JSON (memgate report, compare): read, compared against itself, and drawn as HTML.
#include "fuzz_common.h"
#include "memgate/report/compare.h"
#include "memgate/report/html_report.h"
#include "memgate/report/profile_document.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = memgate::fuzz::write_input(data, size, "profile.json");
  return memgate::fuzz::expect_clean([&] {
    std::vector<memgate::ProfileDocument> docs{memgate::load_profile_document(path),
                                               memgate::load_profile_document(path)};
    memgate::label_documents(docs);
    const std::vector<memgate::GpuLine> gpus{{"g", "GPU", 1 << 30, 900 << 20}};
    const auto comparison = memgate::compare_documents(docs, gpus, {.threshold_pct = 1.0});
    (void)memgate::render_report_html(docs, gpus);
    (void)memgate::render_comparison_html(docs, gpus, comparison);
  });
}
