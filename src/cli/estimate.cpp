// memgate estimate: every component without a GPU (the protocol on the Meta device); a suite's budgets by estimate.
#include "measure_cli.h"

#include "memgate/base/error.h"
#include "memgate/base/units.h"
#include "memgate/advise/advise.h"
#include "memgate/estimate/estimate_context.h"
#include "memgate/gate/budget.h"
#include "memgate/gate/fixture.h"
#include "memgate/gate/report.h"
#include "memgate/gate/suite.h"
#include "memgate/launch/estimate.h"
#include "memgate/measure/probe.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace memgate::cli {

namespace {

// The budgets of a suite, checked from estimates for CUDA: what a CPU runner can say before a GPU runner measures.
ExitCode check_estimated_budgets(const std::string& suite_path, const std::string& gpus_dir) {
  const auto suite = memgate::load_suite(suite_path, memgate::suite_models_dir(suite_path));
  if (suite.budgets.empty()) throw memgate::Error(suite_path + ": budgets: the suite has none to check");
  const auto gpus = memgate::load_gpus(gpus_dir);
  fmt::print("memgate estimate: the budgets of {} from estimates for CUDA (not measured; never a baseline)\n",
             suite_path);
  int over = 0;
  for (const auto& budget : suite.budgets) {
    const auto& gpu = memgate::find_gpu(gpus, budget.gpu);
    const auto fixture = memgate::load_fixture(budget.fixture_path);
    // Its reductions staged for this GPU's SMs (cuda_reduce.h).
    const memgate::EstimateContextGuard for_gpu(
        memgate::estimate_context_for_gpu({gpu.multiprocessors, gpu.max_threads_per_multiprocessor}));
    const auto probe = memgate::estimate_probe(fixture, budget.batch_size, memgate::EstimateTarget::kCuda);
    // The step's reserved peak and the cuBLAS workspaces this GPU gets beside it (a measured budget has its own).
    const auto check = memgate::check_budget(probe.components.step_peak_reserved + gpu.library_workspace_bytes(), gpu);
    over += check.fits() ? 0 : 1;
    // A distributed fixture's budget holds each rank on a GPU of its own: its components are the largest rank's.
    const auto& d = fixture.training.distributed;
    const auto on = d.enabled() ? fmt::format("{} x {}, per rank", d.world_size, gpu.name) : gpu.name;
    fmt::print("  {:<32} bs {:<4} on {:<34} needs {:>11} of {:>11} usable  {}{}\n", budget.fixture, budget.batch_size,
               on, memgate::format_bytes(check.required), memgate::format_usable(check.available),
               check.fits() ? "fits [estimate]" : "DOES NOT FIT [estimate]",
               gpu.measured ? "" : " (GPU never measured by memgate)");
  }
  fmt::print("{} of {} budgets fit, by estimate; a GPU runner's memory suite measures them\n",
             suite.budgets.size() - static_cast<std::size_t>(over), suite.budgets.size());
  return over == 0 ? kOk : kFailed;
}

}  // namespace

