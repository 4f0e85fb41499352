// What memgate's subcommands share: exit codes, --help footers, flag value checks, GPU fixtures. No LibTorch: the
// subcommands that read files (bin/memgate itself) use it; measure_cli.h adds what the measuring ones share.
#pragma once

#include "memgate/report/profile_document.h"
#include "memgate/spec/gpus.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
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
  kUsageError = 2,  ///< unknown subcommand or flag, missing flag, bad value (an unknown --gpu id)
  kError = 3,       ///< anything else: an unreadable or malformed file, a missing fixture, no such device
};

inline constexpr const char* kExitCodes = R"(exit codes:
  0  ok
  1  the gate or a comparison failed (summary: a regression; bench-compare: slower or grew; compare: grew beyond
     --threshold-pct; estimate --suite: a budget does not fit by estimate; profile: no batch size could be
     measured; replay: a replay of the recorded settings is not exact)
  2  usage error (unknown subcommand or flag, missing flag, bad value, an unknown --gpu id)
  3  any other error (an unreadable or malformed file, a missing fixture, no such device))";

/// A subcommand's --help footer: what it does, then the exit codes.
std::string footer(std::string_view what);

/// A usage error found after parsing (flags that conflict): main prints it and exits 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A file a command reads or writes, and what names it. An input's `what` says where it comes from ("--config", "the
/// model.entry of f.yaml", "the baselines folder (--baselines)"); an output's is its flag ("--json").
struct FileArg {
  std::string what;
  std::string path;
  bool folder = false;  ///< an input folder: the folder and every path inside it are inputs
};

/// What every command that writes files calls before any work (before a probe is measured): refuses, as a usage error
/// (exit 2) naming the flags and the paths,
///  - an output that is an input: the same file by any path (./, .., symlinks, hard links), or a path inside an
///    input folder (the baselines, the GPU fixtures), which would destroy or corrupt it;
///  - two outputs that name one file (one would overwrite the other);
///  - an output that is a folder, or whose folder cannot be one (a file on its way).
/// Empty paths are not given and skipped.
void refuse_colliding_files(const std::vector<FileArg>& inputs, const std::vector<FileArg>& outputs);

/// Writes an output (write_file_atomically); any failure is a memgate::Error (exit 3) naming `flag`, the path and
/// the reason (a folder that cannot be made, a read-only file system, a full disk).
void write_output(std::string_view flag, const std::string& path, const std::string& text);

/// MEMGATE_STRICT and MEMGATE_UPDATE_BASELINES read as on or off (memgate::check_env_switches); any other value is a
/// usage error (exit 2) naming the variable and the words accepted. check and summary call it before any work.
void check_env_switches();

/// Appends `markdown` to $GITHUB_STEP_SUMMARY when that is set. A summary that cannot be appended (a folder, a missing
/// folder, a full disk) is a warning on stderr naming the variable, the path and the reason; the exit code stays
/// the command's.
void append_step_summary(const std::string& markdown);

/// Runs a subcommand once its options are parsed; returns the exit code.
using Run = std::function<int()>;

/// Registers a subcommand's options on `app` (its description and footer included) and returns what runs it.
using AddSubcommand = Run (*)(CLI::App& app);

/// One subcommand of the memgate command. Adding one is writing its AddSubcommand (a file of its own) and naming it
/// here and in the `adder` of the program that runs it.
struct Subcommand {
  const char* name;
  const char* description;  ///< one line, for the list of subcommands
  bool measures;            ///< needs LibTorch: run by libexec/memgate/memgate-measure, which bin/memgate hands it to
};

/// Every subcommand, in the order --help lists them.
inline constexpr Subcommand kSubcommands[] = {
    {"profile", "Measure one fixture's memory per component and batch size", true},
    {"estimate", "Every component without a GPU: the protocol run on the Meta device", true},
    {"advise", "The largest batch that fits each GPU (or a capacity), predicted and confirmed", true},
    {"check", "Run the gate for fixtures or a suite outside CTest; exit 1 when it fails", true},
    {"plan", "The cheapest ways to fit a batch on a GPU, each estimated, and the fixture keys that apply them", true},
    {"summary", "Markdown tables of the memory suite's results; exit 1 on a regression", false},
    {"report", "An HTML report with plots from profile or advice JSON files", false},
    {"compare", "Profiles side by side: every component, the differences, batch per GPU", false},
    {"replay", "Replay a real GPU's memory snapshot through the allocator's model; what-if settings and sizes", false},
    {"bench-compare", "Compare two memgate_bench runs: step time and peak memory; exit 1 when worse", false},
    {"bench-merge", "Pool several memgate_bench runs of one build into one file", false},
    {"bench-convert", "Peak memory of a memgate_bench run for github-action-benchmark", false},
};

/// A program's main: parses `argv` against kSubcommands and runs the one given, printing errors with the exit codes
/// of the contract. `adder` gives the AddSubcommand of each subcommand this program runs (nullptr for the others,
/// which --help still lists).
int run_command_line(int argc, char** argv, AddSubcommand (*adder)(std::string_view name));

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

// The GPU fixtures of `dir`; none when `dir` is "" or not a folder (profile then prints no fits table).
std::vector<memgate::GpuSpec> gpu_specs(const std::string& dir);

// The GPU fixture `id` of `dir` (the project's when ""); an id without a fixture is a usage error (exit 2) naming
// the known ones.
memgate::GpuSpec gpu_fixture(const std::string& dir, const std::string& id);

// The GPU fixture `id` among `gpus` (loaded from `dir`): an id that names none is a usage error (exit 2), a mistyped
// --gpu, that names the folder and lists the known ids.
const memgate::GpuSpec& gpu_by_id(const std::vector<memgate::GpuSpec>& gpus, const std::string& id,
                                  const std::string& dir);

std::vector<memgate::GpuLine> gpu_lines(const std::string& dir);

std::string generator();

// --- Subcommands ----------------------------------------------------------------------------------------------

// Each in a file of its own (report.cpp, ...; bench.cpp holds the three bench-* ones), named in main.cpp's table;
// the measuring ones are in measure_cli.h.
Run add_summary(CLI::App& app);
Run add_report(CLI::App& app);
Run add_compare(CLI::App& app);
Run add_replay(CLI::App& app);
Run add_bench_compare(CLI::App& app);
Run add_bench_merge(CLI::App& app);
Run add_bench_convert(CLI::App& app);

}  // namespace memgate::cli
