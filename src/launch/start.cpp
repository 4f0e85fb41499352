// Starting a probe's memgate children: the rank executable or a Python fixture's Python, their environment and fork
// server, the request each child reads, and ProbeProcesses, the one way the launcher starts them.
#include "start.h"

#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/backend/cpu_allocator.h"
#include "memgate/estimate/estimate_context.h"
#include "memgate/launch/ranks.h"
#include "memgate/models/python.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <string_view>
#include <utility>
#include <variant>

#include <unistd.h>

extern char** environ;

namespace memgate {

namespace {

bool& rank_host() {
  static bool host = false;
  return host;
}

// The program each rank runs: MEMGATE_RANK_EXECUTABLE; else this program when its main() runs ranks (the memgate
// CLI, a memory suite); else the memgate CLI beside it (bin/memgate of an install or a build tree: tests/ and bin/).
std::string rank_executable() {
  if (const char* exe = std::getenv("MEMGATE_RANK_EXECUTABLE"); exe != nullptr && *exe != '\0') return exe;
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw Error("cannot find this program to start ranks from (/proc/self/exe): set MEMGATE_RANK_EXECUTABLE");
  if (rank_host()) return self.string();
  for (const auto& candidate : {self.parent_path() / "memgate", self.parent_path().parent_path() / "bin" / "memgate"}) {
    if (std::filesystem::is_regular_file(candidate, ec)) return candidate.string();
  }
  throw Error(self.string() + " does not run ranks and no memgate program is beside it: set MEMGATE_RANK_EXECUTABLE "
              "to memgate's path (or call memgate::rank_main from main(), as memgate_add_memory_suite's programs do)");
}

// The Python that runs a Python fixture's probes: its `python:` key, else MEMGATE_PYTHON, else the Python whose torch
// memgate was built against where it is there (a build tree, cmake --install), else the Python of the environment
// memgate was pip-installed into, else python3 on PATH (in an activated virtual environment, its own).
std::string python_executable(const PythonOptions& py) {
  std::string name = py.python;
  const char* where = "model.python";
  std::error_code ec;
  if (const char* env = std::getenv("MEMGATE_PYTHON"); name.empty() && env != nullptr && *env != '\0') {
    name = env;
    where = "MEMGATE_PYTHON";
  }
#ifdef MEMGATE_DEFAULT_PYTHON
  if (name.empty() && ::access(MEMGATE_DEFAULT_PYTHON, X_OK) == 0) {
    name = MEMGATE_DEFAULT_PYTHON;
    where = "the Python memgate was built with";
  }
#endif
  // pip install (no Python built in): the Python of the environment memgate was installed into, the one whose bin/
  // holds the memgate command (<env>/bin/memgate, <env>/libexec/memgate/memgate-measure).
  if (const auto self = std::filesystem::read_symlink("/proc/self/exe", ec); name.empty() && !ec) {
    for (const auto& prefix : {self.parent_path().parent_path(), self.parent_path().parent_path().parent_path()}) {
      const auto candidate = prefix / "bin" / "python3";
      if (std::filesystem::is_regular_file(prefix / "bin" / "memgate", ec) && ::access(candidate.c_str(), X_OK) == 0) {
        name = candidate.string();
        where = "the Python of memgate's environment";
        break;
      }
    }
  }
  if (name.empty()) {
    name = "python3";
    where = "python3 on PATH";
  }
  const bool from_key = !py.python.empty();
  if (name.find('/') != std::string::npos) {
    if (::access(name.c_str(), X_OK) == 0 && !std::filesystem::is_directory(name, ec)) return name;
    const auto why = !std::filesystem::exists(name, ec)        ? "not there"
                     : std::filesystem::is_directory(name, ec) ? "a folder"
                                                                : "not executable";
    if (from_key) {
      throw Error(fmt::format("{}: expected an executable Python (a path relative to the fixture's folder, or a name "
                              "on PATH), got '{}': tried {}, which is {}",
                              py.python_key, py.python_written, name, why));
    }
    throw Error(fmt::format("the Python '{}' ({}) is not an executable file: {} is {}", name, where, name, why));
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  for (std::size_t start = 0; start <= dirs.size();) {
    const auto end = std::min(dirs.find(':', start), dirs.size());
    const auto candidate = std::filesystem::path(dirs.substr(start, end - start)) / name;
    if (::access(candidate.c_str(), X_OK) == 0 && !std::filesystem::is_directory(candidate, ec)) return candidate;
    start = end + 1;
  }
  if (from_key) {
    throw Error(fmt::format("{}: expected an executable Python (a path relative to the fixture's folder, or a name on "
                            "PATH), got '{}': tried each folder of PATH ({}), none has it",
                            py.python_key, py.python_written, dirs));
  }
  throw Error(fmt::format("the Python '{}' ({}) is not on PATH: set MEMGATE_PYTHON to a Python with torch and memgate",
                          name, where));
}

// The server a probe's processes are forked from (launch/fork_server.h): for `python -m memgate ...`, the Python's;
// for a rank program, its own, unless MEMGATE_RANK_EXECUTABLE names one: a program of the user's own (a wrapper
// that sets something up per rank) is started for each rank, as it says.
ForkServer* fork_server_of(const std::vector<std::string>& command, const std::vector<std::string>& env,
                           bool compiles = false) {
  if (command.size() >= 3 && command[1] == "-m" && command[2] == "memgate") {
    // A compiled model's probes come from a server of their own that has run Inductor's per-process checks of the
    // CPU's vector ISAs first (each a Python that imports torch: 11 s here), so that each probe does not.
    std::vector<std::string> start{command[0], "-m", "memgate._forkserver"};
    if (compiles) start.emplace_back("--inductor");
    // MEMGATE_GC_FREEZE=0 (memgate's tests) is the probe's own: it unfreezes what the server froze (_probe.py), so it
    // forks from the server the others fork from rather than from one of its own that imports everything again.
    std::vector<std::string> server_env;
    std::ranges::copy_if(env, std::back_inserter(server_env),
                         [](const std::string& e) { return !e.starts_with("MEMGATE_GC_FREEZE="); });
    return ForkServer::of(start, server_env);
  }
  if (const char* exe = std::getenv("MEMGATE_RANK_EXECUTABLE"); exe != nullptr && *exe != '\0') return nullptr;
  return ForkServer::of({command.front(), "--memgate-fork-server"}, env);
}

// A Python model's own code, `file:callable` (its entry's and its loss's, where a file names them): the installed
// packages it imports are what its probes import first (launch/fork_server.h).
std::vector<std::string> python_code_of(const Workload& workload) {
  std::vector<std::string> code;
  if (const auto* py = std::get_if<PythonOptions>(&workload.model.options)) {
    if (!py->entry_file.empty()) code.push_back(py->entry_file + ":" + py->entry_callable);
    if (!py->loss_file.empty()) code.push_back(py->loss_file + ":" + py->loss_callable);
    for (const auto* c : {&py->batch, &py->compute_loss, &py->optimizer}) {
      if (!c->file.empty()) code.push_back(c->file + ":" + c->callable);
    }
  }
  return code;
}

// A memgate.py (or a memgate/ folder that is not memgate's package) in the folder a Python probe starts in: `python -m
// memgate` imports it instead of memgate's package (that folder comes first on its sys.path), and it exits with 0
// having measured nothing. Said when a probe does that; empty when there is none, or `command` is not a Python's.
std::string shadowing_note(const std::vector<std::string>& command) {
  if (command.size() < 3 || command[1] != "-m") return {};
  std::error_code ec;
  const auto cwd = std::filesystem::current_path(ec);
  if (ec) return {};
  const auto file = cwd / "memgate.py";
  const auto folder = cwd / "memgate";
  std::filesystem::path found;
  if (std::filesystem::is_regular_file(file, ec)) {
    found = file;
  } else if (std::filesystem::is_directory(folder, ec) &&
             !std::filesystem::is_regular_file(folder / "_forkserver.py", ec)) {
    found = folder;
  }
  if (found.empty()) return {};
  return fmt::format("{} shadows memgate's Python package: `{} -m memgate`, started in {}, imports it instead of "
                     "memgate's (rename it, or run memgate from another folder)", found.string(), command[0],
                     cwd.string());
}

// What starts one of a probe's processes: for a Python fixture its Python, running memgate's package (`-m memgate`,
// which calls rank_main); else the rank executable. Each process reads its request (command_for), not the fixture.
std::vector<std::string> child_command(const Workload& workload) {
  if (const auto* py = std::get_if<PythonOptions>(&workload.model.options)) {
    try {
      return {python_executable(*py), "-m", "memgate"};
    } catch (const Error& e) {
      throw Error(workload.source + ": " + e.what());
    }
  }
  return {rank_executable()};
}

// The environment of a probe's processes: this one's, with memgate's Python package first on PYTHONPATH so that
// `python -m memgate` finds the extension this memgate built: MEMGATE_PYTHONPATH, else a build tree's python/ (beside
// bin/ and tests/ of build/<preset>, or above libexec/memgate/), else an install's lib/memgate/python (cmake --install),
// else none (a package installed into the Python's environment: pip install).
std::vector<std::string> child_environment() {
  std::string package;
  if (const char* env = std::getenv("MEMGATE_PYTHONPATH"); env != nullptr && *env != '\0') package = env;
  std::error_code ec;
  if (const auto self = std::filesystem::read_symlink("/proc/self/exe", ec); package.empty() && !ec) {
    // build/<preset>/{bin,tests}/<program>, or build/<preset>/libexec/memgate/memgate-measure; <prefix>/bin/<program>
    // or <prefix>/libexec/memgate/memgate-measure.
    const auto up1 = self.parent_path().parent_path();
    const auto up2 = up1.parent_path();
    for (const auto& build : {up1 / "python", up2 / "python", up1 / "lib" / "memgate" / "python",
                              up2 / "lib" / "memgate" / "python"}) {
      if (std::filesystem::is_regular_file(build / "memgate" / "__init__.py", ec)) {
        package = build.string();
        break;
      }
    }
  }
  std::vector<std::string> env;
  std::string pythonpath = package;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (entry.starts_with("PYTHONPATH=")) {
      const auto rest = entry.substr(11);
      if (!rest.empty()) pythonpath += (pythonpath.empty() ? "" : ":") + std::string(rest);
    } else {
      env.emplace_back(entry);
    }
  }
  if (!pythonpath.empty()) env.push_back("PYTHONPATH=" + pythonpath);
  return env;
}

}  // namespace

void declare_rank_host() { rank_host() = true; }

namespace detail {

ProbeRequest probe_request(const Workload& workload, std::span<const std::int64_t> batch_sizes, int rank,
                           std::int64_t world, const std::filesystem::path& output, const ProbeOptions& options,
                           std::int64_t cap_bytes, const std::string& device) {
  ProbeRequest request;
  request.workload = workload;
  request.batch_sizes.assign(batch_sizes.begin(), batch_sizes.end());
  request.device = device;
  request.cap_bytes = cap_bytes;
  if (const auto* cpu = CountingCpuAllocator::instance(); cpu != nullptr && cpu->limit() > 0) {
    request.cpu_limit_bytes = cpu->limit();
  }
  request.warmup_steps = options.warmup_steps;
  request.cpu_threads = options.cpu_threads;
  request.seed = options.seed;
  request.timeout = options.rank_timeout;
  request.keep_going = options.keep_going;
  request.rank = rank;
  request.world_size = world;
  request.output = output.string();
  request.heartbeat = fmt::format("{}/rank{}.beat", output.parent_path().string(), rank);
  return request;
}

// What an estimate for `target` is for, in a process of its own: this thread's context (the GPU `estimate --gpu`
// sets), for `target` and the workload's CPU kernels.
EstimateContext estimate_for(const Workload& workload, EstimateTarget target) {
  auto context = estimate_context();
  context.target = target;
  context.cpu_kernels = workload.training.cpu_kernels;
  return context;
}

ProbeProcesses::ProbeProcesses(const Workload& workload, std::chrono::seconds timeout)
    : command_(child_command(workload)),
      env_(child_environment()),
      server_(fork_server_of(command_, env_, workload.training.compile)),
      scan_(python_code_of(workload)),
      note_(shadowing_note(command_)),
      children_(run_, timeout) {}

void ProbeProcesses::start(std::string name, const ProbeRequest& request, std::string result) {
  // The request beside the child's result: the child reads it whole (rank_main), the fixture's file never again.
  const auto path = std::filesystem::path(request.output).parent_path() / fmt::format("rank{}.request.json",
                                                                                      request.rank);
  write_probe_request(path.string(), request);
  auto argv = command_;
  argv.insert(argv.end(), {"--memgate-rank", "--request", path.string()});
  children_.start({.name = std::move(name), .argv = std::move(argv), .env = env_,
                   .log = (dir() / fmt::format("rank{}.log", request.rank)).string(), .heartbeat = request.heartbeat,
                   .server = server_, .scan = scan_, .result = std::move(result), .no_result_note = note_});
}

}  // namespace detail

}  // namespace memgate
