// Running a program from a test without a shell (its arguments are what they are: quotes, `$(...)`, newlines), in a
// folder, with changes to its environment; what it printed, how it ended, its wall time and its peak memory (with its
// children's). And memgate started as CI starts it, in the background (Started, Memgate), and the processes a probe
// left (probe_processes). Needs no LibTorch.
#pragma once

#include "test_util.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace memgate::testing {

struct Spawned {
  int exit_code = -1;       ///< -1: it did not start, or a signal ended it
  std::string output;       ///< stdout and stderr together
  double seconds = 0;       ///< wall time
  long peak_rss_kib = 0;    ///< the largest resident set of it and its children (wait4's ru_maxrss)
};

/// Runs `argv` (argv[0] looked up on PATH; through python3, which measures its peak memory) in `dir` (empty: here),
/// with `env` set (a value of std::nullopt unsets the variable), stdout and stderr into one file that is read back.
inline Spawned spawn(const std::vector<std::string>& argv, const std::string& dir = {},
                     const std::map<std::string, std::optional<std::string>>& env = {}) {
  Spawned result;
  TempDir scratch;
  const auto out_path = scratch / "output";
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const auto name = entry.substr(0, entry.find('='));
    if (env.find(name) == env.end()) environment.push_back(entry);
  }
  for (const auto& [name, value] : env) {
    if (value) environment.push_back(name + "=" + *value);
  }
  // The peak memory is measured by a small Python that forks and runs `argv`: a child that this process spawned would
  // count this process's own memory (a spawned child shares it until exec, and exec keeps its high-water mark).
  const auto rusage_path = scratch / "maxrss";
  std::vector<std::string> wrapped{
      "python3", "-c",
      "import os, sys\n"
      "pid = os.fork()\n"
      "if pid == 0:\n"
      "    try:\n"
      "        os.execvp(sys.argv[2], sys.argv[2:])\n"
      "    finally:\n"
      "        os._exit(127)\n"
      "_, status, usage = os.wait4(pid, 0)\n"
      "open(sys.argv[1], 'w').write(str(usage.ru_maxrss))\n"
      "os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 255)\n",
      rusage_path};
  wrapped.insert(wrapped.end(), argv.begin(), argv.end());
  std::vector<char*> args;
  for (const auto& a : wrapped) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : environment) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  if (!dir.empty()) posix_spawn_file_actions_addchdir_np(&actions, dir.c_str());
  const auto start = std::chrono::steady_clock::now();
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    result.output = std::string("could not start ") + argv[0] + ": " + std::strerror(rc);
    return result;
  }
  int status = 0;
  struct rusage usage {};
  while (::wait4(pid, &status, 0, &usage) < 0 && errno == EINTR) {
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.exit_code = WIFEXITED(status) && WEXITSTATUS(status) != 255 ? WEXITSTATUS(status) : -1;
  const auto maxrss = read_file(rusage_path);
  result.peak_rss_kib = maxrss.empty() ? usage.ru_maxrss : std::stol(maxrss);
  result.output = read_file(out_path);
  return result;
}

/// How a process that Started started ended: its wait status (waitpid's), what it printed, its wall time.
struct Outcome {
  int status = 0;
  std::string output;
  double seconds = 0;
};

/// Its exit code, or -1 where a signal ended it.
inline int exit_code(const Outcome& o) { return WIFEXITED(o.status) ? WEXITSTATUS(o.status) : -1; }

/// `program args` (a shell's words: the tests' own arguments) started as CI starts memgate, in `cwd`: a process group
/// of its own, every signal at its default disposition and none blocked, this process's environment with `env` added,
/// its stdout and stderr into `log`; killed with its group if the test ends first.
class Started {
 public:
  Started(const std::string& program, const std::string& args, const std::vector<std::string>& env, std::string log,
          const std::string& cwd = ".")
      : name_(std::filesystem::path(program).filename().string()), log_(std::move(log)) {
    std::vector<std::string> argv{"/bin/sh", "-c", "cd '" + cwd + "' && exec " + program + " " + args + " > '" + log_ +
                                                       "' 2>&1"};
    std::vector<std::string> envs;
    for (char** e = environ; *e != nullptr; ++e) envs.emplace_back(*e);
    envs.insert(envs.end(), env.begin(), env.end());
    std::vector<char*> a, e;
    for (auto& s : argv) a.push_back(s.data());
    a.push_back(nullptr);
    for (auto& s : envs) e.push_back(s.data());
    e.push_back(nullptr);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t all, none;
    sigfillset(&all);
    sigemptyset(&none);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP);
    start_ = std::chrono::steady_clock::now();
    EXPECT_EQ(posix_spawn(&pid_, a[0], nullptr, &attr, a.data(), e.data()), 0);
    posix_spawnattr_destroy(&attr);
  }
  ~Started() {
    if (pid_ > 0) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Started(const Started&) = delete;
  Started& operator=(const Started&) = delete;
  [[nodiscard]] pid_t pid() const { return pid_; }
  /// Its outcome once it has ended (or, past `limit`, once it is killed as hung), else nothing yet.
  std::optional<Outcome> poll(std::chrono::seconds limit) {
    Outcome o;
    if (::waitpid(pid_, &o.status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() - start_ <= limit) return std::nullopt;
      ADD_FAILURE() << name_ << " still running after " << limit.count() << " s: it hangs";
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, &o.status, 0);
    }
    pid_ = -1;
    o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    o.output = read_file(log_);
    return o;
  }
  /// Waits at most `limit` (then kills it: a hang, which the test reports).
  Outcome wait(std::chrono::seconds limit) {
    for (;;) {
      if (auto o = poll(limit)) return *o;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

 private:
  std::string name_;
  std::string log_;
  pid_t pid_ = -1;
  std::chrono::steady_clock::time_point start_;
};

#ifdef MEMGATE_CLI
/// memgate (the build's command, MEMGATE_CLI) started as CI starts it (Started), its output in <out>/memgate.log.
class Memgate : public Started {
 public:
  Memgate(const std::string& args, const std::vector<std::string>& env, const TempDir& out,
          const std::string& cwd = ".")
      : Started(MEMGATE_CLI, args, env, out / "memgate.log", cwd) {}
};
#endif

/// The processes for which `pick(its /proc folder, its command line)` holds.
template <typename Pick>
std::vector<pid_t> processes_where(Pick pick) {
  std::vector<pid_t> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const auto name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline", std::ios::binary);
    const std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (pick(entry.path(), cmdline)) out.push_back(std::stoi(name));
  }
  return out;
}

/// A probe's processes: those whose command line names `dir` (a rank's store and result files are in the probe's
/// folder there), or whose output is a log there (a process forked from a fork server has the server's command line).
inline std::vector<pid_t> probe_processes(const std::string& dir) {
  return processes_where([&](const std::filesystem::path& proc, const std::string& cmdline) {
    std::error_code ec;
    const auto output = std::filesystem::read_symlink(proc / "fd" / "1", ec).string();
    return (cmdline.find(dir) != std::string::npos && cmdline.find("--memgate-rank") != std::string::npos) ||
           (!ec && output.starts_with(dir + "/"));
  });
}

}  // namespace memgate::testing
