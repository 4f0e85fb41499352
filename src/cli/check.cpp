// memgate check: the gate for fixtures or a suite outside CTest, with the memory suite's verdicts.
#include "measure_cli.h"

#include "memgate/base/progress.h"
#include "memgate/gate/fixture.h"
#include "memgate/gate/suite.h"
#include "memgate/gate/verdict.h"
#include "memgate/backend/device.h"
#include "memgate/measure/probe.h"
#include "memgate/base/files.h"
#include "memgate/report/check_report.h"

#include <fmt/format.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace memgate::cli {
namespace {

struct ReportFiles {
  std::string junit, markdown, json, html;
};

// --junit, --markdown, --json, --html and $GITHUB_STEP_SUMMARY: the check's reports (report/check_report.h), written.
void write_reports(const ReportFiles& files, const memgate::CheckReport& report) {
  if (!files.json.empty()) write_output("--json", files.json, memgate::render_check_json(report));
  if (!files.junit.empty()) write_output("--junit", files.junit, memgate::render_check_junit(report));
  if (!files.html.empty()) write_output("--html", files.html, memgate::render_check_html(report, generator()));
  const char* step_summary = std::getenv("GITHUB_STEP_SUMMARY");
  const bool to_step_summary = step_summary != nullptr && *step_summary != '\0';  // append_step_summary reads it
  if (files.markdown.empty() && !to_step_summary) return;
  const auto md = memgate::render_check_markdown(report);
  if (!files.markdown.empty()) write_output("--markdown", files.markdown, md);
  if (to_step_summary) append_step_summary(md);
}

}  // namespace

