// memgate's command-line tool: one CLI11 subcommand per task (profile, advise, check, summary, report, compare,
// bench-compare, bench-merge, bench-convert), each a function that registers its options and returns what runs it.
#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/base/progress.h"
#include "memgate/base/units.h"
#include "memgate/bench/bench_compare.h"
#include "memgate/gate/advise.h"
#include "memgate/gate/budget.h"
#include "memgate/gate/fixture.h"
#include "memgate/gate/rank.h"
#include "memgate/gate/report.h"
#include "memgate/gate/suite.h"
#include "memgate/gate/summary.h"
#include "memgate/gate/verdict.h"
#include "memgate/measure/cpu_allocator.h"
#include "memgate/measure/device.h"
#include "memgate/measure/estimate.h"
#include "memgate/measure/probe.h"
#include "memgate/report/compare.h"
#include "memgate/report/html_report.h"
#include "memgate/report/profile_document.h"
#include "memgate/report/replay.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

/// What `main` returns; the --help footer of every command lists them.
enum ExitCode : int {
  kOk = 0,
  kFailed = 1,      ///< the gate or a comparison failed
  kUsageError = 2,  ///< unknown subcommand or flag, missing flag, bad value
  kError = 3,       ///< anything else: an unreadable or malformed file, a missing fixture, no such device
};

constexpr const char* kExitCodes = R"(exit codes:
  0  ok
  1  the gate or a comparison failed (summary: a regression; bench-compare: slower or grew; compare: grew beyond
     --threshold-pct; estimate --suite: a budget does not fit by estimate; profile: no batch size could be
     measured; replay: a replay of the recorded settings is not exact)
  2  usage error (unknown subcommand or flag, missing flag, bad value)
  3  any other error (an unreadable or malformed file, a missing fixture, no such device))";

/// A subcommand's --help footer: what it does, then the exit codes.
std::string footer(std::string_view what) { return fmt::format("{}\n\n{}", what, kExitCodes); }

/// An --output that is one of the command's inputs (the same file, by any path) would destroy that input: refused,
/// before any work, naming both.
void refuse_output_onto_input(const std::string& output, const std::vector<std::string>& inputs) {
  std::error_code ec;
  if (output.empty() || !std::filesystem::exists(output, ec)) return;
  for (const auto& input : inputs) {
    if (std::filesystem::equivalent(input, output, ec)) {
      throw memgate::Error(output + ": is also an input (" + input + "): writing it would destroy it; give another "
                           "--output");
    }
  }
}

/// Runs a subcommand once its options are parsed; returns the exit code.
using Run = std::function<int()>;

/// One subcommand: registers its options on `app` (its description and footer included) and returns what runs
/// it. Adding a subcommand is writing one of these and naming it in kSubcommands.
struct Subcommand {
  const char* name;
  const char* description;  ///< one line, for the list of subcommands
  Run (*add)(CLI::App& app);
};

// --- Values ---------------------------------------------------------------------------------------------------

/// A CLI11 check from a predicate on the whole value; CLI11 prefixes the message with the flag's name.
CLI::Validator check_value(bool (*ok)(std::string_view), std::string expected) {
  return {[ok, expected](const std::string& value) {
            return ok(value) ? std::string() : fmt::format("expected {}, got '{}'", expected, value);
          },
          ""};
}

template <typename T>
std::optional<T> parse_whole(std::string_view text) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

/// "1,8,32" -> {1, 8, 32}; nothing unless every item is a positive integer.
std::optional<std::vector<std::int64_t>> parse_batch_sizes(std::string_view text) {
  std::vector<std::int64_t> out;
  for (std::size_t start = 0;;) {
    const auto comma = text.find(',', start);
    const auto value = parse_whole<std::int64_t>(text.substr(start, comma - start));
    if (!value || *value < 1) return std::nullopt;
    out.push_back(*value);
    if (comma == std::string_view::npos) return out;
    start = comma + 1;
  }
}

bool is_batch_sizes(std::string_view text) { return parse_batch_sizes(text).has_value(); }

bool is_finite_non_negative(std::string_view text) {
  const auto value = parse_whole<double>(text);
  return value && std::isfinite(*value) && *value >= 0.0;
}

