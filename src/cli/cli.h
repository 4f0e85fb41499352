// What memgate's subcommands share: exit codes, --help footers, flag value checks, GPU fixtures and profile files.
#pragma once

#include "memgate/advise/advise.h"
#include "memgate/gate/fixture.h"
#include "memgate/measure/probe.h"
#include "memgate/report/profile_document.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <utility>
#include <string>
#include <string_view>
#include <vector>

namespace memgate::cli {

/// What `main` returns; the --help footer of every command lists them.
enum ExitCode : int {
  kOk = 0,
  kFailed = 1,      ///< the gate or a comparison failed
  kUsageError = 2,  ///< unknown subcommand or flag, missing flag, bad value
  kError = 3,       ///< anything else: an unreadable or malformed file, a missing fixture, no such device
};

inline constexpr const char* kExitCodes = R"(exit codes:
  0  ok
  1  the gate or a comparison failed (summary: a regression; bench-compare: slower or grew; compare: grew beyond
     --threshold-pct; estimate --suite: a budget does not fit by estimate; profile: no batch size could be
     measured; replay: a replay of the recorded settings is not exact)
  2  usage error (unknown subcommand or flag, missing flag, bad value)
  3  any other error (an unreadable or malformed file, a missing fixture, no such device))";

/// A subcommand's --help footer: what it does, then the exit codes.
std::string footer(std::string_view what);

/// An --output that is one of the command's inputs (the same file, by any path) would destroy that input: refused,
/// before any work, naming both.
void refuse_output_onto_input(const std::string& output, const std::vector<std::string>& inputs);

/// A usage error found after parsing (flags that conflict): main prints it and exits 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Two outputs of one command (--output, --html, --snapshot) naming one file, by any path: one would overwrite the
/// other. Refused as a usage error, before any work, naming both flags. Empty paths are not given.
void refuse_same_output(const std::vector<std::pair<std::string, std::string>>& flag_and_path);

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
CLI::Validator check_value(bool (*ok)(std::string_view), std::string expected);

/// "1,8,32" -> {1, 8, 32}; nothing unless every item is a positive integer.
std::optional<std::vector<std::int64_t>> parse_batch_sizes(std::string_view text);

bool is_batch_sizes(std::string_view text);

bool is_finite_non_negative(std::string_view text);

// The counting allocator's limit is in bytes, an int64: MiB << 20 must not overflow.
inline constexpr std::int64_t kMaxMemoryLimitMib = (std::int64_t{1} << 43) - 1;

bool is_memory_limit_mib(std::string_view text);

// The syntax only: whether the CUDA device exists is resolve_device's to say (exit 3, not a usage error).
bool is_device_spec(std::string_view text);

// The project's fixtures/gpus, else the GPU fixtures memgate installs (<prefix>/share/memgate), for --gpus' help;
// "" when there are none (profile then prints no fits table, advise says where it looked).
std::string default_gpus_dir();

// The GPUs a command targets: with `all` every fixture of `dir` (the project's when ""), else each of `ids` (an id
// without a fixture is an error naming it); none when neither is given.
std::vector<memgate::AdviceTarget> gpu_targets(const std::string& dir, const std::vector<std::string>& ids, bool all);

std::vector<memgate::GpuLine> gpu_lines(const std::string& dir);

std::string generator();

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
    refuse_same_output({{"--output", output}, {"--html", html}, {"--snapshot", snapshot}});
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

// A fixture as a run measures it: with the kernels the run asks for (--cpu-kernels).
memgate::Fixture load_fixture_for_run(const std::string& path, const std::string& cpu_kernels);

// --- Subcommands ----------------------------------------------------------------------------------------------

// Each in a file of its own (profile.cpp, ...; bench.cpp holds the three bench-* ones), named in main's kSubcommands.
Run add_profile(CLI::App& app);
Run add_estimate(CLI::App& app);
Run add_advise(CLI::App& app);
Run add_check(CLI::App& app);
Run add_summary(CLI::App& app);
Run add_report(CLI::App& app);
Run add_compare(CLI::App& app);
Run add_replay(CLI::App& app);
Run add_bench_compare(CLI::App& app);
Run add_bench_merge(CLI::App& app);
Run add_bench_convert(CLI::App& app);

}  // namespace memgate::cli
