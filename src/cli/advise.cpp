// memgate advise: the largest batch that fits each GPU (or a capacity), predicted and confirmed by probes.
#include "measure_cli.h"

#include "memgate/base/files.h"
#include "memgate/base/progress.h"
#include "memgate/base/units.h"
#include "memgate/gate/report.h"
#include "memgate/advise/advise.h"
#include "memgate/gate/fixture.h"
#include "memgate/backend/device.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace memgate::cli {

Run add_advise(CLI::App& app) {
  struct Options {
    std::int64_t rank_timeout = 0;  // --rank-timeout, 0: the default
    std::string config;
    std::vector<std::string> gpu;
    bool all_gpus = false;
    std::int64_t capacity_mib = 0;
    std::string device = "auto";
    std::int64_t effective_batch = 0;
    bool from_estimates = true;
    std::string output;
    std::string gpus = default_gpus_dir();
    std::string cpu_kernels;
    std::int64_t world_size = 0;
  };
  auto o = std::make_shared<Options>();
  app.add_option("--config", o->config, "The model fixture (fixtures/models/<name>.yaml)")->required()->type_name("FILE");
  auto* gpu = app.add_option("--gpu", o->gpu, "A GPU fixture to advise for (fixtures/gpus/<id>.yaml; repeat it)")
                  ->type_name("ID");
  auto* all = app.add_flag("--all-gpus", o->all_gpus, "Advise for every GPU fixture");
  auto* capacity = app.add_option("--capacity-mib", o->capacity_mib,
                                  "Advise for this many usable MiB (on the CPU: the counting allocator's cap)");
  capacity->type_name("MIB")->check(check_value(is_memory_limit_mib, fmt::format("a positive integer of at most {}",
                                                                                 kMaxMemoryLimitMib)));
  gpu->excludes(all);
  app.add_option("--device", o->device, "auto (a GPU if LibTorch sees one), cpu, cuda or cuda:N")
      ->capture_default_str()
      ->type_name("DEVICE")
      ->check(check_value(is_device_spec, "auto, cpu, cuda or cuda:N"));
  app.add_option("--effective-batch", o->effective_batch,
                 "Also find the micro-batch and accumulation steps that reach this batch on each target")
      ->type_name("N")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30));
  add_cpu_kernels_option(app, o->cpu_kernels);
  add_rank_timeout_option(app, o->rank_timeout);
  app.add_flag("--from-estimates,!--no-from-estimates", o->from_estimates,
               "Pick each probe from estimates (memgate estimate) scaled by the measured peaks (the default), or, with "
               "--no-from-estimates, from the line through the measured peaks");
  app.add_option("--world-size", o->world_size,
                 "A distributed fixture over this many ranks instead of its world_size: the largest micro-batch "
                 "each rank fits")
      ->type_name("N")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{4096}));
  app.add_option("--output", o->output, "Also write the advice as JSON to this file")->type_name("FILE");
  app.add_option("--gpus", o->gpus, "Folder of GPU fixtures")->capture_default_str()->type_name("DIR");
  app.parse_complete_callback([gpu, all, capacity] {
    if (gpu->count() == 0 && all->count() == 0 && capacity->count() == 0) {
      throw CLI::RequiredError("--gpu, --all-gpus or --capacity-mib");
    }
  });
  app.footer(footer(
      "Finds the largest batch whose whole training step (eval, the first and a later optimizer step) runs on each\n"
      "target: one probe at batch 1 predicts it from the affine model of the step's peak, a probe under an\n"
      "allocator cap of the target's usable bytes confirms it, and one more shows that the next batch up does\n"
      "not fit; a wrong prediction is corrected and said. Usable bytes of a GPU fixture: memory x usable_fraction\n"
      "- outside_allocator_mib. A GPU this machine cannot run probes for (no GPU here, or a smaller one) is\n"
      "answered at once from estimates for CUDA (memgate estimate --gpu), labelled as such, not by probes on the\n"
      "CPU under a GPU-sized cap; --capacity-mib N probes a cap on any device. Each probe prints a line. For each\n"
      "GPU that the wanted batch (--effective-batch, else the fixture's largest) does not fit, the plans that make\n"
      "it fit follow, cheapest first (memgate plan, by estimate)."));
  return [o] {
    // The GPUs first: an unknown id is a usage error, before any work.
    const auto gpus = gpu_targets(o->gpus, o->gpu, o->all_gpus);
    auto fixture = load_fixture_for_run(o->config, o->cpu_kernels);
    auto inputs = fixture_inputs("--config", o->config, &fixture);
    inputs.push_back({"the GPU fixtures (--gpus)", o->gpus.empty() ? default_gpus_dir() : o->gpus, true});
    refuse_colliding_files(inputs, {{"--output", o->output}});
    set_world_size(fixture, o->world_size, o->config);
    const auto device = memgate::resolve_device(o->device);
    // A GPU target is probed under its cap only on a GPU at least its usable size; elsewhere the probes would be the
    // CPU's (minutes to hours at a GPU's size, and not CUDA's kernels) or could not reach the cap: the estimate
    // for CUDA answers it at once instead.
    const auto here = device.is_cuda() ? memgate::device_total_memory(device) : std::int64_t{0};
    std::vector<memgate::AdviceTarget> targets, by_estimate;
    for (const auto& t : gpus) (device.is_cuda() && here >= t.usable_bytes ? targets : by_estimate).push_back(t);
    if (o->capacity_mib > 0) {
      targets.push_back({"capacity", fmt::format("{} MiB", o->capacity_mib), o->capacity_mib << 20});
    }
    memgate::AdviseOptions options;
    if (o->effective_batch > 0) options.effective_batch = o->effective_batch;
    if (!fixture.batch_sizes.empty()) options.wanted_batch = fixture.batch_sizes.back();
    options.from_estimates = o->from_estimates;
    memgate::Progress progress;
    std::string item;
    int probes = 0;
    options.on_probe = [&](std::string_view what) {
      item = fmt::format("probe {}: {}", ++probes, what);
      progress.update(item);
    };
    options.probe.on_phase = [&](std::string_view phase) { progress.update(item, phase); };
    // Every probe leaves a line: what it was for and what it gave.
    options.on_probe_done = [&](std::string_view, const memgate::ProbeResult& r) {
      progress.done(r.oom ? fmt::format("{}: out of memory ({:.1f} s)", item, r.seconds)
                          : fmt::format("{}: step peak {} ({:.1f} s)", item,
                                        memgate::format_bytes(std::max(r.components.step_peak_reserved,
                                                                       r.components.eval_peak) +
                                                              r.bytes_beside_components()),
                                        r.seconds));
    };
    if (o->rank_timeout > 0) options.probe.rank_timeout = std::chrono::seconds(o->rank_timeout);
    nlohmann::json json;
    // The batch wanted (--effective-batch, else the fixture's largest) and the GPUs it does not fit: planned below.
    const std::int64_t wanted =
        o->effective_batch > 0 ? o->effective_batch : options.wanted_batch.value_or(std::int64_t{0});
    std::vector<memgate::AdviceTarget> unfit;
    if (!targets.empty()) {
      const auto advice = memgate::advise(fixture, targets, device, options);
      progress.done(fmt::format("{}: {} probes", fixture.name, probes));
      fmt::print("{}", memgate::format_advice(advice));
      json = memgate::advice_to_json(advice);
      for (const auto& t : advice.targets) {
        const bool gpu = std::ranges::any_of(gpus, [&](const auto& g) { return g.id == t.target.id; });
        const bool fits = t.accumulation ? t.accumulation->fits : t.batch_size.value_or(0) >= wanted;
        if (gpu && !fits) unfit.push_back(t.target);
      }
    } else {
      json = {{"device", memgate::device_to_json(memgate::describe_device(device))},
              {"model", {{"name", fixture.name}}},
              {"total_probes", 0},
              {"from_estimates", o->from_estimates},
              {"world_size", fixture.training.distributed.enabled() ? fixture.training.distributed.world_size : 0},
              {"targets", nlohmann::json::array()}};
    }
    if (!by_estimate.empty()) {
      const auto why = device.is_cuda() ? fmt::format("this GPU ({}, {}) is smaller than their usable memory",
                                                      device.str(), memgate::format_bytes(here))
                                        : std::string("this machine has no GPU to probe on");
      std::vector<std::string> names;
      for (const auto& t : by_estimate) names.push_back(t.id);
      progress.done(fmt::format("{}: answered from estimates for CUDA, no probe ({})", fmt::join(names, ", "), why));
      const std::optional<std::int64_t> accumulate_to =
          o->effective_batch > 0 ? std::optional<std::int64_t>(o->effective_batch) : std::nullopt;
      const auto fits = memgate::largest_batches_by_estimate(fixture, by_estimate, accumulate_to);
      fmt::print("{}memgate advise: {} on {}, BY ESTIMATE, not measured: {}.\n", targets.empty() ? "" : "\n",
                 fixture.name, fmt::join(names, ", "), why);
      fmt::print("{}", memgate::format_estimated_fits(fits, accumulate_to));
      fmt::print("To confirm it with real steps under the cap, run this command on a machine with that GPU (or a "
                 "larger one); --capacity-mib N probes a cap of N MiB here.\n");
      json["largest_batch_by_estimate"] = memgate::estimated_fits_to_json(fits);
      json["estimated_because"] = why;
      for (const auto& fit : fits.fits) {
        if (accumulate_to ? fit.micro_batch == 0 : fit.largest < wanted) unfit.push_back(fit.target);
      }
    }
    // Each GPU the wanted batch does not fit: the plans that make it fit (memgate plan's, by estimate).
    if (!unfit.empty() && wanted > 0) {
      std::vector<std::string> names;
      for (const auto& t : unfit) names.push_back(t.id);
      fmt::print("\nBatch {}{} does not fit {}: the plans that make it fit, by estimate for CUDA (memgate plan):\n",
                 wanted, o->effective_batch > 0 ? " (effective)" : "", fmt::join(names, ", "));
      std::string text;
      json["plans"] = plans_for(fixture, unfit, wanted,
                                o->effective_batch > 0 ? std::optional<std::int64_t>(wanted) : std::nullopt, text);
      fmt::print("{}", text);
    }
    if (!o->output.empty()) {
      write_output("--output", o->output, json.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
      fmt::print("\nwrote {}\n", o->output);
    }
    return kOk;
  };
}

}  // namespace memgate::cli
