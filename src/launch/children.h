// The processes of one probe (a distributed probe's ranks, or a Python fixture's probe process): started into a
// folder of the probe's own, watched through their heartbeats, and ended together however the probe ends.
#pragma once

#include "memgate/base/signals.h"

#include <spawn.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace memgate {

/// A fresh folder for one probe's files (its store, each process's result, log and heartbeat), made exclusively
/// (mkdtemp) under the temporary directory (TMPDIR, else /tmp), so that no two probes share one, whatever process,
/// container or run they are in; removed with everything in it when the probe ends. A temporary directory that is
/// missing, not a directory, not writable, read-only or full is an error that says which.
class RunDir {
 public:
  RunDir();
  ~RunDir();
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  /// Removes the folder now (the destructor then has nothing to do).
  void remove();

 private:
  std::filesystem::path path_;
};

class ForkServer;

/// One process to start: what it is called in messages ("rank 1 of 4"), its command and environment, and the files
/// it writes its output and its heartbeat to. The command is a rank's (rank_main's arguments): Children adds
/// `--parent-pid P`, P the process it ends with (this one, or the fork server that forks it).
struct ChildSpec {
  std::string name;
  std::vector<std::string> argv;
  std::vector<std::string> env;
  std::string log;
  std::string heartbeat;
  /// Forked from this server when it can (launch/fork_server.h), else started directly.
  ForkServer* server = nullptr;
  /// The model's Python code (`file:callable`), whose installed packages a Python server imports before it forks it.
  std::vector<std::string> scan;
};

/// The processes of one probe. While it lives, SIGINT, SIGTERM and SIGHUP are deferred: wait() then ends every
/// child, removes the run folder and ends this process by the signal. Its destructor ends (SIGKILL) and reaps any
/// child still running, so that a probe that throws leaves none behind.
class Children {
 public:
  /// `timeout`: how long a child may go without a heartbeat before it is taken as stopped (hung, stopped,
  /// swapped out) and the probe ended; a child that has not yet written one gets at least a minute to start.
  Children(RunDir& dir, std::chrono::seconds timeout);
  ~Children();
  Children(const Children&) = delete;
  Children& operator=(const Children&) = delete;

  /// Starts a child; a child that cannot start is an error naming it and the cause (the children started before
  /// are ended by the destructor).
  void start(const ChildSpec& spec);

  /// Waits until every child has ended. The first to fail (a status other than 0, a signal, or no heartbeat for
  /// the timeout) ends the others: its description is returned, with the cause its log names and the other
  /// children that had stopped answering. Nothing when every child exited with 0.
  [[nodiscard]] std::optional<std::string> wait();

 private:
  struct Child {
    ChildSpec spec;
    pid_t pid = -1;
    ForkServer* forked_by = nullptr;  ///< its parent, when not this process
    bool running = false;
    int status = 0;
    std::chrono::steady_clock::time_point last_beat;  ///< or its start, before its first heartbeat
    std::optional<std::uint64_t> beats;
    std::string activity;
  };
  [[nodiscard]] static bool succeeded(const Child& c);
  /// Whether `c` has ended (its status then in c.status, and no longer running); `block`: waits until it has.
  static bool reap(Child& c, bool block);
  [[nodiscard]] std::string end_after_failure(std::chrono::steady_clock::time_point now);
  void end_all(int signal);
  void reap_all(std::chrono::milliseconds grace);
  [[nodiscard]] std::string silent_ones(std::chrono::steady_clock::time_point now, const Child* except) const;
  SignalDeferral deferral_;
  RunDir& dir_;
  std::chrono::seconds timeout_;
  std::vector<Child> children_;
};

/// Starts `argv` with `env` and the descriptors `actions` arranges, the signals this process handles (SIGINT,
/// SIGTERM, SIGHUP) at their defaults and none blocked: its pid, or posix_spawn's error number (negated).
[[nodiscard]] pid_t spawn_process(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                                  const posix_spawn_file_actions_t& actions);

/// What a child process said went wrong: the line where memgate's rank main names the error, else the end of its
/// log without C++ stack frames.
[[nodiscard]] std::string cause_in_log(const std::string& log);

}  // namespace memgate
