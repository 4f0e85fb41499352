// The distributed probe: one process per rank (the rank executable, started with --memgate-rank), meeting through a
// c10d::FileStore in a folder of the probe's own; each measures its own components, and the parent gathers them. On
// the Meta device (an estimate) the ranks run in turn in this process.
#include "memgate/launch/ranks.h"

#include "children.h"
#include "fork_server.h"

#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/backend/cpu_allocator.h"
#include "memgate/backend/device.h"
#include "memgate/distributed/process_group.h"
#include "memgate/estimate/estimate_context.h"
#include "memgate/launch/request.h"
#include "memgate/models/python.h"
#include "memgate/models/zoo.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <string_view>
#include <thread>
#include <variant>

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

extern char** environ;

namespace memgate {

namespace {

// A distributed probe's own figures from its ranks': the largest of each.
void fold_ranks(ProbeResult& result) {
  result.components = max_over_ranks(result.ranks);
  for (const auto& r : result.ranks) {
    result.comm_buffer_bytes = std::max(result.comm_buffer_bytes, r.comm_buffer_bytes);
    result.comm_buffers = std::max(result.comm_buffers, r.comm_buffers);
    result.communicator_bytes = std::max(result.communicator_bytes, r.communicator_bytes);
    result.outside_allocator_bytes = std::max(result.outside_allocator_bytes, r.outside_allocator_bytes);
    result.library_workspace_bytes = std::max(result.library_workspace_bytes, r.library_workspace_bytes);
  }
}

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
    return ForkServer::of(start, env);
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

bool runs_in_python(const Workload& workload) {
  return workload.model.arch == Arch::kPython && !python_models_available();
}

namespace {

// What every probe process is asked (launch/request.h), but a rank's store and snapshot. The CPU counting allocator's
// limit of this process (profile --cpu-memory-limit-mib) goes to each: a probe in a process of its own (a Python
// fixture's, a rank) runs out of memory at it as one in this process does.
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

// The command that starts a probe's process on `request`, written beside its result: the child reads it whole.
std::vector<std::string> command_for(std::vector<std::string> command, const ProbeRequest& request) {
  const auto path = std::filesystem::path(request.output).parent_path() / fmt::format("rank{}.request.json",
                                                                                      request.rank);
  write_probe_request(path.string(), request);
  command.insert(command.end(), {"--memgate-rank", "--request", path.string()});
  return command;
}

// The result file's memgate version must be this one's: a rank program of another memgate may write other figures.
void require_same_version(const nlohmann::json& j, const std::string& who, const std::string& program) {
  const auto version = j.contains("memgate_version") ? j.at("memgate_version").get<std::string>() : "an older one";
  if (version != MEMGATE_VERSION) {
    throw Error(fmt::format("{} ran {}, memgate {}, and this is memgate {}: the probe's processes must run the same "
                            "memgate (set MEMGATE_RANK_EXECUTABLE, or MEMGATE_PYTHON and MEMGATE_PYTHONPATH, to this "
                            "one's)", who, program, version, MEMGATE_VERSION));
  }
}

// What rank `rank` wrote into `dir` (rank_result_text); throws for a rank that left none.
nlohmann::json read_rank_result(const std::filesystem::path& dir, int rank) {
  return nlohmann::json::parse(read_text_file((dir / fmt::format("rank{}.json", rank)).string(), "a rank's result file"));
}

std::string rank_oom_error(int rank, const nlohmann::json& j) {
  return fmt::format("rank {}: {}", rank, j.at("error").get<std::string>());
}

Components components_from(const nlohmann::json& j) {
  Components c;
  for (const auto& info : kComponentTable) {
    const auto key = std::string(info.name);
    if (info.present != nullptr) {
      if (!j.contains(key)) continue;
      c.*info.present = true;
    }
    c.*info.member = j.at(key).get<std::int64_t>();
  }
  return c;
}

nlohmann::json components_json(const Components& c) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& info : kComponentTable) {
    if (has_component(c, info)) out[std::string(info.name)] = c.*info.member;
  }
  return out;
}

// One rank's figures as rank_result_text writes them (a rank's own file, or an entry of `ranks`).
RankComponents rank_components_from(const nlohmann::json& j) {
  return {.rank = j.at("rank").get<int>(),
          .components = components_from(j.at("components")),
          .comm_buffer_bytes = j.at("comm_buffer_bytes").get<std::int64_t>(),
          .comm_buffers = j.at("comm_buffers").get<std::int64_t>(),
          .communicator_bytes = j.at("communicator_bytes").get<std::int64_t>(),
          .outside_allocator_bytes = j.at("outside_allocator_bytes").get<std::int64_t>(),
          .library_workspace_bytes = j.at("library_workspace_bytes").get<std::int64_t>()};
}

}  // namespace

