// How long the memgate command takes to start and how much memory it holds, per subcommand (issue 43): the ones
// that read files run in bin/memgate with no LibTorch; the measuring ones are handed to memgate-measure, which loads
// it (profile --help shows that price). Each iteration runs the command once as a child process: wall time (manual
// time) and the child's peak resident memory (wait4's ru_maxrss) are reported.
//
//   build/cpu/benchmarks/memgate_cli_startup_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only
#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace {

const std::string kSource = MEMGATE_BENCH_SOURCE_DIR;

struct Run {
  double seconds = 0;
  double max_rss_mib = 0;
};

// Runs `args` (args[0] the program) with stdout and stderr to /dev/null; throws unless it exits with `expected`.
Run run_once(const std::vector<std::string>& args, int expected) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  const auto start = std::chrono::steady_clock::now();
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("cannot start " + args[0]);
  int status = 0;
  rusage usage{};
  if (wait4(pid, &status, 0, &usage) != pid) throw std::runtime_error("wait4 failed for " + args[0]);
  const auto end = std::chrono::steady_clock::now();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != expected) {
    throw std::runtime_error(args[1] + ": unexpected exit status " + std::to_string(status));
  }
  return {std::chrono::duration<double>(end - start).count(), static_cast<double>(usage.ru_maxrss) / 1024.0};
}

void command(benchmark::State& state, const std::vector<std::string>& args, int expected) {
  std::vector<std::string> line{MEMGATE_BENCH_CLI};
  line.insert(line.end(), args.begin(), args.end());
  double rss = 0;
  for (auto _ : state) {
    const auto r = run_once(line, expected);
    state.SetIterationTime(r.seconds);
    rss = std::max(rss, r.max_rss_mib);
  }
  state.counters["max_rss_mib"] = rss;
}

const std::string kTrace = kSource + "/tests/data/snapshots/cs336_silmont2000_mem_snapshot.pickle";

BENCHMARK_CAPTURE(command, version, {"--version"}, 0)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(command, help, {"--help"}, 0)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(command, replay_help, {"replay", "--help"}, 0)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(command, report_help, {"report", "--help"}, 0)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(command, compare_help, {"compare", "--help"}, 0)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(command, summary_help, {"summary", "--help"}, 0)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(command, bench_compare_help, {"bench-compare", "--help"}, 0)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
// Real work of the smallest kind: a 72 KB trace replayed (exact, exit 0).
BENCHMARK_CAPTURE(command, replay_small_trace, {"replay", kTrace}, 0)->UseManualTime()->Unit(benchmark::kMillisecond);
// For contrast: a measuring subcommand pays for LibTorch.
BENCHMARK_CAPTURE(command, profile_help, {"profile", "--help"}, 0)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
