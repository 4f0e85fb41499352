// What memgate's measuring subcommands share (profile, estimate, advise, check: libexec/memgate/memgate-measure):
// their GPU targets, a profile's files, the options of runs that probe.
#pragma once

#include "cli.h"

#include "memgate/advise/advise.h"
#include "memgate/gate/fixture.h"
#include "memgate/measure/probe.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace memgate::cli {

// The GPUs a command targets: with `all` every fixture of `dir` (the project's when ""), else each of `ids` (an id
// without a fixture is an error naming it); none when neither is given.
std::vector<memgate::AdviceTarget> gpu_targets(const std::string& dir, const std::vector<std::string>& ids, bool all);

// Where a profile, measured or estimated, also goes (--output, --html, --snapshot), and the GPU fixtures its report
// reads (--gpus).
struct ProfileFiles {
  std::string output;
  std::string html;
  std::string snapshot;
  std::string gpus = default_gpus_dir();

  /// Refuses, before any work, an output that is one of `inputs` (the fixture's files) or the GPU fixtures, and two
  /// outputs on one file (refuse_colliding_files).
  void refuse_onto(std::vector<FileArg> inputs) const {
    inputs.push_back({"the GPU fixtures (--gpus)", gpus, true});
    refuse_colliding_files(inputs, {{"--output", output}, {"--html", html}, {"--snapshot", snapshot}});
  }
};

// Prints a profile's report and writes its files: each probe's snapshot (`history` says what it holds), the JSON,
// and the HTML page made from that JSON, as `memgate report` makes it.
void write_profile(const memgate::Profile& profile, const nlohmann::json& json, const ProfileFiles& files,
                   const std::string& config, std::string_view history);

// --cpu-kernels (or MEMGATE_CPU_KERNELS): the kernels CPU probes run, over each fixture's `training.cpu_kernels`.
void add_cpu_kernels_option(CLI::App& app, std::string& kernels);

// --rank-timeout SECONDS (or MEMGATE_RANK_TIMEOUT) for the commands that run probes: 0 when not given.
void add_rank_timeout_option(CLI::App& app, std::int64_t& seconds);

// --world-size N (estimate, advise): a distributed fixture over N ranks instead of its world_size; 0 leaves it.
void set_world_size(memgate::Fixture& fixture, std::int64_t world_size, const std::string& config);

// The files a fixture is read from, named by `flag` (--config): the fixture itself, a TorchScript fixture's module,
// a Python fixture's entry, loss, batch, compute_loss and optimizer files.
std::vector<FileArg> fixture_inputs(const std::string& flag, const std::string& path,
                                    const memgate::Fixture* fixture);

// The baselines folder and the GPU fixtures memgate reads, as inputs no output may land in.
std::vector<FileArg> project_inputs(const std::string& baselines);

// A fixture as a run measures it: with the kernels the run asks for (--cpu-kernels).
memgate::Fixture load_fixture_for_run(const std::string& path, const std::string& cpu_kernels);

// The plans (memgate plan's, by estimate for CUDA) that run `batch` per step, or reach `effective_batch` by
// accumulation, on each target: as JSON, one plan document per target's id ({"error": why} where no plan fits), and
// appended to `text` as `memgate plan` prints them (the search's message where no plan fits). advise reaches plan this
// way for each GPU its wanted batch does not fit; estimate --plan for each --gpu.
nlohmann::json plans_for(const memgate::Fixture& fixture, const std::vector<memgate::AdviceTarget>& targets,
                         std::int64_t batch, std::optional<std::int64_t> effective_batch, std::string& text);

// --- Subcommands ----------------------------------------------------------------------------------------------

// Each in a file of its own, named in measures()'s table (measures.cpp).
Run add_profile(CLI::App& app);
Run add_estimate(CLI::App& app);
Run add_advise(CLI::App& app);
Run add_check(CLI::App& app);
Run add_plan(CLI::App& app);

// The AddSubcommand of each subcommand memgate-measure runs (nullptr for the others): what its main() gives
// run_command_line, and what the CLI tests that fork a case from their own process give it (tests/common/cli_fork.h).
AddSubcommand measures(std::string_view name);

}  // namespace memgate::cli