std::string probe_file(const std::string& path, std::size_t index, std::size_t count) {
  return count == 1 ? path : path + "." + std::to_string(index);
}

std::string rank_result_text(int rank, const ProbeResult& r) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& one : r.ranks) {
    ranks.push_back({{"rank", one.rank},
                     {"components", components_json(one.components)},
                     {"comm_buffer_bytes", one.comm_buffer_bytes},
                     {"comm_buffers", one.comm_buffers},
                     {"communicator_bytes", one.communicator_bytes},
                     {"outside_allocator_bytes", one.outside_allocator_bytes},
                     {"library_workspace_bytes", one.library_workspace_bytes}});
  }
  nlohmann::json out{{"rank", rank},
                     {"memgate_version", MEMGATE_VERSION},
                     {"batch_size", r.batch_size},
                     {"oom", r.oom},
                     {"failed", r.failed},
                     {"error", r.error},
                     {"components", components_json(r.components)},
                     {"comm_buffer_bytes", r.comm_buffer_bytes},
                     {"comm_buffers", r.comm_buffers},
                     {"communicator_bytes", r.communicator_bytes},
                     {"outside_allocator_bytes", r.outside_allocator_bytes},
                     {"library_workspace_bytes", r.library_workspace_bytes},
                     {"seconds", r.seconds},
                     {"step_seconds", r.step_seconds},
                     {"ranks", ranks}};
  if (!r.modules.empty()) out["modules"] = module_breakdown_to_json(r.modules);
  if (r.param_counts) {
    out["params"] = {{"total", r.param_counts->total},
                     {"trainable", r.param_counts->trainable},
                     {"frozen", r.param_counts->frozen}};
  }
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // an error may quote a non-UTF-8 path
}

