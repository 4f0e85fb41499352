// The process of one rank of a distributed probe (measure/probe.h, run_distributed_probe): the memgate CLI and every
// memory-suite executable run it when started as `<program> --memgate-rank ...`, so that a project's own registered
// architectures are there in each rank.
#pragma once

#include <functional>
#include <string>

namespace memgate {

struct Workload;

/// Whether this process was started as a rank of a distributed probe (its first argument is --memgate-rank), or as
/// the fork server its ranks are forked from (--memgate-fork-server). Calling it also says that this program runs
/// ranks: its distributed probes start their ranks from it.
[[nodiscard]] bool is_rank_command(int argc, char** argv);

/// Runs the probe its request asks for (`--memgate-rank --request FILE`: launch/request.h, the workload as the launcher
/// parsed it): a rank joins the other ranks through the c10d::FileStore named there, measures its own components with
/// the probe's protocol and writes them to its output file. Returns the process's exit code: 0 when it measured (an
/// out-of-memory is a result), 2 for bad arguments, 3 for any other error (printed to stderr).
///
///   int main(int argc, char** argv) {
///     if (memgate::is_rank_command(argc, argv)) return memgate::rank_main(argc, argv);
///     ...
///   }
int rank_main(int argc, char** argv);

/// What a Python probe process whose request holds a search runs: a whole search of the largest batches by estimate
/// (memgate::advise's), the search's own request its input and its answer written as the output, so that one process
/// and one built module serve every batch size of the search. memgate's Python extension installs it.
using RankSearch = std::function<std::string(const Workload& workload, const std::string& request)>;
void set_rank_search(RankSearch search);

}  // namespace memgate
