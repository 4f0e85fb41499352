// Running a program from a test without a shell (its arguments are what they are: quotes, `$(...)`, newlines), in a
// folder, with changes to its environment; what it printed, how it ended, its wall time and its peak memory (with its
// children's). Needs no LibTorch.
#pragma once

#include "test_util.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

extern char** environ;

namespace memgate::testing {

struct Spawned {
  int exit_code = -1;       ///< -1: it did not start, or a signal ended it
  std::string output;       ///< stdout and stderr together
  double seconds = 0;       ///< wall time
  long peak_rss_kib = 0;    ///< the largest resident set of it and its children (wait4's ru_maxrss)
};

/// Runs `argv` (argv[0] looked up on PATH; through python3, which measures its peak memory) in `dir` (empty: here), with `env` set (a value of std::nullopt unsets
/// the variable), stdout and stderr into one file that is read back.
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

}  // namespace memgate::testing