// The counting allocator's limit is in bytes, an int64: MiB << 20 must not overflow.
constexpr std::int64_t kMaxMemoryLimitMib = (std::int64_t{1} << 43) - 1;

bool is_memory_limit_mib(std::string_view text) {
  const auto value = parse_whole<std::int64_t>(text);
  return value && *value >= 1 && *value <= kMaxMemoryLimitMib;
}

// The syntax only: whether the CUDA device exists is resolve_device's to say (exit 3, not a usage error).
bool is_device_spec(std::string_view text) {
  if (text == "auto" || text == "cpu" || text == "cuda") return true;
  if (!text.starts_with("cuda:")) return false;
  const auto index = parse_whole<int>(text.substr(5));
  return index && *index >= 0;
}

// The project's fixtures/gpus, else the GPU fixtures memgate installs (<prefix>/share/memgate), for --gpus' help;
// "" when there are none (profile then prints no fits table, advise says where it looked).
std::string default_gpus_dir() {
  try {
    return memgate::gpus_dir(memgate::project_dir());
  } catch (const memgate::Error&) {
    return "";
  }
}

// The GPU fixtures of `dir`; none when `dir` is "" or not a folder (profile then prints no fits table).
std::vector<memgate::GpuSpec> gpu_specs(const std::string& dir) {
  if (dir.empty() || !std::filesystem::is_directory(dir)) return {};
  return memgate::load_gpus(dir);
}

// The GPUs a command targets: with `all` every fixture of `dir` (the project's when ""), else each of `ids` (an id
// without a fixture is an error naming it); none when neither is given.
std::vector<memgate::AdviceTarget> gpu_targets(const std::string& dir, const std::vector<std::string>& ids, bool all) {
  std::vector<memgate::AdviceTarget> targets;
  if (!all && ids.empty()) return targets;
  const auto gpus = memgate::load_gpus(dir.empty() ? memgate::gpus_dir(memgate::project_dir()) : dir);
  if (all) {
    for (const auto& g : gpus) targets.push_back(memgate::target_of(g));
  } else {
    for (const auto& id : ids) targets.push_back(memgate::target_of(memgate::find_gpu(gpus, id)));
  }
  return targets;
}

std::vector<memgate::GpuLine> gpu_lines(const std::string& dir) {
  std::vector<memgate::GpuLine> lines;
  for (const auto& g : gpu_specs(dir)) {
    lines.push_back({g.id, g.name, g.memory_bytes, memgate::target_of(g).usable_bytes});
  }
  return lines;
}

std::string generator() { return std::string("memgate ") + MEMGATE_VERSION; }

// `path` with `suffix` before its extension: <stem><suffix><extension>, beside it.
std::string with_suffix(const std::string& path, const std::string& suffix) {
  const std::filesystem::path p(path);
  return (p.parent_path() / (p.stem().string() + suffix + p.extension().string())).string();
}

// Where the snapshot of batch size `batch` goes: `path` itself when it is the only batch size, else
// <stem>_bs<batch><extension> beside it.
std::string snapshot_path(const std::string& path, std::int64_t batch, std::size_t batches) {
  return batches <= 1 ? path : with_suffix(path, fmt::format("_bs{}", batch));
}

// Where a profile, measured or estimated, also goes (--output, --html, --snapshot), and the GPU fixtures its report
// reads (--gpus).
struct ProfileFiles {
  std::string output;
  std::string html;
  std::string snapshot;
  std::string gpus = default_gpus_dir();

  /// Refuses, before any work, a file that is the fixture itself.
  void refuse_onto(const std::string& config) const {
    for (const auto* file : {&output, &html, &snapshot}) refuse_output_onto_input(*file, {config});
  }
};

