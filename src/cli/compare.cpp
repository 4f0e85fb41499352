// memgate compare: profiles side by side, every component and its difference from the first, batch per GPU.
#include "cli.h"

#include "memgate/base/files.h"
#include "memgate/report/compare.h"
#include "memgate/report/html_report.h"
#include "memgate/report/profile_document.h"

#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

namespace memgate::cli {

Run add_compare(CLI::App& app) {
  struct Options {
    std::vector<std::string> files;
    std::string html;
    std::string gpus = default_gpus_dir();
    double threshold_pct = 0.0;
  };
  auto o = std::make_shared<Options>();
  app.add_option("profile.json", o->files, "Two or more profile (or advice) JSON files; the first is the reference")
      ->required()
      ->expected(2, -1);
  app.add_option("--html", o->html, "Also write the comparison as HTML to this file")->type_name("FILE");
  app.add_option("--gpus", o->gpus, "Folder of GPU fixtures for the largest batch per GPU")
      ->capture_default_str()
      ->type_name("DIR");
  auto* threshold = app.add_option("--threshold-pct", o->threshold_pct,
                                   "Fail (exit 1) when a later file exceeds the first in any component by more than this")
                        ->type_name("PCT")
                        ->check(check_value(is_finite_non_negative, "a finite number >= 0"));
  app.footer(footer(
      "Puts variants side by side (e.g. ViT-L vs ViT-S, LoRA vs full, fp32 vs bf16): every component at every\n"
      "batch size measured in all of them, each later file's difference from the first in bytes and %, and the\n"
      "largest batch that fits each GPU for each. Exits 1 only with --threshold-pct, when something grew beyond it."));
  return [o, threshold] {
    std::vector<FileArg> inputs{{"the GPU fixtures (--gpus)", o->gpus, true}};
    for (const auto& f : o->files) inputs.push_back({"profile.json", f});
    refuse_colliding_files(inputs, {{"--html", o->html}});
    std::vector<memgate::ProfileDocument> docs;
    for (const auto& f : o->files) docs.push_back(memgate::load_profile_document(f));
    memgate::label_documents(docs);
    memgate::ProfileCompareOptions options;
    if (threshold->count() > 0) options.threshold_pct = o->threshold_pct;
    const auto gpus = gpu_lines(o->gpus);
    const auto comparison = memgate::compare_documents(docs, gpus, options);
    fmt::print("{}", comparison.text);
    if (!o->html.empty()) {
      write_output("--html", o->html,
                   memgate::render_comparison_html(docs, gpus, comparison, {.title = "", .generator = generator()}));
      fmt::print("\nwrote {}\n", o->html);
    }
    return comparison.failed() ? kFailed : kOk;
  };
}

}  // namespace memgate::cli