std::vector<ProbeResult> run_python_probes(const Workload& workload, std::span<const std::int64_t> batch_sizes,
                                           c10::Device device, const ProbeOptions& options,
                                           std::optional<EstimateTarget> estimate, std::int64_t cap_bytes) {
  if (batch_sizes.empty()) return {};
  for (const auto batch_size : batch_sizes) require_batch_size(workload, batch_size);
  auto command = child_command(workload);
  const auto env = child_environment();
  RunDir run;
  const auto& dir = run.path();
  const auto& spec = workload.training.distributed;
  // Every batch size in the one process, in order: its imports (torch, the user's libraries) are paid once.
  auto request = probe_request(workload, batch_sizes, 0, spec.enabled() ? spec.world_size : 1, dir / "rank0.json",
                               options, cap_bytes, device.str());
  if (estimate) request.estimate = estimate_for(workload, *estimate);
  const auto snapshot = dir / "probe.pickle";
  if (options.snapshot) request.snapshot = snapshot.string();
  command = command_for(std::move(command), request);
  // What the process writes for its i-th batch size (rank_main: a file per batch size when it probes several).
  const auto of_probe = [&](const std::filesystem::path& path, std::size_t i) {
    return std::filesystem::path(probe_file(path.string(), i, batch_sizes.size()));
  };
  Children children(run, options.rank_timeout);
  children.start({.name = "its Python probe", .argv = command, .env = env, .log = (dir / "rank0.log").string(),
                  .heartbeat = (dir / "rank0.beat").string(),
                  .server = fork_server_of(command, env, workload.training.compile),
                  .scan = python_code_of(workload),
                  .result = of_probe(dir / "rank0.json", batch_sizes.size() - 1).string(),
                  .no_result_note = shadowing_note(command)});
  // The batch sizes whose results it wrote (all of them, unless it failed).
  std::size_t written = batch_sizes.size();
  std::optional<std::string> failed;
  if (auto failure = children.wait()) {
    // The batch size it was at: the first whose result it had not written.
    std::size_t done = 0;
    std::error_code ec;
    while (done < batch_sizes.size() && std::filesystem::is_regular_file(of_probe(dir / "rank0.json", done), ec)) {
      ++done;
    }
    const auto message = fmt::format("{} at batch {}: {} (-m memgate): {}", workload.source,
                                     batch_sizes[std::min(done, batch_sizes.size() - 1)], command.front(), *failure);
    // A profile's: the process ended at that batch size (a crash, a timeout); the ones before it are read, and the
    // ones after it run in a process of their own.
    if (!options.keep_going || done >= batch_sizes.size()) throw Error(message);
    written = done;
    failed = message;
  }
  std::vector<ProbeResult> results;
  for (std::size_t i = 0; i < written; ++i) {
    const auto j = nlohmann::json::parse(read_text_file(of_probe(dir / "rank0.json", i).string(), "a probe's result file"));
    require_same_version(j, "the Python probe", command.front() + " -m memgate");
    ProbeResult result;
    result.batch_size = batch_sizes[i];
    result.oom = j.at("oom").get<bool>();
    result.failed = j.value("failed", false);
    result.error = j.at("error").get<std::string>();
    result.components = components_from(j.at("components"));
    if (j.contains("modules")) result.modules = module_breakdown_from_json(j.at("modules"), "the Python probe's modules");
    result.comm_buffer_bytes = j.at("comm_buffer_bytes").get<std::int64_t>();
    result.comm_buffers = j.at("comm_buffers").get<std::int64_t>();
    result.communicator_bytes = j.at("communicator_bytes").get<std::int64_t>();
    result.outside_allocator_bytes = j.at("outside_allocator_bytes").get<std::int64_t>();
    result.library_workspace_bytes = j.at("library_workspace_bytes").get<std::int64_t>();
    result.seconds = j.at("seconds").get<double>();
    result.step_seconds = j.at("step_seconds").get<double>();
    for (const auto& r : j.at("ranks")) result.ranks.push_back(rank_components_from(r));
    if (j.contains("params")) {
      const auto& p = j.at("params");
      result.param_counts = ParamCounts{p.at("total").get<std::int64_t>(), p.at("trainable").get<std::int64_t>(),
                                        p.at("frozen").get<std::int64_t>()};
    }
    if (options.snapshot) {
      std::error_code ec;
      const auto probe_snapshot = of_probe(snapshot, i);
      if (std::filesystem::is_regular_file(probe_snapshot, ec)) {
        result.snapshot = read_text_file(probe_snapshot.string(), "a memory snapshot");
      }
      for (std::size_t r = 0; r < result.ranks.size(); ++r) {
        const auto path = std::filesystem::path(fmt::format("{}.rank{}", probe_snapshot.string(), r));
        result.rank_snapshots.push_back(std::filesystem::is_regular_file(path, ec)
                                            ? read_text_file(path.string(), "a memory snapshot")
                                            : std::string());
      }
    }
    results.push_back(std::move(result));
  }
  if (failed) {
    ProbeResult result;
    result.batch_size = batch_sizes[written];
    result.failed = true;
    result.error = *failed;
    results.push_back(std::move(result));
    if (written + 1 < batch_sizes.size()) {
      for (auto& rest : run_python_probes(workload, batch_sizes.subspan(written + 1), device, options, estimate,
                                          cap_bytes)) {
        results.push_back(std::move(rest));
      }
    }
  }
  return results;
}