// Prints a profile's report and writes its files: each probe's snapshot (`history` says what it holds), the JSON,
// and the HTML page made from that JSON, as `memgate report` makes it.
void write_profile(const memgate::Profile& profile, const nlohmann::json& json, const ProfileFiles& files,
                   const std::string& config, std::string_view history) {
  for (const auto& p : profile.probes) {
    if (files.snapshot.empty()) break;
    const auto path = snapshot_path(files.snapshot, p.batch_size, profile.probes.size());
    // A distributed probe: one snapshot per rank, <stem>_rank<r><extension>.
    for (std::size_t r = 0; r < p.rank_snapshots.size(); ++r) {
      const auto rank_path = with_suffix(path, fmt::format("_rank{}", r));
      if (p.rank_snapshots[r].empty()) {
        fmt::print(stderr, "memgate: no snapshot of rank {} at batch size {} could be taken\n", r, p.batch_size);
        continue;
      }
      memgate::write_file_atomically(rank_path, p.rank_snapshots[r]);
      fmt::print(stderr, "memgate: wrote {} of rank {} at batch size {} to {} (open it at https://pytorch.org/memory_viz)\n",
                 history, r, p.batch_size, rank_path);
    }
    if (!p.rank_snapshots.empty()) continue;
    if (p.snapshot.empty()) {
      fmt::print(stderr, "memgate: no snapshot of batch size {} could be taken\n", p.batch_size);
      continue;
    }
    memgate::write_file_atomically(path, p.snapshot);
    fmt::print(stderr, "memgate: wrote {} of batch size {} to {} (open it at https://pytorch.org/memory_viz)\n",
               history, p.batch_size, path);
  }
  fmt::print("{}", memgate::format_profile(profile, gpu_specs(files.gpus)));
  if (!files.output.empty()) {
    memgate::write_file_atomically(files.output, json.dump(2) + "\n");
    fmt::print("\nwrote {}\n", files.output);
  }
  if (!files.html.empty()) {
    std::vector<memgate::ProfileDocument> docs{memgate::profile_document_from_json(json, config)};
    docs.front().path = files.output;
    memgate::label_documents(docs);
    memgate::write_file_atomically(files.html, memgate::render_report_html(docs, gpu_lines(files.gpus),
                                                                           {.title = "", .generator = generator()}));
    fmt::print("wrote {}\n", files.html);
  }
}

// A probe's result in one line, for progress.
std::string probe_line(const std::string& fixture, const memgate::ProbeResult& r) {
  if (r.oom) return fmt::format("{} bs {}: out of memory ({:.1f} s)", fixture, r.batch_size, r.seconds);
  return fmt::format("{} bs {}: step peak {} allocated, {} reserved ({:.1f} s)", fixture, r.batch_size,
                     memgate::format_bytes(r.components.step_peak), memgate::format_bytes(r.components.step_peak_reserved),
                     r.seconds);
}

// --cpu-kernels (or MEMGATE_CPU_KERNELS): the kernels CPU probes run, over each fixture's `training.cpu_kernels`.
void add_cpu_kernels_option(CLI::App& app, std::string& kernels) {
  app.add_option("--cpu-kernels", kernels,
                 "On the CPU: portable (LibTorch's own kernels, the same bytes on every CPU; baselines/cpu) or host "
                 "(what PyTorch runs on this CPU, oneDNN for its ISA class; baselines/cpu-<class>). Default: the "
                 "fixture's training.cpu_kernels, portable unless it says otherwise")
      ->envname("MEMGATE_CPU_KERNELS")
      ->type_name("KERNELS")
      ->check(CLI::IsMember(memgate::enum_words(memgate::kCpuKernelsNames)));
}

// A fixture as a run measures it: with the kernels the run asks for (--cpu-kernels).
// --world-size N (estimate, advise): a distributed fixture over N ranks instead of its world_size; 0 leaves it.
void set_world_size(memgate::Fixture& fixture, std::int64_t world_size, const std::string& config) {
  if (world_size <= 0) return;
  if (!fixture.training.distributed.enabled()) {
    throw memgate::Error(fmt::format("--world-size {}: {} trains on one device (no training.distributed block)",
                                     world_size, config));
  }
  const auto group = fixture.training.distributed.reshard_after_forward_group;
  if (group > 0 && world_size % group != 0) {
    throw memgate::Error(fmt::format("--world-size {}: {} reshards after forward to groups of {} ranks "
                                     "(training.distributed.reshard_after_forward), which {} ranks do not divide into",
                                     world_size, config, group, world_size));
  }
  fixture.training.distributed.world_size = world_size;
}

