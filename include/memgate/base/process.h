// Running a shell command and reading what it prints.
#pragma once

#include <string>

namespace memgate {

/// What a shell command printed and how it ended.
struct CommandResult {
  int exit_code = -1;  ///< its exit status; -1 when it could not start or was killed by a signal
  std::string output;  ///< what it printed on stdout
};

/// Runs `command` with /bin/sh and collects its standard output (add `2>&1` to the command for stderr too).
[[nodiscard]] CommandResult run_command(const std::string& command);

}  // namespace memgate
