// How memgate's processes end on SIGINT, SIGTERM and SIGHUP: their temporary files removed, a probe's child processes
// ended first, and a rank whose parent died gone with its files.
#pragma once

#include <string>

#include <sys/types.h>

namespace memgate {

/// Installs memgate's handler for SIGINT, SIGTERM and SIGHUP, once: where a signal's disposition is still the default
/// (a host program's own handler stays), or over any other handler with `force` (memgate's own child processes).
/// The handler removes the temporary files registered below and ends the process as the signal would have, unless a
/// SignalDeferral lives: then it only records the signal, for the code that holds the deferral to end its work first.
void install_signal_handlers(bool force = false);

/// Registers a file that must not outlive the process (a temporary file); returns its slot, -1 when there is none
/// free (or the path is too long): it is then removed by its owner only.
[[nodiscard]] int register_temporary_file(const std::string& path);
void unregister_temporary_file(int slot);

/// While one lives (on any thread), SIGINT, SIGTERM and SIGHUP are recorded rather than acted on: a supervisor of
/// child processes polls pending_signal(), ends its children, removes its files and calls end_by_signal.
class SignalDeferral {
 public:
  SignalDeferral();
  ~SignalDeferral();
  SignalDeferral(const SignalDeferral&) = delete;
  SignalDeferral& operator=(const SignalDeferral&) = delete;
};

/// The signal recorded under a SignalDeferral, or 0.
[[nodiscard]] int pending_signal();

/// Removes the registered temporary files and ends this process by `signal` (its default action: the status a
/// shell or CI runner sees is the signal's).
[[noreturn]] void end_by_signal(int signal);

/// For a child process that `parent` started for one job, in the folder `folder` of that job: when the parent dies,
/// however it dies (SIGKILL included), this process gets SIGTERM (PR_SET_PDEATHSIG), removes the files of `folder`
/// and the folder (nothing else would: its parent is gone) and ends, with its process group where it leads one (what
/// the model's code started: launch/children.h starts each probe process in a group of its own). Returns false when the parent is already gone
/// (the caller should end at once); the folder is then removed already.
[[nodiscard]] bool end_with_parent(pid_t parent, const std::string& folder);

}  // namespace memgate