memgate::Fixture load_fixture_for_run(const std::string& path, const std::string& cpu_kernels) {
  auto fixture = memgate::load_fixture(path);
  memgate::override_cpu_kernels(fixture, cpu_kernels, "--cpu-kernels");
  return fixture;
}

// --- Subcommands ----------------------------------------------------------------------------------------------

Run add_profile(CLI::App& app) {
  struct Options {
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
      "the exit code is 1."));
  return [o, limit] {
    o->files.refuse_onto(o->config);
    const auto fixture = load_fixture_for_run(o->config, o->cpu_kernels);
    const auto batch_sizes = o->batch_sizes.empty() ? fixture.batch_sizes : *parse_batch_sizes(o->batch_sizes);
    const auto device = memgate::resolve_device(o->device);
    if (limit->count() > 0) memgate::CountingCpuAllocator::install().set_limit(o->cpu_memory_limit_mib << 20);
    memgate::Progress progress;
    std::string item;
    memgate::ProbeOptions options;
    options.on_phase = [&](std::string_view phase) { progress.update(item, phase); };
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
    write_profile(profile, memgate::profile_to_json(profile), o->files, o->config, "the allocator's history");
    const bool measured_any = std::any_of(profile.probes.begin(), profile.probes.end(),
                                          [](const memgate::ProbeResult& p) { return !p.oom; });
    if (!measured_any) {
      fmt::print(stderr, "memgate: no batch size could be measured: each ran out of memory\n");
      return kFailed;
    }
    return kOk;
  };
}

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
    const auto probe = memgate::estimate_probe(fixture, budget.batch_size, memgate::EstimateTarget::kCuda);
    const auto check = memgate::check_budget(probe.components.step_peak_reserved, gpu);
    over += check.fits() ? 0 : 1;
    // A distributed fixture's budget holds each rank on a GPU of its own: its components are the largest rank's.
    const auto& d = fixture.training.distributed;
    const auto on = d.enabled() ? fmt::format("{} x {}, per rank", d.world_size, gpu.name) : gpu.name;
    fmt::print("  {:<32} bs {:<4} on {:<34} needs {:>11} of {:>11}  {}\n", budget.fixture, budget.batch_size,
               on, memgate::format_bytes(check.required), memgate::format_bytes(check.available),
               check.fits() ? "fits [estimate]" : "DOES NOT FIT [estimate]");
  }
  fmt::print("{} of {} budgets fit, by estimate; a GPU runner's memory suite measures them\n",
             suite.budgets.size() - static_cast<std::size_t>(over), suite.budgets.size());
  return over == 0 ? kOk : kFailed;
}

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
  app.parse_complete_callback([config, suite, gpu, all, effective] {
    if (config->count() == 0 && suite->count() == 0) throw CLI::RequiredError("--config or --suite");
    if (effective->count() > 0 && gpu->count() == 0 && all->count() == 0) {
      throw CLI::ValidationError("--effective-batch", "needs --gpu or --all-gpus");
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
    o->files.refuse_onto(o->config);
    auto fixture = load_fixture_for_run(o->config, o->cpu_kernels);
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
    write_profile(profile, json, o->files, o->config, "the estimated allocations");
    if (fits) fmt::print("{}", memgate::format_estimated_fits(*fits, accumulate_to));
    return kOk;
  };
}

Run add_advise(CLI::App& app) {
  struct Options {
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

Run add_check(CLI::App& app) {
  struct Options {
    std::vector<std::string> configs;
    std::string suite;
    std::string batch_sizes;
    std::string device = "auto";
    std::string baselines = memgate::project_dir() + "/baselines";
    bool strict = false;
    bool exact = false;
    std::string cpu_kernels;
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
  add_cpu_kernels_option(app, o->cpu_kernels);
  app.footer(footer(
      "Runs the gate outside CTest: measures each probe once and judges every component against its baseline\n"
      "with the same verdicts as the memory suite (ok, regression, stale, missing, changed, oom). Prints what is\n"
      "not ok, then one line of counts; exits 1 when the gate fails. With --exact, a component that differs from\n"
      "its baseline by any byte is printed as 'differs' and fails."));
  return [o] {
    struct Job {
      memgate::Fixture fixture;
      std::vector<std::int64_t> batch_sizes;
    };
    std::vector<Job> jobs;
    auto device = memgate::resolve_device(o->device);
    if (!o->suite.empty()) {
      const auto s = memgate::load_suite(o->suite, memgate::suite_models_dir(o->suite));
      if (o->device == "auto") device = memgate::resolve_device(s.device == memgate::SuiteDevice::kCuda ? "cuda" : "cpu");
      for (const auto& f : memgate::suite_fixtures(s)) {
        if (!f.batch_sizes.empty()) jobs.push_back({load_fixture_for_run(f.path, o->cpu_kernels), f.batch_sizes});
      }
    } else {
      for (const auto& path : o->configs) {
        auto fixture = load_fixture_for_run(path, o->cpu_kernels);
        auto sizes = o->batch_sizes.empty() ? fixture.batch_sizes : *parse_batch_sizes(o->batch_sizes);
        jobs.push_back({std::move(fixture), std::move(sizes)});
      }
    }
    std::map<memgate::Status, int> counts;
    int differing = 0;
    bool failed = false;
    std::size_t probes = 0;
    memgate::Progress progress;
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      const auto& job = jobs[i];
      const auto item = fmt::format("{} ({}/{} fixtures)", job.fixture.name, i + 1, jobs.size());
      memgate::ProbeOptions options;
      options.on_phase = [&](std::string_view phase) { progress.update(item, phase); };
      const auto judged = memgate::judge_fixture(job.fixture, job.batch_sizes, device, o->baselines, {}, options);
      progress.done(fmt::format("{}: {} probes judged", item, judged.probes.size()));
      probes += job.batch_sizes.size();
      for (const auto& v : judged.components) {
        // --exact: bytes within the tolerance that are not the baseline's are a difference of their own.
        const bool differs = o->exact && (v.status == memgate::Status::kOk || v.status == memgate::Status::kStale) &&
                             v.baseline && v.measured && *v.baseline != *v.measured;
        if (differs) {
          ++differing;
          failed = true;
          fmt::print("{:<11} {}_bs{}_{}\n  baseline {} bytes, measured {} ({:+} bytes); --exact wants the same bytes\n",
                     "differs", v.fixture, v.batch_size, v.component, *v.baseline, *v.measured,
                     *v.measured - *v.baseline);
          continue;
        }
        ++counts[v.status];
        failed = failed || memgate::fails(v.status, o->strict || o->exact);
        if (v.status == memgate::Status::kOk) continue;
        fmt::print("{:<11} {}_bs{}_{}\n  {}\n", memgate::name_of(memgate::kStatusNames, v.status), v.fixture,
                   v.batch_size, v.component, v.message);
      }
    }
    std::string line;
    for (const auto& [status, n] : counts) {
      line += fmt::format("{}{} {}", line.empty() ? "" : ", ", n, memgate::name_of(memgate::kStatusNames, status));
    }
    if (differing > 0) line += fmt::format("{}{} differs", line.empty() ? "" : ", ", differing);
    fmt::print("memgate check: {} ({} probes on {}): {}\n", failed ? "FAILED" : "passed", probes,
               device.str(), line);
    return failed ? kFailed : kOk;
  };
}

Run add_summary(CLI::App& app) {
  struct Options {
    std::vector<std::string> results;
    std::string output;
    std::string html;
  };
  auto o = std::make_shared<Options>();
  app.add_option("--results", o->results,
                 "The memory suite's results (build/<preset>/memgate-results.jsonl); several: one report of a suite "
                 "split across runners")
      ->required()
      ->type_name("FILE ...");
  app.add_option("--output", o->output, "Also write the Markdown to this file")->type_name("FILE");
  app.add_option("--html", o->html,
                 "Also write, per changed fixture, its baseline against this run as HTML plots (memgate compare's "
                 "view); the Markdown links it")
      ->type_name("FILE");
  app.footer(footer(
      "Turns the memory suite's results into a Markdown table per fixture (component x batch size: baseline,\n"
      "measured, difference); appends it to $GITHUB_STEP_SUMMARY when that is set. Exits 1 when any component\n"
      "regressed, changed or ran out of memory."));
  return [o] {
    refuse_output_onto_input(o->output, o->results);
    refuse_output_onto_input(o->html, o->results);
    auto summary = memgate::summarize_results(o->results);
    if (!o->html.empty()) {
      memgate::write_file_atomically(
          o->html, memgate::render_comparisons_html(summary.comparisons, {},
                                                    {.title = "memgate gate: baseline against this run, per changed "
                                                              "fixture",
                                                     .generator = generator()}));
      summary.markdown += fmt::format("\nPlots of the {} changed fixture{} (baseline against this run): `{}`\n",
                                      summary.comparisons.size(), summary.comparisons.size() == 1 ? "" : "s", o->html);
    }
    fmt::print("{}", summary.markdown);
    if (!o->output.empty()) memgate::write_file_atomically(o->output, summary.markdown);
    if (const char* step = std::getenv("GITHUB_STEP_SUMMARY"); step != nullptr && *step != '\0') {
      std::ofstream(step, std::ios::app) << summary.markdown;
    }
    return summary.failed ? kFailed : kOk;
  };
}

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
    refuse_output_onto_input(o->output, o->files);
    std::vector<memgate::ProfileDocument> docs;
    for (const auto& f : o->files) docs.push_back(memgate::load_profile_document(f));
    memgate::label_documents(docs);
    memgate::write_file_atomically(o->output, memgate::render_report_html(docs, gpu_lines(o->gpus),
                                                                          {.title = o->title, .generator = generator()}));
    fmt::print("wrote {} ({} file{})\n", o->output, docs.size(), docs.size() == 1 ? "" : "s");
    return kOk;
  };
}

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
    refuse_output_onto_input(o->html, o->files);
    std::vector<memgate::ProfileDocument> docs;
    for (const auto& f : o->files) docs.push_back(memgate::load_profile_document(f));
    memgate::label_documents(docs);
    memgate::ProfileCompareOptions options;
    if (threshold->count() > 0) options.threshold_pct = o->threshold_pct;
    const auto gpus = gpu_lines(o->gpus);
    const auto comparison = memgate::compare_documents(docs, gpus, options);
    fmt::print("{}", comparison.text);
    if (!o->html.empty()) {
      memgate::write_file_atomically(o->html, memgate::render_comparison_html(docs, gpus, comparison,
                                                                              {.title = "", .generator = generator()}));
      fmt::print("\nwrote {}\n", o->html);
    }
    return comparison.failed() ? kFailed : kOk;
  };
}

