// memgate advise: the largest batch that fits each GPU (or a capacity), predicted and confirmed by probes.
#include "measure_cli.h"

#include "memgate/base/files.h"
#include "memgate/base/progress.h"
#include "memgate/advise/advise.h"
#include "memgate/gate/fixture.h"
#include "memgate/backend/device.h"

#include <fmt/format.h>

#include <cstdint>
#include <memory>
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
    bool from_estimates = false;
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
  app.add_flag("--from-estimates", o->from_estimates,
               "Pick each probe from estimates (memgate estimate) scaled by the measured peaks, not from a line");
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
      "- outside_allocator_bytes."));
  return [o] {
    refuse_output_onto_input(o->output, {o->config});
    auto fixture = load_fixture_for_run(o->config, o->cpu_kernels);
    set_world_size(fixture, o->world_size, o->config);
    const auto device = memgate::resolve_device(o->device);
    auto targets = gpu_targets(o->gpus, o->gpu, o->all_gpus);
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
    options.on_probe = [&](std::string_view what) { item = fmt::format("probe {}: {}", ++probes, what); };
    options.probe.on_phase = [&](std::string_view phase) { progress.update(item, phase); };
    if (o->rank_timeout > 0) options.probe.rank_timeout = std::chrono::seconds(o->rank_timeout);
    const auto advice = memgate::advise(fixture, targets, device, options);
    progress.done(fmt::format("{}: {} probes", fixture.name, probes));
    fmt::print("{}", memgate::format_advice(advice));
    if (!o->output.empty()) {
      memgate::write_file_atomically(o->output, memgate::advice_to_json(advice).dump(2) + "\n");
      fmt::print("\nwrote {}\n", o->output);
    }
    return kOk;
  };
}

}  // namespace memgate::cli
