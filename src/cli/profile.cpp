// memgate profile: measures one fixture's memory per component and batch size, prints and writes its report.
#include "measure_cli.h"

#include "memgate/base/error.h"
#include "memgate/base/progress.h"
#include "memgate/base/units.h"
#include "memgate/gate/fixture.h"
#include "memgate/gate/report.h"
#include "memgate/backend/cpu_allocator.h"
#include "memgate/backend/device.h"
#include "memgate/launch/run.h"
#include "memgate/measure/probe.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace memgate::cli {

namespace {

// A probe's result in one line, for progress.
std::string probe_line(const std::string& fixture, const memgate::ProbeResult& r) {
  if (r.oom) return fmt::format("{} bs {}: out of memory ({:.1f} s)", fixture, r.batch_size, r.seconds);
  if (r.failed) return fmt::format("{} bs {}: failed: {}", fixture, r.batch_size, r.error.substr(0, r.error.find('\n')));
  return fmt::format("{} bs {}: step peak {} allocated, {} reserved ({:.1f} s)", fixture, r.batch_size,
                     memgate::format_bytes(r.components.step_peak), memgate::format_bytes(r.components.step_peak_reserved),
                     r.seconds);
}

}  // namespace

Run add_profile(CLI::App& app) {
  struct Options {
    std::int64_t rank_timeout = 0;  // --rank-timeout, 0: the default
    std::string config;
    std::string batch_sizes;
    std::string device = "auto";
    ProfileFiles files;
    std::int64_t cpu_memory_limit_mib = 0;
    bool snapshot_cpp_stacks = false;
    std::string cpu_kernels;
  };
  auto o = std::make_shared<Options>();
  app.add_option("--config", o->config, "The model fixture (fixtures/models/<name>.yaml)")
      ->required()
      ->type_name("FILE");
  app.add_option("--batch-sizes", o->batch_sizes, "Batch sizes to probe, e.g. 1,8,32 (default: the fixture's)")
      ->type_name("N,N,...")
      ->check(check_value(is_batch_sizes, "positive integers separated by commas (e.g. 1,8,32)"));
  app.add_option("--device", o->device, "auto (a GPU if LibTorch sees one), cpu, cuda or cuda:N")
      ->capture_default_str()
      ->type_name("DEVICE")
      ->check(check_value(is_device_spec, "auto, cpu, cuda or cuda:N"));
  app.add_option("--output", o->files.output, "Also write the profile as JSON to this file")->type_name("FILE");
  app.add_option("--html", o->files.html, "Also write the report as HTML to this file (as memgate report makes it)")
      ->type_name("FILE");
  app.add_option("--snapshot", o->files.snapshot,
                 "Record the allocator's history and write it for https://pytorch.org/memory_viz (several batch "
                 "sizes: <stem>_bs<N>.pickle each; a distributed fixture: <stem>[_bs<N>]_rank<r>.pickle per rank)")
      ->type_name("FILE.pickle");
  app.add_flag("--snapshot-cpp-stacks", o->snapshot_cpp_stacks,
               "CUDA: with --snapshot, the C++ stack of each allocation (slow: minutes for a large model)");
  app.add_option("--gpus", o->files.gpus, "Folder of GPU fixtures for the fits-on table")
      ->capture_default_str()
      ->type_name("DIR");
  add_cpu_kernels_option(app, o->cpu_kernels);
  add_rank_timeout_option(app, o->rank_timeout);
  auto* limit = app.add_option("--cpu-memory-limit-mib", o->cpu_memory_limit_mib,
                               "Cap the CPU counting allocator: beyond it a probe runs out of memory");
  limit->type_name("MIB");
  limit->check(check_value(is_memory_limit_mib, fmt::format("a positive integer of at most {} (2^43 - 1: the limit in "
                                                            "bytes must fit in 63 bits)",
                                                            kMaxMemoryLimitMib)));
  app.footer(footer(
      "Measures each component of a training step at each batch size and prints the report; --output also\n"
      "writes it as JSON. An out-of-memory at one batch size is reported and the next batch sizes still run;\n"
      "when none of them could be measured (each ran out of memory), the report and JSON are still written and\n"
      "the exit code is 1. A batch size that fails with another error (the model's code raised, its process\n"
      "crashed) is reported as failed, with its error, in the report and the JSON, and the next batch sizes still\n"
      "run; the exit code is then 3 (when every batch size failed, the first's error is the command's, as for any\n"
      "error, and nothing is written)."));
  return [o, limit] {
    const auto fixture = load_fixture_for_run(o->config, o->cpu_kernels);
    o->files.refuse_onto(fixture_inputs("--config", o->config, &fixture));
    const auto batch_sizes = o->batch_sizes.empty() ? fixture.batch_sizes : *parse_batch_sizes(o->batch_sizes);
    const auto device = memgate::resolve_device(o->device);
    if (limit->count() > 0) memgate::CountingCpuAllocator::install().set_limit(o->cpu_memory_limit_mib << 20);
    memgate::Progress progress;
    std::string item;
    memgate::ProbeOptions options;
    options.keep_going = true;
    options.on_phase = [&](std::string_view phase) { progress.update(item, phase); };
    if (o->rank_timeout > 0) options.rank_timeout = std::chrono::seconds(o->rank_timeout);
    if (!o->files.snapshot.empty()) {
      options.snapshot = memgate::SnapshotOptions{.cpp_stacks = o->snapshot_cpp_stacks};
    }
    auto profile = memgate::run_profile(
        fixture, batch_sizes, device, options,
        [&](std::size_t i, std::int64_t batch, const memgate::ProbeResult* done) {
          if (done == nullptr) {
            item = fmt::format("{} bs {} ({}/{})", fixture.name, batch, i + 1, batch_sizes.size());
          } else {
            progress.done(probe_line(fixture.name, *done));
          }
        });
    profile.fixture_hash = fixture.hash;
    const auto failed = std::count_if(profile.probes.begin(), profile.probes.end(),
                                      [](const memgate::ProbeResult& p) { return p.failed; });
    if (failed > 0 && failed == static_cast<std::ptrdiff_t>(profile.probes.size())) {
      // Nothing measured and nothing out of memory: the fixture's error, as before there were several batch sizes.
      throw memgate::Error(profile.probes.front().error);
    }
    write_profile(profile, memgate::profile_to_json(profile), o->files, o->config, "the allocator's history");
    const bool measured_any = std::any_of(profile.probes.begin(), profile.probes.end(),
                                          [](const memgate::ProbeResult& p) { return p.measured(); });
    for (const auto& p : profile.probes) {
      if (p.failed) fmt::print(stderr, "memgate: batch size {} failed: {}\n", p.batch_size, p.error);
    }
    if (!measured_any) {
      fmt::print(stderr, "memgate: no batch size could be measured: each ran out of memory{}\n",
                 failed > 0 ? " or failed" : "");
      return failed > 0 ? kError : kFailed;
    }
    return failed > 0 ? kError : kOk;
  };
}

}  // namespace memgate::cli