Run add_bench_compare(CLI::App& app) {
  struct Options {
    std::string old_json;
    std::string new_json;
    memgate::CompareOptions compare;
    bool no_normalize = false;
    bool no_noise_floor = false;
  };
  auto o = std::make_shared<Options>();
  const auto number = check_value(is_finite_non_negative, "a finite number >= 0");
  app.add_option("old.json", o->old_json, "Google Benchmark JSON of the old build")->required();
  app.add_option("new.json", o->new_json, "Google Benchmark JSON of the new build")->required();
  app.add_option("--threshold-pct", o->compare.threshold_pct, "Smallest change of the mean time that counts, in %")
      ->capture_default_str()
      ->check(number);
  app.add_option("--floor-sigmas", o->compare.noise_floor_sigmas,
                 "The between-run noise floor in robust standard deviations of all cases' changes")
      ->capture_default_str()
      ->check(number);
  app.add_flag("--no-normalize", o->no_normalize, "Compare raw times (do not divide by the machine factor)")
      ->disable_flag_override();
  app.add_flag("--no-noise-floor", o->no_noise_floor, "No between-run noise floor")->disable_flag_override();
  app.footer(footer(
      "Compares two memgate_bench runs (Google Benchmark JSON, e.g. build/cpu/bench.json of `ctest --preset\n"
      "bench`) case by case: mean step time +- its standard deviation across repetitions, the change in %, and\n"
      "the peak allocated memory. Where both runs measured the machine (BM_Reference/cpu, /gpu: fixed LibTorch\n"
      "work), the new times are first divided by how much slower that reference got (\"machine\" column;\n"
      "--no-normalize compares raw times). Time is \"slower\"/\"faster\" only when the means differ by more than\n"
      "the threshold, AND by more than the between-run noise floor (--floor-sigmas x the robust spread of the\n"
      "changes of all cases on that machine, from 8 cases on; --no-noise-floor drops it), AND by more than 3\n"
      "standard errors of the difference of the means (from the repetitions' spread, and the reference's); else\n"
      "\"same\". Memory is deterministic: \"grew\"/\"shrank\" beyond 0.5%. Cases in one file only are listed as\n"
      "added/removed. Exits 1 when a case got slower or its memory grew."));
  return [o] {
    auto options = o->compare;
    options.normalize = !o->no_normalize;
    options.noise_floor = !o->no_noise_floor;
    const auto comparison =
        memgate::compare_bench(memgate::load_bench_json(o->old_json), memgate::load_bench_json(o->new_json), options);
    fmt::print("{}", comparison.text);
    return comparison.regressed ? kFailed : kOk;
  };
}