std::string run_python_search(const Workload& workload, const std::string& request, const ProbeOptions& options) {
  auto command = child_command(workload);
  const auto env = child_environment();
  RunDir run;
  const auto& dir = run.path();
  const auto& spec = workload.training.distributed;
  const std::int64_t one[] = {1};
  auto probe = probe_request(workload, one, 0, spec.enabled() ? spec.world_size : 1, dir / "rank0.json", options, 0,
                             "meta");
  probe.estimate = estimate_for(workload, EstimateTarget::kCuda);
  probe.search = request;
  command = command_for(std::move(command), probe);
  Children children(run, options.rank_timeout);
  children.start({.name = "its Python search", .argv = command, .env = env, .log = (dir / "rank0.log").string(),
                  .heartbeat = (dir / "rank0.beat").string(),
                  .server = fork_server_of(command, env, workload.training.compile),
                  .scan = python_code_of(workload),
                  .result = (dir / "rank0.json").string(),
                  .no_result_note = shadowing_note(command)});
  if (auto failure = children.wait()) {
    throw Error(fmt::format("{}: the search by estimate: {} (-m memgate): {}", workload.source, command.front(),
                            *failure));
  }
  auto answer = read_text_file((dir / "rank0.json").string(), "a search's answer");
  require_same_version(nlohmann::json::parse(answer), "the Python search", command.front() + " -m memgate");
  return answer;
}

ProbeResult run_python_probe(const Workload& workload, std::int64_t batch_size, c10::Device device,
                             const ProbeOptions& options, std::optional<EstimateTarget> estimate,
                             std::int64_t cap_bytes) {
  const std::int64_t batch_sizes[] = {batch_size};
  return std::move(run_python_probes(workload, batch_sizes, device, options, estimate, cap_bytes).front());
}

namespace {

// CPU ranks: processes of one intra-op thread each, which may share cores (Gloo's collectives wait without spinning),
// up to this many per core; beyond it the probe is refused rather than started.
constexpr int kRanksPerCore = 8;

// What one rank process holds before its model: LibTorch loaded and a process group joined (measured: a zoo rank
// about 180 MiB of its own (private, beyond the shared library pages), a Python one with torch imported about 350 MiB; README "Distributed probes").
constexpr std::int64_t kRankFootprintBytes = std::int64_t{180} << 20;
constexpr std::int64_t kPythonRankFootprintBytes = std::int64_t{350} << 20;

int cores_for_this_process() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1U, std::thread::hardware_concurrency());
}

// MemAvailable of /proc/meminfo in bytes; -1 where it cannot be read.
std::int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

// A world of CPU ranks this machine cannot hold is refused before any starts: the limit named, and the way out.
void require_cpu_room(const Workload& workload, int world) {
  const int cores = cores_for_this_process();
  if (world > kRanksPerCore * cores) {
    throw Error(fmt::format("{}: a world size of {} needs {} rank processes, and this process may use {} core{}: "
                            "memgate runs at most {} CPU ranks per core ({} here). Estimate that many ranks without "
                            "processes (memgate estimate --world-size {}), or probe on a machine with more cores",
                            workload.source, world, world, cores, cores == 1 ? "" : "s", kRanksPerCore,
                            kRanksPerCore * cores, world));
  }
  const auto each = workload.model.arch == Arch::kPython ? kPythonRankFootprintBytes : kRankFootprintBytes;
  if (const auto available = available_memory_bytes(); available >= 0 && world * each > available) {
    throw Error(fmt::format("{}: a world size of {} needs {} rank processes of about {} MiB each before their model "
                            "({} MiB), and this machine has {} MiB available (MemAvailable). Estimate that many ranks "
                            "without processes (memgate estimate --world-size {})", workload.source, world, world,
                            each >> 20, (world * each) >> 20, available >> 20, world));
  }
}

}  // namespace