Run add_check(CLI::App& app) {
  struct Options {
    std::int64_t rank_timeout = 0;  // --rank-timeout, 0: the default
    std::vector<std::string> configs;
    std::string suite;
    std::string batch_sizes;
    std::string device = "auto";
    std::string baselines = memgate::project_dir() + "/baselines";
    bool strict = false;
    bool exact = false;
    bool update = false;
    std::string cpu_kernels;
    std::string junit, markdown, json, html;
  };
  auto o = std::make_shared<Options>();
  auto* configs = app.add_option("--config", o->configs, "Model fixtures to gate (repeat the flag for several)")
                      ->type_name("FILE");
  auto* suite = app.add_option("--suite", o->suite, "A suite file (fixtures/suites/<name>.yaml): its probes")
                    ->type_name("FILE");
  configs->excludes(suite);
  // Checked while parsing, so that its absence is a usage error (exit 2).
  app.parse_complete_callback([configs, suite] {
    if (configs->count() == 0 && suite->count() == 0) throw CLI::RequiredError("--config or --suite");
  });
  app.add_option("--batch-sizes", o->batch_sizes, "With --config: batch sizes (default: the fixture's)")
      ->type_name("N,N,...")
      ->check(check_value(is_batch_sizes, "positive integers separated by commas (e.g. 1,8,32)"))
      ->excludes(suite);
  app.add_option("--device", o->device, "auto (a GPU if LibTorch sees one), cpu, cuda or cuda:N")
      ->capture_default_str()
      ->type_name("DEVICE")
      ->check(check_value(is_device_spec, "auto, cpu, cuda or cuda:N"));
  app.add_option("--baselines", o->baselines, "The baselines folder (<folder>/<device>/<fixture>.json)")
      ->capture_default_str()
      ->type_name("DIR");
  app.add_flag("--strict", o->strict, "Stale and missing baselines fail too (as MEMGATE_STRICT=1)");
  app.add_flag("--exact", o->exact,
               "Every component must equal its baseline to the byte, within the tolerance or not (implies "
               "--strict): proves that a runner, a cap or a change leaves the bytes as they were");
  app.add_flag("--update-baselines", o->update,
               "Record these probes' baselines from this measurement instead of judging them (what the "
               "update-baselines preset does for the memory suite): only the probes that ran are rewritten")
      ->excludes("--strict")
      ->excludes("--exact");
  for (auto [flag, target, what] :
       {std::tuple{"--junit", &o->junit,
                   "Also write the verdicts as JUnit XML for CI test reports: a test per fixture, batch size and "
                   "component (the memory suite's test names), failures with the gate's messages"},
        std::tuple{"--markdown", &o->markdown,
                   "Also write the Markdown summary (the memory suite's, as memgate summary writes it); it is "
                   "appended to $GITHUB_STEP_SUMMARY whenever that is set"},
        std::tuple{"--json", &o->json,
                   "Also write the verdicts as one JSON document: the verdict line's counts, a row per fixture, batch "
                   "size and component (status, baseline, measured, allowed, message, the modules that changed), the "
                   "fixtures not judged"},
        std::tuple{"--html", &o->html,
                   "Also write an HTML page: for each fixture that changed, its baseline against this run (charts, "
                   "every component) and the modules whose bytes changed (memgate summary --html's page)"}}) {
    app.add_option(flag, *target, what)->type_name("FILE")->excludes("--update-baselines");
  }
  add_cpu_kernels_option(app, o->cpu_kernels);
  add_rank_timeout_option(app, o->rank_timeout);
  app.footer(footer(
      "Runs the gate outside CTest: measures each probe once and judges every component against its baseline\n"
      "with the same verdicts as the memory suite (ok, regression, stale, missing, changed, oom). Prints what is\n"
      "not ok, then one line of counts; exits 1 when the gate fails. With --exact, a component that differs from\n"
      "its baseline by any byte is printed as 'differs' and fails."));
  return [o] {
    check_env_switches();
    // What every "record them with" message names: this command's --update-baselines with the flags it ran with.
    const memgate::RecordCommand record{
        .cli = true,
        .baselines_dir = o->baselines == memgate::project_dir() + "/baselines" ? std::string() : o->baselines,
        .device = o->device};
    // Each fixture is judged on its own: one that does not load or cannot be measured is reported as an error of its
    // own, and every other fixture of the run is still judged (the exit is the worst: 3, then 1, then 0).
    struct Job {
      std::string path;
      std::optional<memgate::Fixture> fixture;
      std::vector<std::int64_t> batch_sizes;
      std::string error;  ///< why it could not be loaded
    };
    std::vector<Job> jobs;
    // A value of the flag that names no folder: said before anything is measured (a usage error, exit 2).
    if (std::error_code ec; std::filesystem::exists(o->baselines, ec) && !std::filesystem::is_directory(o->baselines, ec)) {
      throw UsageError(fmt::format("--baselines {}: is {}, not a folder: expected the baselines folder "
                                   "(<folder>/<device>/<fixture>.json; made where missing)",
                                   o->baselines, std::filesystem::is_regular_file(o->baselines, ec) ? "a file" : "no folder"));
    }
    auto device = memgate::resolve_device(o->device);
    std::vector<FileArg> inputs = project_inputs(o->baselines);
    const auto load = [&](const std::string& path, const std::vector<std::int64_t>& sizes) {
      Job job{.path = path};
      try {
        job.fixture = load_fixture_for_run(path, o->cpu_kernels);
        for (auto& f : fixture_inputs(o->suite.empty() ? "--config" : "a fixture of --suite", path, &*job.fixture)) {
          inputs.push_back(std::move(f));
        }
        job.batch_sizes = sizes.empty() ? job.fixture->batch_sizes : sizes;
      } catch (const std::exception& e) {
        job.error = e.what();
        inputs.push_back({o->suite.empty() ? "--config" : "a fixture of --suite", path});
      }
      jobs.push_back(std::move(job));
    };
    if (!o->suite.empty()) {
      inputs.push_back({"--suite", o->suite});
      const auto s = memgate::load_suite(o->suite, memgate::suite_models_dir(o->suite));
      if (o->device == "auto") device = memgate::resolve_device(s.device == memgate::SuiteDevice::kCuda ? "cuda" : "cpu");
      for (const auto& f : memgate::suite_fixtures(s)) {
        if (!f.error.empty()) {
          jobs.push_back({.path = f.path, .error = f.error});
          inputs.push_back({"a fixture of --suite", f.path});
        }
        else if (!f.batch_sizes.empty()) load(f.path, f.batch_sizes);
      }
    } else {
      const auto sizes = o->batch_sizes.empty() ? std::vector<std::int64_t>{} : *parse_batch_sizes(o->batch_sizes);
      for (const auto& path : o->configs) load(path, sizes);
    }
    // Before any probe: no report may land on what this run reads (a fixture, the suite, a baseline, the GPU
    // fixtures), nor two reports on one file.
    refuse_colliding_files(inputs, {{"--junit", o->junit}, {"--markdown", o->markdown}, {"--json", o->json},
                                    {"--html", o->html}});
    int errors = 0;
    std::vector<memgate::NotJudged> not_judged;
    // As any other error of the command (memgate: error: ...), once per fixture; the run goes on.
    const auto report_error = [&](const std::string& what, const std::string& why) {
      ++errors;
      not_judged.push_back({what, why});
      std::fflush(stdout);
      fmt::print(stderr, "memgate: error: {}{}\n", why.find(what) == std::string::npos ? what + ": " : "", why);
    };
    if (o->update) {
      memgate::ProbeOptions options;
      if (o->rank_timeout > 0) options.rank_timeout = std::chrono::seconds(o->rank_timeout);
      for (const auto& job : jobs) {
        if (!job.fixture) {
          report_error(job.path, job.error);
          continue;
        }
        try {
          const auto recorded =
              memgate::record_fixture(*job.fixture, job.batch_sizes, device, o->baselines, options);
          fmt::print("{} {}\n", recorded.changed ? "recorded" : "unchanged", recorded.path);
        } catch (const std::exception& e) {
          report_error(job.fixture->name, e.what());
        }
      }
      if (errors > 0) {
        fmt::print("memgate check --update-baselines: {} of {} fixtures not recorded (their baselines are as they "
                   "were)\n", errors, jobs.size());
        return kError;
      }
      return kOk;
    }
    memgate::CheckReport report;
    // --strict, --exact or MEMGATE_STRICT on: stale and missing baselines fail too.
    report.strict = o->strict || o->exact || memgate::strict_mode();
    report.missing_fails = memgate::missing_fails(report.strict);
    bool failed = false;
    memgate::Progress progress;
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      const auto& job = jobs[i];
      if (!job.fixture) {
        report_error(job.path, job.error);
        continue;
      }
      const auto item = fmt::format("{} ({}/{} fixtures)", job.fixture->name, i + 1, jobs.size());
      memgate::ProbeOptions options;
      options.on_phase = [&](std::string_view phase) { progress.update(item, phase); };
      if (o->rank_timeout > 0) options.rank_timeout = std::chrono::seconds(o->rank_timeout);
      memgate::FixtureVerdicts judged;
      try {
        judged = memgate::judge_fixture(*job.fixture, job.batch_sizes, device, o->baselines, {}, options, record);
      } catch (const std::exception& e) {
        progress.done(fmt::format("{}: not judged", item));
        report_error(job.fixture->name, e.what());
        continue;
      }
      progress.done(fmt::format("{}: {} probes judged", item, judged.probes.size()));
      report.probes += job.batch_sizes.size();
      report.compared += memgate::compared_components(judged.components);
      for (const auto& v : judged.components) {
        if (v.status == memgate::Status::kMissing) {
          report.searched.insert(std::filesystem::absolute(std::filesystem::path(judged.baseline_file).parent_path())
                                     .lexically_normal()
                                     .string());
          if (report.record_hint.empty()) {
            report.record_hint = memgate::record_command(*job.fixture, judged.device, record);
          }
        }
        // --exact: bytes within the tolerance that are not the baseline's are a difference of their own.
        const bool differs = o->exact && (v.status == memgate::Status::kOk || v.status == memgate::Status::kStale) &&
                             v.baseline && v.measured && *v.baseline != *v.measured;
        const bool fails = differs || memgate::fails(v.status, report.strict);
        failed = failed || fails;
        report.components.push_back({.verdict = v, .device = judged.device.slug, .fails = fails, .differs = differs});
      }
    }
    report.not_judged = not_judged;
    report.device = device.str();
    fmt::print("{}", memgate::render_check_screen(report));
    write_reports({o->junit, o->markdown, o->json, o->html}, report);
    if (errors > 0) return kError;
    return failed ? kFailed : kOk;
  };
}

}  // namespace memgate::cli
