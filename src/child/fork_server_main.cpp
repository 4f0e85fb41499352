// `<rank program> --memgate-fork-server PARENT_PID`: the warm process a probe's C++ ranks are forked from, the
// counterpart of python/memgate/_forkserver.py for the zoo's fixtures (the protocol is written there). LibTorch is
// loaded once, by this process; each rank is a fork of it that runs rank_main as `<rank program> --memgate-rank ...`
// would, so that it pays neither the exec nor LibTorch's 0.4 s of loading, in a process group of its own as a rank
// started directly is. The process runs no operator, so it has
// no intra-op thread pool for a fork to copy.
#include "fork_server_main.h"

#include "memgate/base/process.h"
#include "memgate/child/rank.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

namespace memgate {
namespace {

constexpr int kSocket = 3;

// Whether CUDA's driver is loaded in this process: a process forked after that cannot use CUDA.
bool cuda_driver_loaded() {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find("libcuda.so") != std::string::npos) return true;
  }
  return false;
}

// The forked rank: as `<program> --memgate-rank ...` started with `env` in `cwd`, its output into `log`.
[[noreturn]] void run_rank(const nlohmann::json& request) {
  // A process group of its own, as memgate starts a rank directly: memgate ends the group (the rank, and whatever it
  // started). The server sets it too, before it answers, so that memgate finds it set.
  ::setpgid(0, 0);
  ::close(kSocket);
  const int log = ::open(request.at("log").get<std::string>().c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (log >= 0) {
    ::dup2(log, STDOUT_FILENO);
    ::dup2(log, STDERR_FILENO);
    ::close(log);
  }
  if (::chdir(request.at("cwd").get<std::string>().c_str()) != 0) std::_Exit(3);
  ::clearenv();
  for (const auto& entry : request.at("env")) {
    const auto text = entry.get<std::string>();
    if (const auto at = text.find('='); at != std::string::npos) {
      ::setenv(text.substr(0, at).c_str(), text.substr(at + 1).c_str(), 1);
    }
  }
  // As memgate starts a rank directly (launch/children.cpp): these three at their defaults, none blocked; the others
  // as this process has them, inherited from memgate as a rank started directly inherits them.
  for (const int s : {SIGINT, SIGTERM, SIGHUP}) ::signal(s, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  auto argv = request.at("argv").get<std::vector<std::string>>();
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const int code = rank_main(static_cast<int>(argv.size()), args.data());
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  // As a rank process ends, without the destructors of this process's statics (LibTorch's), which the server owns.
  std::_Exit(code);
}

}  // namespace

bool is_fork_server_command(int argc, char** argv) {
  return argc > 1 && std::string(argv[1]) == "--memgate-fork-server";
}

int fork_server_main(int argc, char** argv) {
  // Ends with the memgate that started it, however that ends; one already gone ends this at once.
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (argc < 3 || ::getppid() != static_cast<pid_t>(std::atoll(argv[2]))) return 3;
  // Ctrl-C reaches the whole process group: memgate ends its ranks itself, and then closes this.
  ::signal(SIGINT, SIG_IGN);
  if (cuda_driver_loaded()) {
    send_line(kSocket, {{"error", "CUDA's driver is loaded: a forked process could not use it"}});
    return 3;
  }
  if (!send_line(kSocket, {{"ready", ::getpid()}})) return 3;
  std::map<pid_t, bool> children;  // pid -> its end reported
  std::string buffer;
  for (;;) {
    pollfd p{.fd = kSocket, .events = POLLIN, .revents = 0};
    const int n = ::poll(&p, 1, 20);
    if (n < 0 && errno != EINTR) return 3;
    for (auto& [pid, reported] : children) {
      if (reported) continue;
      siginfo_t info{};
      if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != pid) {
        continue;
      }
      const int status = info.si_code == CLD_EXITED ? (info.si_status & 0xFF) << 8
                                                    : info.si_status | (info.si_code == CLD_DUMPED ? 0x80 : 0);
      reported = true;
      send_line(kSocket, {{"exit", pid}, {"status", status}});
    }
    if (n <= 0) continue;
    char chunk[4096];
    const auto got = ::recv(kSocket, chunk, sizeof chunk, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return 0;  // memgate closed it
    buffer.append(chunk, static_cast<std::size_t>(got));
    for (auto at = buffer.find('\n'); at != std::string::npos; at = buffer.find('\n')) {
      const auto message = nlohmann::json::parse(buffer.substr(0, at), nullptr, false);
      buffer.erase(0, at + 1);
      if (!message.is_object()) continue;
      if (message.contains("spawn")) {
        const auto& request = message.at("spawn");
        const auto argv_of = request.at("argv");
        if (argv_of.size() < 2 || argv_of.at(1) != "--memgate-rank") {
          send_line(kSocket,
                    {{"error", "not a rank: " + argv_of.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)}});
          continue;
        }
        const pid_t pid = ::fork();
        if (pid == 0) run_rank(request);
        if (pid < 0) {
          send_line(kSocket, {{"error", std::string("cannot fork: ") + std::strerror(errno)}});
          continue;
        }
        ::setpgid(pid, pid);  // as the rank does itself: whichever runs first
        children[pid] = false;
        send_line(kSocket, {{"pid", pid}});
      } else if (message.contains("reap")) {
        const auto pid = message.at("reap").get<pid_t>();
        if (children.erase(pid) > 0) {
          int status = 0;
          while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
          }
        }
      }
    }
  }
}

}  // namespace memgate
