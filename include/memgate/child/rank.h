// The entry of a memgate child, the process of one probe (launch/request.h): a rank of a distributed probe, or the
// whole probe or search of a Python fixture in a Python process. The memgate CLI and every memory-suite executable run
// it when started as `<program> --memgate-rank ...` (so that a project's own registered architectures are there in
// each rank), memgate's Python extension when `python -m memgate` is. It sits above the layers whose work it runs
// (launch, gate, advise), as cli/ does.
#pragma once

namespace memgate {

struct PythonRuntime;

/// Whether this process was started as a rank of a distributed probe (its first argument is --memgate-rank), or as
/// the fork server its ranks are forked from (--memgate-fork-server). Calling it also says that this program runs
/// ranks: its distributed probes start their ranks from it.
[[nodiscard]] bool is_rank_command(int argc, char** argv);

/// Runs the probe its request asks for (`--memgate-rank --request FILE`: launch/request.h, the workload as the launcher
/// parsed it): a rank joins the other ranks through the c10d::FileStore named there, measures its own components with
/// the probe's protocol and writes them to its output file; a request with a search (a Python fixture's, launch/ranks.h
/// run_python_search) runs advise's search_largest_batches_here and writes its answer. `--memgate-fork-server` runs
/// the fork server instead. `python`: what memgate's Python extension lends the probes of a Python process
/// (memgate._core passes it; models/python.h), handed down with each probe (ProbeOptions::python); a C++ program
/// passes none. Returns the process's exit code: 0 when it measured (an out-of-memory is a result), 2 for bad
/// arguments, 3 for any other error (printed to stderr).
///
///   int main(int argc, char** argv) {
///     if (memgate::is_rank_command(argc, argv)) return memgate::rank_main(argc, argv);
///     ...
///   }
int rank_main(int argc, char** argv, const PythonRuntime* python = nullptr);

}  // namespace memgate