Run add_bench_merge(CLI::App& app) {
  struct Options {
    std::vector<std::string> files;
    std::string output;
  };
  auto o = std::make_shared<Options>();
  app.add_option("runs.json", o->files, "Google Benchmark JSON files of one build, two or more")
      ->required()
      ->expected(2, -1);
  app.add_option("--output", o->output, "The merged JSON")->required()->type_name("FILE");
  app.footer(footer(
      "Pools several runs of one build (Google Benchmark JSON of memgate_bench) into one file, every repetition\n"
      "kept: compare pooled runs when one run each is too noisy to decide on time (a case slowed down for a\n"
      "whole run by another tenant of a shared runner)."));
  return [o] {
    refuse_output_onto_input(o->output, o->files);
    std::vector<nlohmann::json> docs;
    for (const auto& f : o->files) docs.push_back(memgate::read_bench_document(f));
    const auto merged = memgate::merge_bench_json(docs, o->output);
    memgate::write_file_atomically(o->output, merged.dump(2) + "\n");
    fmt::print("merged {} runs into {}\n", o->files.size(), o->output);
    return kOk;
  };
}

Run add_bench_convert(CLI::App& app) {
  struct Options {
    std::string input;
    std::string output;
  };
  auto o = std::make_shared<Options>();
  app.add_option("bench.json", o->input, "Google Benchmark JSON of memgate_bench")->required();
  app.add_option("--output", o->output, "The customSmallerIsBetter JSON")->required()->type_name("FILE");
  app.footer(footer(
      "Writes the peak memory of each case in github-action-benchmark's customSmallerIsBetter format ([{\"name\":\n"
      "\"<case> peak_allocated\", \"unit\": \"MiB\", \"value\": ...}]); the time JSON itself goes to\n"
      "github-action-benchmark unchanged, with `tool: googlecpp`."));
  return [o] {
    refuse_output_onto_input(o->output, {o->input});
    const auto entries = memgate::bench_memory_to_custom(memgate::load_bench_json(o->input));
    if (entries.empty()) {
      throw memgate::Error(o->input + ": no case has a peak_allocated_bytes counter: nothing to convert");
    }
    memgate::write_file_atomically(o->output, entries.dump(2) + "\n");
    fmt::print("wrote {} entries to {}\n", entries.size(), o->output);
    return kOk;
  };
}

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
    refuse_output_onto_input(o->output, {o->snapshot});
    refuse_output_onto_input(o->html, {o->snapshot});
    const auto snapshot = memgate::load_snapshot(o->snapshot);
    std::optional<std::int64_t> capacity_bytes;
    std::string capacity_label;
    if (capacity->count() > 0) {
      capacity_bytes = o->capacity_mib << 20;
      capacity_label = fmt::format("{} MiB", o->capacity_mib);
    } else if (gpu->count() > 0) {
      const auto target = gpu_targets(o->gpus, {o->gpu}, false).front();
      capacity_bytes = target.usable_bytes;
      capacity_label = fmt::format("{} ({} usable)", o->gpu, memgate::format_bytes(target.usable_bytes));
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
      memgate::write_file_atomically(o->output, memgate::replay_to_json(report).dump(2) + "\n");
      fmt::print("wrote {}\n", o->output);
    }
    if (!o->html.empty()) {
      memgate::write_file_atomically(o->html, memgate::replay_html(report));
      fmt::print("wrote {}\n", o->html);
    }
    return report.exact() ? kOk : kFailed;
  };
}

