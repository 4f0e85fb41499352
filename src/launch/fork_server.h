// A probe's processes forked from a warm one: a rank program's (`<program> --memgate-fork-server`, gate's
// fork_server_main.cpp), whose ranks then pay neither an exec nor LibTorch's loading, or a Python's
// (python/memgate/_forkserver.py), whose probes pay no import of torch or of the packages the earlier ones imported.
// One per command and environment in this process, started on its first probe. Each probe is still a process of its
// own, started fresh from that server.
#pragma once

#include <sys/types.h>

#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace memgate {

class ForkServer {
 public:
  /// The server that `start` starts (with this process's pid added) with `env` (its probes' environment), started
  /// now if this process has none; nullptr where it cannot run (a Python without torch or with another torch, CUDA's
  /// driver loaded, MEMGATE_FORK_SERVER=0): the probes are then started directly, with the errors they give.
  [[nodiscard]] static ForkServer* of(const std::vector<std::string>& start, const std::vector<std::string>& env);

  ~ForkServer();
  ForkServer(const ForkServer&) = delete;
  ForkServer& operator=(const ForkServer&) = delete;

  /// The server's process: its probes' parent (the pid they end with).
  [[nodiscard]] pid_t pid() const { return pid_; }

  /// Forks `argv` (`<program> --memgate-rank ...`, `python -m memgate ...`) with `env`, its output into `log`;
  /// nothing where the server cannot (start it directly then). `scan`: a Python model's code (`file:callable`), whose
  /// imports of installed packages a Python server makes first, if it has not yet: its probe then finds them made.
  [[nodiscard]] std::optional<pid_t> spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                                           const std::string& log, const std::vector<std::string>& scan = {});

  /// A forked probe's wait status once it has ended (it is then reaped), else nothing; `block`: until it ends.
  [[nodiscard]] std::optional<int> status(pid_t probe, bool block);

 private:
  ForkServer(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  // The next message (a JSON line), waiting at most `timeout_ms` (-1: for ever); nothing when none came or the
  // server has gone (then `gone_`).
  std::optional<std::string> read_line(int timeout_ms);
  void take(const std::string& line);
  pid_t pid_;
  int fd_;
  bool gone_ = false;
  std::string buffer_;
  std::optional<pid_t> reply_;  ///< the answer to a spawn: the forked pid, or -1 (an error)
  std::map<pid_t, int> exited_;
  std::set<pid_t> forked_;
  std::mutex mutex_;
};

}  // namespace memgate
