// memgate replay: a recorded CUDA memory trace replayed through the caching-allocator model, with what-ifs.
#include "cli.h"

#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/base/units.h"
#include "memgate/allocator/replay.h"
#include "memgate/report/replay_report.h"

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace memgate::cli {

Run add_replay(CLI::App& app) {
  struct Options {
    std::string snapshot;
    std::string allocator;
    std::int64_t capacity_mib = 0;
    std::string gpu;
    std::string output;
    std::string html;
    std::string gpus = default_gpus_dir();
  };
  auto o = std::make_shared<Options>();
  app.add_option("snapshot.pickle", o->snapshot,
                 "A memory snapshot: torch.cuda.memory._dump_snapshot's pickle, or memgate profile --snapshot's")
      ->required();
  app.add_option("--allocator", o->allocator,
                 "What if: other allocator settings, as PYTORCH_CUDA_ALLOC_CONF (e.g. expandable_segments:True,"
                 "max_split_size_mb:128,roundup_power2_divisions:4,garbage_collection_threshold:0.6)")
      ->type_name("KEY:VALUE,...");
  auto* capacity = app.add_option("--capacity-mib", o->capacity_mib,
                                  "What if: the allocator may reserve only this many MiB (would the run have fit?)");
  capacity->type_name("MIB")->check(check_value(is_memory_limit_mib, fmt::format("a positive integer of at most {}",
                                                                                 kMaxMemoryLimitMib)));
  auto* gpu = app.add_option("--gpu", o->gpu, "What if: on this GPU fixture (its usable bytes, as budgets count them)")
                  ->type_name("ID");
  gpu->excludes(capacity);
  app.add_option("--output", o->output, "Also write the replay as JSON to this file")->type_name("FILE");
  app.add_option("--html", o->html, "Also write reserved and active memory over the trace as HTML")->type_name("FILE");
  app.add_option("--gpus", o->gpus, "Folder of GPU fixtures")->capture_default_str()->type_name("DIR");
  app.footer(footer(
      "Replays a real GPU's memory trace through memgate's model of the CUDA caching allocator, without a GPU.\n"
      "The allocator's state when the trace began is rebuilt from the snapshot's final segments with the trace\n"
      "undone; every request is replayed with the recorded settings and compared with what the real allocator\n"
      "did: each segment allocation and release (size, address, order), the address of each block, reserved\n"
      "bytes after every event, and the final segments and blocks. It prints whether the replay is exact or the\n"
      "first event where it diverges, with its context, and the fragmentation at the peak (reserved - allocated,\n"
      "the largest free block, the emptiest segments and the requests that made them). Segment frees that no\n"
      "request explains are the program's empty_cache() (or an out-of-memory retry): the model's own\n"
      "empty_cache() must free exactly those segments. With --allocator, --capacity-mib or --gpu, the same\n"
      "requests also run under those settings and that capacity (what-if), the allocator freeing its cache and\n"
      "retrying before it reports out of memory, as PyTorch's does. Exits 1 when a replay of the recorded\n"
      "settings is not exact."));
  return [o, capacity, gpu] {
    if (!o->allocator.empty()) {
      try {
        (void)memgate::AllocatorSettings::parse(o->allocator, "--allocator");
      } catch (const memgate::Error& e) {  // a bad flag value: a usage error, before any work
        fmt::print(stderr, "memgate replay: {}\n", e.what());
        return kUsageError;
      }
    }
    refuse_colliding_files({{"snapshot.pickle", o->snapshot},
                            {"the GPU fixtures (--gpus)", o->gpus.empty() ? default_gpus_dir() : o->gpus, true}},
                           {{"--output", o->output}, {"--html", o->html}});
    const auto snapshot = memgate::load_snapshot(o->snapshot);
    std::optional<std::int64_t> capacity_bytes;
    std::string capacity_label;
    if (capacity->count() > 0) {
      capacity_bytes = o->capacity_mib << 20;
      capacity_label = fmt::format("{} MiB", o->capacity_mib);
    } else if (gpu->count() > 0) {
      const auto target = gpu_fixture(o->gpus, o->gpu);
      capacity_bytes = target.usable_bytes();
      capacity_label = fmt::format("{} ({} usable)", o->gpu, memgate::format_usable(*capacity_bytes));
    }
    std::vector<memgate::WhatIfSpec> what_ifs;
    if (capacity_bytes) what_ifs.push_back({"recorded settings on " + capacity_label, std::nullopt, capacity_bytes});
    if (!o->allocator.empty()) {
      const auto settings = memgate::AllocatorSettings::parse(o->allocator, "--allocator", snapshot.settings);
      what_ifs.push_back({o->allocator, settings, std::nullopt});
      if (capacity_bytes) what_ifs.push_back({o->allocator + " on " + capacity_label, settings, capacity_bytes});
    }
    const auto report = memgate::replay_snapshot(snapshot, what_ifs);
    fmt::print("{}", memgate::replay_summary(report));
    if (!o->output.empty()) {
      const auto json = memgate::replay_to_json(report);
      write_output("--output", o->output, json.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
      fmt::print("wrote {}\n", o->output);
    }
    if (!o->html.empty()) {
      write_output("--html", o->html, memgate::replay_html(report));
      fmt::print("wrote {}\n", o->html);
    }
    return report.exact() ? kOk : kFailed;
  };
}

}  // namespace memgate::cli