const Subcommand kSubcommands[] = {
    {"profile", "Measure one fixture's memory per component and batch size", add_profile},
    {"estimate", "Every component without a GPU: the protocol run on the Meta device", add_estimate},
    {"advise", "The largest batch that fits each GPU (or a capacity), predicted and confirmed", add_advise},
    {"check", "Run the gate for fixtures or a suite outside CTest; exit 1 when it fails", add_check},
    {"summary", "Markdown tables of the memory suite's results; exit 1 on a regression", add_summary},
    {"report", "An HTML report with plots from profile or advice JSON files", add_report},
    {"compare", "Profiles side by side: every component, the differences, batch per GPU", add_compare},
    {"replay", "Replay a real GPU's memory snapshot through the allocator's model; what-if settings and sizes",
     add_replay},
    {"bench-compare", "Compare two memgate_bench runs: step time and peak memory; exit 1 when worse",
     add_bench_compare},
    {"bench-merge", "Pool several memgate_bench runs of one build into one file", add_bench_merge},
    {"bench-convert", "Peak memory of a memgate_bench run for github-action-benchmark", add_bench_convert},
};

}  // namespace

int main(int argc, char** argv) {
  if (memgate::is_rank_command(argc, argv)) return memgate::rank_main(argc, argv);
  CLI::App app{"memgate: memory regression tests for deep-learning training on LibTorch", "memgate"};
  app.set_version_flag("--version", std::string("memgate ") + MEMGATE_VERSION);
  app.require_subcommand(1);
  app.footer(kExitCodes);
  std::vector<std::pair<CLI::App*, Run>> runs;
  for (const auto& s : kSubcommands) {
    auto* sub = app.add_subcommand(s.name, s.description);
    runs.emplace_back(sub, s.add(*sub));
  }
  if (argc < 2) {
    fmt::print(stderr, "{}", app.help());
    return kUsageError;
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);  // --help, --version
    const auto parsed = app.get_subcommands();
    std::string message = e.what();
    // CLI11 checks required options before unknown ones: `advise --bogus` would say "--config is required".
    // An unknown argument is the first thing to fix, so say that.
    if (const auto extra = app.remaining(/*recurse=*/true);
        !extra.empty() && dynamic_cast<const CLI::RequiredError*>(&e) != nullptr && !parsed.empty()) {
      message = fmt::format("unknown argument{} {}", extra.size() > 1 ? "s" : "", fmt::join(extra, " "));
    }
    if (parsed.empty() && dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
      // CLI11 says "A subcommand is required"; name what was given instead.
      std::vector<std::string_view> names;
      for (const auto& s : kSubcommands) names.emplace_back(s.name);
      const std::string_view given = argv[1];
      message = fmt::format("{} '{}'; the subcommands are {}",
                            given.starts_with('-') ? "a subcommand must come first, not" : "unknown subcommand", given,
                            fmt::join(names, ", "));
    }
    const std::string command = parsed.empty() ? "memgate" : "memgate " + parsed.front()->get_name();
    fmt::print(stderr, "memgate: {}\nRun '{} --help' for the options.\n", message, command);
    return kUsageError;
  }

  try {
    for (const auto& [sub, run] : runs) {
      if (sub->parsed()) return run();
    }
    return kUsageError;  // unreachable: require_subcommand(1)
  } catch (const memgate::Error& e) {
    fmt::print(stderr, "memgate: error: {}\n", e.what());
  } catch (const std::exception& e) {
    fmt::print(stderr, "memgate: unexpected error: {}\n", e.what());
  }
  return kError;
}
