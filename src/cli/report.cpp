// memgate report: one self-contained HTML page with plots of profile, estimate or advice JSON files.
#include "cli.h"

#include "memgate/base/files.h"
#include "memgate/report/html_report.h"
#include "memgate/report/profile_document.h"

#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

namespace memgate::cli {

Run add_report(CLI::App& app) {
  struct Options {
    std::vector<std::string> files;
    std::string output;
    std::string gpus = default_gpus_dir();
    std::string title;
  };
  auto o = std::make_shared<Options>();
  app.add_option("profile.json", o->files, "Profile, estimate or advice JSON (memgate profile/estimate/advise --output)")
      ->required()
      ->expected(1, -1);
  app.add_option("--output", o->output, "The HTML file to write")->required()->type_name("FILE");
  app.add_option("--gpus", o->gpus, "Folder of GPU fixtures: a line per GPU's usable memory")
      ->capture_default_str()
      ->type_name("DIR");
  app.add_option("--title", o->title, "The page's title (default: memgate report: <models>)")->type_name("TEXT");
  app.footer(footer(
      "Writes one self-contained HTML file (inline SVG charts, nothing fetched when it is opened): per file, memory\n"
      "per component against batch size with a line per GPU's usable memory, a stacked bar of what the step keeps\n"
      "at each batch size with its peaks marked, the component table and the largest batch that fits each GPU;\n"
      "an advice file shows its targets, trials and variants. With several profiles, an overview comes first."));
  return [o] {
    std::vector<FileArg> inputs{{"the GPU fixtures (--gpus)", o->gpus, true}};
    for (const auto& f : o->files) inputs.push_back({"profile.json", f});
    refuse_colliding_files(inputs, {{"--output", o->output}});
    std::vector<memgate::ProfileDocument> docs;
    for (const auto& f : o->files) docs.push_back(memgate::load_profile_document(f));
    memgate::label_documents(docs);
    write_output("--output", o->output,
                 memgate::render_report_html(docs, gpu_lines(o->gpus), {.title = o->title, .generator = generator()}));
    fmt::print("wrote {} ({} file{})\n", o->output, docs.size(), docs.size() == 1 ? "" : "s");
    return kOk;
  };
}

}  // namespace memgate::cli