std::vector<int> rank_kinds(const Workload& workload, int world) {
  std::vector<int> kinds(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) kinds[static_cast<std::size_t>(r)] = r;
  const auto& spec = workload.training.distributed;
  if (!spec.enabled() || world < 2) return kinds;
  if (spec.strategy == DistributedStrategy::kDdp) {
    // DDP: every rank a full replica, its buckets the same.
    for (auto& k : kinds) k = 0;
    return kinds;
  }
  // FSDP: a rank is its rows of each parameter's dim-0 chunks (FullyShard's shards: torch.chunk, padded to the first
  // chunk), the post-forward group's parts and every buffer the same size on each.
  std::vector<std::int64_t> rows;
  try {
    const auto model = build_model(workload.model, c10::Device(c10::DeviceType::Meta));
    for (const auto& p : model->module().named_parameters(/*recurse=*/true)) {
      rows.push_back(p.value().dim() > 0 ? p.value().size(0) : 1);
    }
  } catch (const std::exception&) {
    return kinds;  // a model that does not build on the Meta device: every rank estimated
  }
  std::map<std::vector<std::int64_t>, int> first_of;
  for (int r = 0; r < world; ++r) {
    std::vector<std::int64_t> owned;
    owned.reserve(rows.size());
    for (const auto n : rows) {
      const auto chunk = (n + world - 1) / world;
      owned.push_back(std::clamp(n - r * chunk, std::int64_t{0}, chunk));
    }
    kinds[static_cast<std::size_t>(r)] = first_of.emplace(std::move(owned), r).first->second;
  }
  return kinds;
}

