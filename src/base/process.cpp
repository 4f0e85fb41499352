// run_command: popen, read to the end, pclose. send_line: send until all is sent. exit_fast: flush, then
// std::quick_exit.
#include "memgate/base/process.h"

#include <nlohmann/json.hpp>

#include <sys/socket.h>
#include <sys/wait.h>

#include <cerrno>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <iostream>

namespace memgate {

CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe) != nullptr) result.output += buffer.data();
  const int status = ::pclose(pipe);
  result.exit_code = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

bool send_line(int fd, const nlohmann::json& message) {
  const auto text = message.dump() + "\n";
  std::size_t sent = 0;
  while (sent < text.size()) {
    const auto n = ::send(fd, text.data() + sent, text.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<std::size_t>(n);
  }
  return true;
}

void exit_fast(int code) {
  std::cout.flush();
  std::cerr.flush();
  std::clog.flush();
  std::fflush(nullptr);
  std::quick_exit(code);
}

}  // namespace memgate