Run add_estimate(CLI::App& app) {
  struct Options {
    std::string config;
    std::string suite;
    std::string batch_sizes;
    std::string target = "cuda";
    ProfileFiles files;
    std::string cpu_kernels;
    std::vector<std::string> gpu;
    bool all_gpus = false;
    std::int64_t effective_batch = 0;
    std::int64_t world_size = 0;
    bool plan = false;
  };
  auto o = std::make_shared<Options>();
  auto* config = app.add_option("--config", o->config, "The model fixture (fixtures/models/<name>.yaml)")
                     ->type_name("FILE");
  app.add_option("--world-size", o->world_size,
                 "A distributed fixture over this many ranks instead of its world_size: each rank estimated")
      ->type_name("N")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{4096}));
  auto* suite = app.add_option("--suite", o->suite,
                               "Instead: check a suite's budgets (fixtures/suites/gpu.yaml) from estimates for CUDA")
                    ->type_name("FILE");
  config->excludes(suite);
  app.add_option("--batch-sizes", o->batch_sizes, "Batch sizes to estimate, e.g. 1,8,32 (default: the fixture's)")
      ->type_name("N,N,...")
      ->check(check_value(is_batch_sizes, "positive integers separated by commas (e.g. 1,8,32)"))
      ->excludes(suite);
  app.add_option("--for", o->target, "The device the estimate speaks for: cpu or cuda")
      ->capture_default_str()
      ->type_name("DEVICE")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->excludes(suite);
  add_cpu_kernels_option(app, o->cpu_kernels);
  app.add_option("--output", o->files.output,
                 "Also write the estimate as JSON (the profile's, with \"estimated\": true)")
      ->type_name("FILE")
      ->excludes(suite);
  app.add_option("--html", o->files.html, "Also write the report as HTML to this file")->type_name("FILE")->excludes(suite);
  app.add_option("--snapshot", o->files.snapshot,
                 "Write the estimated allocations for https://pytorch.org/memory_viz (<stem>_bs<N>.pickle per batch size "
                 "when there are several; a distributed fixture: <stem>[_bs<N>]_rank<r>.pickle per rank)")
      ->type_name("FILE.pickle")
      ->excludes(suite);
  app.add_option("--gpus", o->files.gpus, "Folder of GPU fixtures for the fits-on table and the budgets")
      ->capture_default_str()
      ->type_name("DIR");
  auto* gpu = app.add_option("--gpu", o->gpu, "Search the largest batch whose estimated step fits this GPU fixture "
                                              "(repeat it)")
                  ->type_name("ID")
                  ->excludes(suite);
  auto* all = app.add_flag("--all-gpus", o->all_gpus, "Search the largest batch for every GPU fixture")->excludes(suite);
  gpu->excludes(all);
  auto* effective = app.add_option("--effective-batch", o->effective_batch,
                                   "With --gpu/--all-gpus: also the micro-batch and accumulation steps that reach it")
                        ->type_name("N")
                        ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30));
  auto* plan = app.add_flag("--plan", o->plan,
                            "With --gpu/--all-gpus: also the plans that run the largest batch size (or reach "
                            "--effective-batch) on each GPU, cheapest first (memgate plan)")
                   ->excludes(suite);
  app.parse_complete_callback([config, suite, gpu, all, effective, plan] {
    if (config->count() == 0 && suite->count() == 0) throw CLI::RequiredError("--config or --suite");
    if (effective->count() > 0 && gpu->count() == 0 && all->count() == 0) {
      throw CLI::ValidationError("--effective-batch", "needs --gpu or --all-gpus");
    }
    if (plan->count() > 0 && gpu->count() == 0 && all->count() == 0) {
      throw CLI::ValidationError("--plan", "needs --gpu or --all-gpus");
    }
  });
  app.footer(footer(
      "Estimates each component without a GPU and without computing: the fixture's whole protocol (build, eval\n"
      "forward, warm-up, measured step) runs on LibTorch's Meta device, where tensors have shapes but no storage,\n"
      "and a counting allocator sees every request. An estimate is never a baseline. With --gpu or --all-gpus, also\n"
      "searches the largest batch whose estimated step (reserved) fits each GPU's usable bytes (batch 1, 2, 4, ...\n"
      "then a binary search; --effective-batch N adds the micro-batch and accumulation steps). With --suite, checks\n"
      "each of the suite's budgets from an estimate for CUDA at its batch size, and exits 1 when one does not fit."));
  return [o] {
    if (!o->suite.empty()) return check_estimated_budgets(o->suite, o->files.gpus);
    auto fixture = load_fixture_for_run(o->config, o->cpu_kernels);
    o->files.refuse_onto(fixture_inputs("--config", o->config, &fixture));
    set_world_size(fixture, o->world_size, o->config);
    const auto batch_sizes = o->batch_sizes.empty() ? fixture.batch_sizes : *parse_batch_sizes(o->batch_sizes);
    const auto target = o->target == "cpu" ? memgate::EstimateTarget::kCpu : memgate::EstimateTarget::kCuda;
    memgate::ProbeOptions options;
    if (!o->files.snapshot.empty()) options.snapshot = memgate::SnapshotOptions{};
    // The GPUs to search a batch for, checked before any work.
    const auto targets = gpu_targets(o->files.gpus, o->gpu, o->all_gpus);
    auto profile = memgate::estimate_profile(fixture, batch_sizes, target, options);
    profile.fixture_hash = fixture.hash;
    auto json = memgate::profile_to_json(profile);
    json["estimated"] = true;
    std::optional<memgate::EstimatedFits> fits;
    const std::optional<std::int64_t> accumulate_to =
        o->effective_batch > 0 ? std::optional<std::int64_t>(o->effective_batch) : std::nullopt;
    if (!targets.empty()) {
      fits = memgate::largest_batches_by_estimate(fixture, targets, accumulate_to);
      json["largest_batch_by_estimate"] = memgate::estimated_fits_to_json(*fits);
    }
    // With --plan, the plans: written with the estimate's JSON, printed after the fits.
    std::string plans;
    if (o->plan) {
      json["plans"] = plans_for(fixture, targets, accumulate_to.value_or(*std::ranges::max_element(batch_sizes)),
                                accumulate_to, plans);
    }
    write_profile(profile, json, o->files, o->config, "the estimated allocations");
    if (fits) fmt::print("{}", memgate::format_estimated_fits(*fits, accumulate_to));
    fmt::print("{}", plans);
    return kOk;
  };
}

}  // namespace memgate::cli
