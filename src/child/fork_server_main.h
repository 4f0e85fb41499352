// A rank program's fork server (`<program> --memgate-fork-server PARENT_PID`): launch/fork_server.h starts it.
#pragma once

namespace memgate {

/// Whether this process was started as a fork server (its first argument is --memgate-fork-server).
[[nodiscard]] bool is_fork_server_command(int argc, char** argv);

/// Serves memgate's requests on descriptor 3 until memgate closes it: each a rank forked from this process.
int fork_server_main(int argc, char** argv);

}  // namespace memgate
