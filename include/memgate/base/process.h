// Running a program (never through a shell) and reading what it prints; a JSON line to another process; ending this process quickly.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <vector>

namespace memgate {

/// What a program printed and how it ended.
struct CommandResult {
  int exit_code = -1;  ///< its exit status; -1 when it could not start or was killed by a signal
  std::string output;  ///< what it printed on stdout
};

/// Runs the program `argv[0]` (looked up on PATH unless it holds a '/') with the arguments `argv`, as they are: no
/// shell reads them, so a quote, `$(...)`, a space or a newline in an argument is that character. Its standard output
/// is collected; its standard input and error are /dev/null. exit_code is -1 when it could not start (no such
/// program) or a signal ended it.
[[nodiscard]] CommandResult run_program(const std::vector<std::string>& argv);

/// Sends `message` as one line of JSON (its text and a newline) on the socket `fd`, all of it (a peer that has gone is
/// an error, not SIGPIPE): the fork servers' protocol (launch/fork_server.h). False where it could not.
bool send_line(int fd, const nlohmann::json& message);

/// Ends this process with `code`, as returning it from main would for what it printed (stdio and iostreams are
/// flushed) and with the std::at_quick_exit handlers run (memgate's fork servers end there), but without the
/// destructors of static objects. LibTorch's unregister every operator and kernel it registered at start: a third of
/// a LibTorch process's 0.45 s when it does nothing else (measured: 0.44 s, 0.31 s without them). Call it from main
/// only, once everything of the process's own is closed: files, temporary folders, child processes. (What writes
/// only from a static destructor or std::atexit, gcov's coverage counters say, writes nothing.)
[[noreturn]] void exit_fast(int code);

}  // namespace memgate
