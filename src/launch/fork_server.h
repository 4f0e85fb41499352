// Python probes forked from a warm Python (python/memgate/_forkserver.py): one per Python and environment in this
// process, started on its first Python probe, so that each later probe pays no import of torch or of the packages
// the earlier ones imported. Each probe is still a process of its own, started fresh from that Python.
#pragma once

#include <sys/types.h>

#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace memgate {

class PythonForkServer {
 public:
  /// The server for `python` with `env` (its probes' environment), started now if this process has none; nullptr
  /// where it cannot run (that Python has no torch, or another torch, or MEMGATE_PYTHON_FORK_SERVER=0): the probes
  /// are then started directly, with the errors they give.
  [[nodiscard]] static PythonForkServer* of(const std::string& python, const std::vector<std::string>& env);

  ~PythonForkServer();
  PythonForkServer(const PythonForkServer&) = delete;
  PythonForkServer& operator=(const PythonForkServer&) = delete;

  /// The server's process: its probes' parent (the pid they end with).
  [[nodiscard]] pid_t pid() const { return pid_; }

  /// Forks `argv` (python -m memgate ...) with `env`, its output into `log`; nothing where the server cannot
  /// (start it directly then).
  [[nodiscard]] std::optional<pid_t> spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                                           const std::string& log);

  /// A forked probe's wait status once it has ended (it is then reaped), else nothing; `block`: until it ends.
  [[nodiscard]] std::optional<int> status(pid_t probe, bool block);

 private:
  PythonForkServer(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  // The next message (a JSON line), waiting at most `timeout_ms` (-1: for ever); nothing when none came or the
  // server has gone (then `gone_`).
  std::optional<std::string> read_line(int timeout_ms);
  void take(const std::string& line);
  pid_t pid_;
  int fd_;
  bool gone_ = false;
  std::string buffer_;
  std::optional<std::string> reply_;
  std::map<pid_t, int> exited_;
  std::set<pid_t> forked_;
  std::mutex mutex_;
};

}  // namespace memgate
