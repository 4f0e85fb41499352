// The processes of one probe (a distributed probe's ranks, or a Python fixture's probe process): started into a
// folder of the probe's own, each in a process group of its own, watched through the progress their heartbeats
// report, and ended together (each with its group: what the model's code started too) however the probe ends.
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
  /// The file it writes last when it succeeds (its result): a child that exits with 0 and has not written it failed.
  std::string result;
  /// Said when it exits with 0 without its result, after the likely causes (a local memgate.py found, say).
  std::string no_result_note;
};

/// The processes of one probe, each started in a process group of its own (its pid): ending a child ends its group,
/// so that the processes the model's code started (a builder's subprocess) end with it; a child's group is ended
/// too once the child has ended. While it lives, SIGINT, SIGTERM and SIGHUP are deferred: wait() then ends every
/// child, removes the run folder and ends this process by the signal. Its destructor ends (SIGKILL) and reaps any
/// child still running, so that a probe that throws leaves none behind.
class Children {
 public:
  /// `timeout`: how long a child may make no progress (its heartbeat's progress counter, which its work advances,
  /// not its beat count, which a thread advances whatever the work does) before it is taken as hung or stopped and
  /// the probe ended; a child that has not yet written a heartbeat gets the timeout or a minute, whichever is longer,
  /// to start (loading LibTorch, a Python's imports).
  Children(RunDir& dir, std::chrono::seconds timeout);
  ~Children();
  Children(const Children&) = delete;
  Children& operator=(const Children&) = delete;

  /// Starts a child; a child that cannot start is an error naming it and the cause (the children started before
  /// are ended by the destructor).
  void start(const ChildSpec& spec);

  /// Waits until every child has ended. The first to fail (a status other than 0, a signal, an exit with 0 without
  /// its result, or no progress for the timeout: the one stuck longest) ends the others: its description is
  /// returned, with the cause its log names and the other children that had made no progress meanwhile. Nothing
  /// when every child exited with 0 and wrote its result.
  [[nodiscard]] std::optional<std::string> wait();

 private:
  using Clock = std::chrono::steady_clock;
  struct Child {
    ChildSpec spec;
    pid_t pid = -1;
    pid_t group = -1;                 ///< its own process group (its pid), or -1 where it has none
    ForkServer* forked_by = nullptr;  ///< its parent, when not this process
    bool running = false;
    int status = 0;
    bool no_result = false;           ///< exited with 0 without writing spec.result
    Clock::time_point last_beat;      ///< or its start, before its first heartbeat
    Clock::time_point last_progress;  ///< or its start, before its first heartbeat
    std::optional<std::uint64_t> beats;
    std::optional<std::uint64_t> progress;
    std::string activity;
  };
  [[nodiscard]] static bool succeeded(const Child& c);
  /// Whether `c` has ended (its status then in c.status, and no longer running; what is left of its process group
  /// killed); `block`: waits until it has.
  static bool reap(Child& c, bool block);
  /// Sends `signal` to `c`'s process group (to `c` alone where it has none).
  static void signal_child(const Child& c, int signal);
  /// Reads `c`'s heartbeat at `now`.
  static void observe(Child& c, Clock::time_point now);
  [[nodiscard]] std::chrono::milliseconds allowance(const Child& c) const;
  [[nodiscard]] std::string end_after_failure(Clock::time_point now);
  [[nodiscard]] std::string end_stuck(Child& c, Clock::time_point now);
  [[nodiscard]] Child* culprit(Clock::time_point now);
  void end_all(int signal);
  void reap_all(std::chrono::milliseconds grace);
  [[nodiscard]] std::string silent_ones(Clock::time_point now, const Child* except) const;
  SignalDeferral deferral_;
  RunDir& dir_;
  std::chrono::seconds timeout_;
  std::vector<Child> children_;
};

/// Starts `argv` with `env` and the descriptors `actions` arranges, the signals this process handles (SIGINT,
/// SIGTERM, SIGHUP) at their defaults and none blocked, in a process group of its own with `own_group` (else in
/// this process's): its pid, or posix_spawn's error number (negated).
[[nodiscard]] pid_t spawn_process(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                                  const posix_spawn_file_actions_t& actions, bool own_group = false);

/// What a child process said went wrong: the line where memgate's rank main names the error, else the end of its
/// log without C++ stack frames.
[[nodiscard]] std::string cause_in_log(const std::string& log);

}  // namespace memgate