ProbeResult run_distributed_probe(const Workload& workload, std::int64_t batch_size, c10::Device device,
                                  const ProbeOptions& options) {
  require_batch_size(workload, batch_size);
  const auto& spec = workload.training.distributed;
  const int world = static_cast<int>(spec.world_size);
  if (device.is_meta()) {
    // An estimate: each rank in turn, in this process, over the Meta device's process group.
    // Ranks whose parts of the model have the same shapes make the same requests: each kind is estimated once.
    ProbeResult result;
    result.batch_size = batch_size;
    const auto start = std::chrono::steady_clock::now();
    const auto kinds = rank_kinds(workload, world);
    for (int r = 0; r < world; ++r) {
      if (const auto like = kinds[static_cast<std::size_t>(r)]; like != r) {
        auto same = result.ranks[static_cast<std::size_t>(like)];
        same.rank = r;
        result.ranks.push_back(same);
        if (options.snapshot) result.rank_snapshots.push_back(result.rank_snapshots[static_cast<std::size_t>(like)]);
        continue;
      }
      const auto group = meta_process_group(r, world);
      auto rank_options = options;
      rank_options.rank_group = &group;
      auto one = measure_probe(workload, batch_size, device, rank_options);
      if (one.oom) return one;
      if (options.snapshot) result.rank_snapshots.push_back(std::move(one.snapshot));
      result.step_seconds = std::max(result.step_seconds, one.step_seconds);
      result.ranks.push_back({r, one.components, one.comm_buffer_bytes, one.comm_buffers});
    }
    fold_ranks(result);
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return result;
  }
  if (!device.is_cpu() && !device.is_cuda()) {
    throw Error(fmt::format("{}: a distributed probe runs on the CPU (Gloo) or on GPUs (NCCL), not on {}",
                            workload.source, device.str()));
  }
  // On GPUs, one per rank; this process touches none of them (no context of its own on a rank's GPU).
  std::vector<std::string> rank_devices(static_cast<std::size_t>(world), "cpu");
  if (device.is_cuda()) {
    if (!nccl_available()) {
      throw Error(fmt::format("{}: this memgate was built without NCCL, so its ranks cannot train on GPUs: build it "
                              "against a CUDA LibTorch with NCCL's headers, or estimate the ranks (memgate estimate "
                              "--world-size {})", workload.source, world));
    }
    const auto gpus = !options.rank_devices.empty()
                          ? options.rank_devices
                          : consecutive_gpus(device.has_index() ? device.index() : 0, world,
                                             static_cast<int>(torch::cuda::device_count()));
    if (static_cast<int>(gpus.size()) != world) {
      throw Error(fmt::format("{}: {} GPUs given for {} ranks: expected one per rank", workload.source, gpus.size(),
                              world));
    }
    for (int r = 0; r < world; ++r) rank_devices[static_cast<std::size_t>(r)] = fmt::format("cuda:{}", gpus[r]);
  }
  if (device.is_cpu()) require_cpu_room(workload, world);
  const auto command = child_command(workload);
  const auto env = child_environment();
  auto* const server = fork_server_of(command, env, workload.training.compile);
  const auto scan = python_code_of(workload);
  const auto no_result_note = shadowing_note(command);
  RunDir run;
  const auto& dir = run.path();
  const auto start = std::chrono::steady_clock::now();
  Children children(run, options.rank_timeout);
  for (int r = 0; r < world; ++r) {
    const std::int64_t one[] = {batch_size};
    auto request = probe_request(workload, one, r, world, dir / fmt::format("rank{}.json", r), options,
                                 options.rank_cap_bytes, rank_devices[static_cast<std::size_t>(r)]);
    request.store = (dir / "store").string();
    if (options.snapshot) request.snapshot = (dir / fmt::format("rank{}.pickle", r)).string();
    auto argv = command_for(command, request);
    try {
      children.start({.name = fmt::format("rank {} of {}", r, world), .argv = std::move(argv), .env = env,
                      .log = (dir / fmt::format("rank{}.log", r)).string(),
                      .heartbeat = (dir / fmt::format("rank{}.beat", r)).string(), .server = server,
                      .scan = scan, .result = (dir / fmt::format("rank{}.json", r)).string(),
                      .no_result_note = no_result_note});
    } catch (const Error& e) {
      throw Error(fmt::format("{} at batch {}: {}", workload.source, batch_size, e.what()));
    }
  }
  // Each rank's end; the first that fails (or stops answering) ends the others: they would wait on it in a collective.
  const auto failure = children.wait();
  ProbeResult result;
  result.batch_size = batch_size;
  if (failure) {
    // A rank that ran out of memory leaves the collective its peers wait in: they fail with a closed connection.
    // Ranks differ (FSDP's shards do), so one may run out alone: the probe ran out of memory, as that rank did.
    for (int r = 0; r < world; ++r) {
      try {
        const auto j = read_rank_result(dir, r);
        if (j.at("oom").get<bool>()) {
          result.oom = true;
          result.error = rank_oom_error(r, j);
          result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          return result;
        }
      } catch (const std::exception&) {
        // No result from this rank: not the one that ran out of memory.
      }
    }
    throw Error(fmt::format("{} at batch {}: {}", workload.source, batch_size, *failure));
  }
  for (int r = 0; r < world; ++r) {
    nlohmann::json j;
    try {
      j = read_rank_result(dir, r);
    } catch (const std::exception& e) {
      throw Error(fmt::format("{}: rank {} left no result ({})", workload.source, r, e.what()));
    }
    require_same_version(j, fmt::format("rank {}", r), command.front());
    if (j.at("oom").get<bool>()) {
      result.oom = true;
      if (result.error.empty()) result.error = rank_oom_error(r, j);
      continue;
    }
    auto rc = rank_components_from(j);
    rc.rank = r;
    result.step_seconds = std::max(result.step_seconds, j.at("step_seconds").get<double>());
    result.ranks.push_back(rc);
  }
  if (result.oom) result.ranks.clear();
  else fold_ranks(result);
  if (options.snapshot && !result.oom) {
    for (int r = 0; r < world; ++r) {
      const auto path = dir / fmt::format("rank{}.pickle", r);
      result.rank_snapshots.push_back(std::filesystem::is_regular_file(path) ? read_text_file(path, "a memory snapshot")
                                                                              : std::string());
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace memgate
