// A probe's processes forked from a warm one: memgate's side of the protocol (python/memgate/_forkserver.py).
#include "fork_server.h"

#include "children.h"

#include "memgate/base/process.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string_view>

namespace memgate {

namespace {

// How long the server may take to answer: its start imports torch and memgate's extension, and before a spawn it
// may be importing the packages the last probe imported (seconds each on a busy machine).
constexpr int kAnswerMs = 300'000;

void end_process(pid_t pid) {
  ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
}

// One server per command and environment; nullptr where one could not start (it is not tried again). Static
// destructors end them as memgate ends, and so does exit_fast (base/process.h), which runs none: at_quick_exit.
struct Registry {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<ForkServer>> servers;
};

Registry& registry() {
  static Registry r;
  static const bool at_quick_exit = [] {
    std::at_quick_exit([] {
      // A thread of this process could be starting a server as it ends: then the lock is not taken (that server
      // ends with it: PR_SET_PDEATHSIG).
      std::unique_lock lock(r.mutex, std::try_to_lock);
      if (lock.owns_lock()) r.servers.clear();
    });
    return true;
  }();
  (void)at_quick_exit;
  return r;
}

}  // namespace

ForkServer* ForkServer::of(const std::vector<std::string>& start, const std::vector<std::string>& env) {
  if (const char* off = std::getenv("MEMGATE_FORK_SERVER"); off != nullptr && std::string_view(off) == "0") {
    return nullptr;
  }
  auto& [mutex, servers] = registry();
  std::lock_guard lock(mutex);
  std::string key;
  for (const auto& a : start) key += a + '\n';
  for (const auto& e : env) key += '\n' + e;
  if (const auto it = servers.find(key); it != servers.end()) {
    return it->second && !it->second->gone_ ? it->second.get() : nullptr;
  }
  auto& slot = servers[key];

  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return nullptr;
  // Its end of the socket becomes its descriptor 3 (dup2 onto itself would keep close-on-exec).
  if (fds[1] == 3) {
    const int moved = ::fcntl(fds[1], F_DUPFD_CLOEXEC, 10);
    ::close(fds[1]);
    fds[1] = moved;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 3);
  // What its imports print (warnings) goes nowhere: each probe writes to its own log.
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  auto argv = start;
  argv.push_back(std::to_string(::getpid()));
  const pid_t pid = spawn_process(argv, env, actions);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (pid < 0) {
    ::close(fds[0]);
    return nullptr;
  }
  std::unique_ptr<ForkServer> server(new ForkServer(pid, fds[0]));
  // Ready, or an error (no torch, another torch, no extension, CUDA's driver loaded): then none, and the probes start
  // directly.
  const auto first = server->read_line(kAnswerMs);
  const auto message = first ? nlohmann::json::parse(*first, nullptr, false) : nlohmann::json();
  if (!message.is_object() || !message.contains("ready")) return nullptr;  // its destructor ends it
  slot = std::move(server);
  return slot.get();
}

ForkServer::~ForkServer() {
  // Its probes have ended (each Children reaps its own); it may be importing what the last one imported, for a
  // probe that will not come: it is ended now rather than waited for.
  ::close(fd_);
  end_process(pid_);
}

std::optional<std::string> ForkServer::read_line(int timeout_ms) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
  for (;;) {
    if (const auto at = buffer_.find('\n'); at != std::string::npos) {
      auto line = buffer_.substr(0, at);
      buffer_.erase(0, at + 1);
      return line;
    }
    if (gone_) return std::nullopt;
    int wait_ms = -1;  // for ever
    if (timeout_ms >= 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      wait_ms = static_cast<int>(std::max<std::int64_t>(left, 0));
    }
    pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
    const int n = ::poll(&p, 1, wait_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;
    char chunk[4096];
    const auto got = ::recv(fd_, chunk, sizeof chunk, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      gone_ = true;
      return std::nullopt;
    }
    buffer_.append(chunk, static_cast<std::size_t>(got));
  }
}

void ForkServer::take(const std::string& line) {
  const auto message = nlohmann::json::parse(line, nullptr, false);
  if (message.is_object() && message.contains("exit")) {
    exited_[message.at("exit").get<pid_t>()] = message.at("status").get<int>();
  } else {
    reply_ = message.is_object() && message.contains("pid") ? message.at("pid").get<pid_t>() : -1;
  }
}

std::optional<pid_t> ForkServer::spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                                             const std::string& log, const std::vector<std::string>& scan) {
  std::lock_guard lock(mutex_);
  if (gone_) return std::nullopt;
  std::error_code ec;
  nlohmann::json request{
      {"spawn", {{"argv", argv}, {"env", env}, {"cwd", std::filesystem::current_path(ec).string()}, {"log", log}}}};
  if (!scan.empty()) request["spawn"]["scan"] = scan;
  if (ec || !send_line(fd_, request)) return std::nullopt;
  reply_.reset();
  while (!reply_) {
    const auto line = read_line(kAnswerMs);
    if (!line) {
      // No answer: a server that hangs is ended, and this and later probes start directly.
      gone_ = true;
      return std::nullopt;
    }
    take(*line);
  }
  if (*reply_ < 0) return std::nullopt;
  forked_.insert(*reply_);
  return reply_;
}

std::optional<int> ForkServer::status(pid_t probe, bool block) {
  std::lock_guard lock(mutex_);
  for (;;) {
    if (const auto it = exited_.find(probe); it != exited_.end()) {
      const int status = it->second;
      exited_.erase(it);
      forked_.erase(probe);
      send_line(fd_, {{"reap", probe}});
      return status;
    }
    if (gone_) {
      // The server ended first: its probes were sent SIGTERM (they end with it), and their statuses went with it.
      if (forked_.erase(probe) == 0) return std::nullopt;
      return SIGTERM;  // a wait status: killed by SIGTERM
    }
    if (const auto line = read_line(block ? -1 : 0)) {
      take(*line);
    } else if (!gone_ && !block) {
      return std::nullopt;
    }
  }
}

}  // namespace memgate
