// memgate plan: the cheapest ways to fit a batch on a GPU that keep the training the same, each estimated.
#include "measure_cli.h"

#include "memgate/base/error.h"
#include "memgate/gate/fixture.h"
#include "memgate/plan/plan.h"

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace memgate::cli {

Run add_plan(CLI::App& app) {
  struct Options {
    std::string config;
    std::string gpu;
    std::int64_t capacity_mib = 0;
    std::int64_t capacity_bytes = 0;
    std::string target = "cuda";
    std::int64_t batch = 0;
    std::int64_t effective_batch = 0;
    std::int64_t world_size = 0;
    bool allow_changes = false;
    std::string output;
    std::string gpus = default_gpus_dir();
    std::string search = "auto";
  };
  auto o = std::make_shared<Options>();
  app.add_option("--config", o->config, "The model fixture (fixtures/models/<name>.yaml)")->required()->type_name("FILE");
  auto* gpu = app.add_option("--gpu", o->gpu, "The GPU fixture to fit (fixtures/gpus/<id>.yaml)")->type_name("ID");
  auto* capacity = app.add_option("--capacity-mib", o->capacity_mib, "Instead: fit this many usable MiB")
                       ->type_name("MIB")
                       ->check(check_value(is_memory_limit_mib,
                                           fmt::format("a positive integer of at most {}", kMaxMemoryLimitMib)));
  auto* capacity_bytes = app.add_option("--capacity-bytes", o->capacity_bytes, "Instead: fit this many usable bytes")
                             ->type_name("BYTES")
                             ->check(CLI::Range(std::int64_t{1}, kMaxMemoryLimitMib << 20));
  gpu->excludes(capacity);
  gpu->excludes(capacity_bytes);
  capacity->excludes(capacity_bytes);
  auto* for_device = app.add_option("--for", o->target,
                                    "The device the plans are estimated for: cuda, or cpu (with --capacity-mib or "
                                    "--capacity-bytes: the estimate for the CPU's kernels, as profile --device cpu "
                                    "measures the plan's fixture)")
                         ->capture_default_str()
                         ->type_name("DEVICE")
                         ->check(CLI::IsMember({"cuda", "cpu"}));
  auto* batch = app.add_option("--batch", o->batch, "The batch of each step (default: the fixture's largest)")
                    ->type_name("B")
                    ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30));
  auto* effective = app.add_option("--effective-batch", o->effective_batch,
                                   "The batch of each optimizer step, reached by micro-batches x accumulation steps")
                        ->type_name("N")
                        ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30));
  batch->excludes(effective);
  app.add_option("--world-size", o->world_size,
                 "The ranks the job runs on, each at the batch asked: a distributed fixture over them instead of its "
                 "world_size; from 2, sharding with FSDP over them searched too (a fixture on one device or DDP)")
      ->type_name("W")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{4096}));
  app.add_flag("--allow-changes", o->allow_changes,
               "Also the levers that change the training (bf16 autocast, a frozen backbone, SGD), listed apart");
  app.add_option("--search", o->search, "auto (exhaustive up to 64 plans, else greedy), exhaustive or greedy")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "exhaustive", "greedy"}));
  app.add_option("--output", o->output, "Also write the plans as JSON to this file")->type_name("FILE");
  app.add_option("--gpus", o->gpus, "Folder of GPU fixtures")->capture_default_str()->type_name("DIR");
  app.parse_complete_callback([gpu, capacity, capacity_bytes, for_device, o] {
    if (gpu->count() == 0 && capacity->count() == 0 && capacity_bytes->count() == 0) {
      throw CLI::RequiredError("--gpu or --capacity-mib (or --capacity-bytes)");
    }
    if (for_device->count() > 0 && o->target == "cpu" && gpu->count() > 0) {
      throw CLI::ValidationError("--for cpu", "expected --capacity-mib or --capacity-bytes: a GPU fixture (--gpu " +
                                                  o->gpu + ") is a CUDA target");
    }
  });
  app.footer(footer(
      "Searches the ways to run the fixture's step at the batch asked that keep the training the same: which\n"
      "blocks to checkpoint (the fewest recomputed FLOPs that fit), micro-batch x accumulation steps for\n"
      "--effective-batch, the allocator's expandable segments where they change the reserved bytes, FSDP over\n"
      "--world-size's ranks (each rank at the batch asked; its cost the bytes its collectives send). Each plan's\n"
      "step peak is the estimate for CUDA that memgate estimate --gpu gives (no GPU is used; --for cpu: the\n"
      "estimate for the CPU, with a capacity), its cost the\n"
      "recomputed FLOPs as a share of the step's (counted on the Meta device) and the accumulation steps, and\n"
      "`change` the fixture keys that apply it. Cheapest first. See docs/plan.md."));
  return [o] {
    std::vector<memgate::AdviceTarget> targets;
    if (!o->gpu.empty()) targets = gpu_targets(o->gpus, {o->gpu}, false);
    if (o->capacity_mib > 0) {
      targets.push_back({"capacity", fmt::format("{} MiB", o->capacity_mib), o->capacity_mib << 20});
    }
    if (o->capacity_bytes > 0) {
      targets.push_back({"capacity", fmt::format("{} B", o->capacity_bytes), o->capacity_bytes});
    }
    auto fixture = load_fixture_for_run(o->config, "");
    auto inputs = fixture_inputs("--config", o->config, &fixture);
    inputs.push_back({"the GPU fixtures (--gpus)", o->gpus.empty() ? default_gpus_dir() : o->gpus, true});
    refuse_colliding_files(inputs, {{"--output", o->output}});
    memgate::PlanOptions options;
    if (o->world_size > 0) options.world_size = o->world_size;
    if (o->batch > 0) options.batch = o->batch;
    if (o->effective_batch > 0) options.effective_batch = o->effective_batch;
    options.allow_changes = o->allow_changes;
    options.target = o->target == "cpu" ? memgate::EstimateTarget::kCpu : memgate::EstimateTarget::kCuda;
    options.search = o->search == "exhaustive" ? memgate::PlanOptions::Search::kExhaustive
                     : o->search == "greedy"   ? memgate::PlanOptions::Search::kGreedy
                                               : memgate::PlanOptions::Search::kAuto;
    const auto result = memgate::plan(fixture, targets.front(), options);
    fmt::print("{}", memgate::format_plan(result));
    if (!o->output.empty()) {
      const auto json = memgate::plan_to_json(result);
      write_output("--output", o->output, json.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
      fmt::print("wrote {}\n", o->output);
    }
    return kOk;
  };
}

}  // namespace memgate::cli
