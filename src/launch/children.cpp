// A probe's child processes: its run folder, starting them, watching their heartbeats and ending them together.
#include "children.h"

#include "fork_server.h"
#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/base/heartbeat.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

namespace memgate {

namespace {

// The free space a probe's folder needs at least: its store, logs, results and heartbeats take kilobytes; memory
// snapshots, when asked for, more (their writes then fail with a message of their own).
constexpr std::uintmax_t kMinFreeBytes = std::uintmax_t{1} << 20;

// How often the supervisor looks at its children, and how long a child that was told to end (SIGTERM) has before
// it is killed.
constexpr std::chrono::milliseconds kPoll{50};
constexpr std::chrono::milliseconds kGrace{3000};

// A heartbeat missing for this long says a child has stopped answering, when it is less than the timeout: named as
// the likely cause when another child fails meanwhile (its peers, waiting on it in a collective).
constexpr std::chrono::milliseconds kSilent{2000};

std::string temporary_directory() {
  for (const char* name : {"TMPDIR", "TMP", "TEMP", "TEMPDIR"}) {
    if (const char* value = std::getenv(name); value != nullptr && *value != '\0') return value;
  }
  return "/tmp";
}

std::string where_tmp(const std::string& dir) {
  const char* env = std::getenv("TMPDIR");
  return env != nullptr && *env != '\0' && dir == env ? fmt::format("the temporary directory TMPDIR={}", dir)
                                                      : fmt::format("the temporary directory {}", dir);
}

std::filesystem::path make_run_dir() {
  const auto tmp = temporary_directory();
  const auto what = where_tmp(tmp);
  const char* purpose = "a probe in processes of its own keeps its store, results and logs there";
  struct stat st {};
  if (::stat(tmp.c_str(), &st) != 0) {
    throw Error(fmt::format("{} {}: {} (set TMPDIR to a writable directory)", what,
                            errno == ENOENT ? "does not exist" : std::strerror(errno), purpose));
  }
  if (!S_ISDIR(st.st_mode)) {
    throw Error(fmt::format("{} is not a directory: {} (set TMPDIR to a writable directory)", what, purpose));
  }
  std::string pattern = (std::filesystem::path(tmp) / "memgate-probe-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    const int e = errno;
    const char* why = e == EROFS                   ? "is read-only"
                      : e == EACCES || e == EPERM  ? "is not writable"
                      : e == ENOSPC || e == EDQUOT ? "is full"
                                                   : nullptr;
    throw Error(fmt::format("{} {}: cannot make a folder there ({}): {} (set TMPDIR to a writable directory)", what,
                            why != nullptr ? why : "refused", std::strerror(e), purpose));
  }
  struct statvfs vfs {};
  if (::statvfs(pattern.c_str(), &vfs) == 0) {
    const auto free = static_cast<std::uintmax_t>(vfs.f_bavail) * vfs.f_frsize;
    if (free < kMinFreeBytes) {
      ::rmdir(pattern.c_str());
      throw Error(fmt::format("{} is full: {} bytes free, and {} (at least {} bytes; set TMPDIR to a directory with "
                              "room)", what, free, purpose, kMinFreeBytes));
    }
  }
  return pattern;
}

}  // namespace

pid_t spawn_process(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                    const posix_spawn_file_actions_t& actions) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t defaults, none;
  sigemptyset(&defaults);
  for (const int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&defaults, s);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attributes, &defaults);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, args[0], &actions, &attributes, args.data(), envp.data());
  posix_spawnattr_destroy(&attributes);
  return rc == 0 ? pid : -rc;
}

RunDir::RunDir() : path_(make_run_dir()) {}

RunDir::~RunDir() { remove(); }

void RunDir::remove() {
  if (path_.empty()) return;
  (void)remove_tree(path_.string());
  path_.clear();
}

std::string cause_in_log(const std::string& log) {
  std::ifstream in(log);
  std::string line, cause;
  std::vector<std::string> tail;
  while (std::getline(in, line)) {
    if (line.starts_with("memgate rank")) cause = line;
    // LibTorch's errors append their C++ stack: frames, and the line that announces them.
    if (line.starts_with("frame #") || line.starts_with("Exception raised from") || line.empty()) continue;
    tail.push_back(line);
    if (tail.size() > 20) tail.erase(tail.begin());
  }
  if (!cause.empty()) return cause;
  std::string text;
  for (const auto& l : tail) text += (text.empty() ? "" : "\n") + l;
  if (text.size() > 4000) text = "..." + text.substr(text.size() - 4000);
  return text.empty() ? "(its log is empty)" : text;
}

Children::Children(RunDir& dir, std::chrono::seconds timeout) : dir_(dir), timeout_(timeout) {}

Children::~Children() {
  end_all(SIGKILL);
  reap_all(std::chrono::milliseconds::max());
}

void Children::start(const ChildSpec& spec) {
  // memgate's tests: a child that cannot start, at the index given (the others start and must be ended).
  if (const char* fault = std::getenv("MEMGATE_TEST_FAIL_START");
      fault != nullptr && std::to_string(children_.size()) == fault) {
    throw Error(fmt::format("cannot start {} ({}): a fault injected by MEMGATE_TEST_FAIL_START", spec.name,
                            spec.argv.front()));
  }
  const int log = ::open(spec.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log < 0) {
    throw Error(fmt::format("cannot start {}: cannot create its log {}: {}", spec.name, spec.log,
                            std::strerror(errno)));
  }
  // Forked by its server where it has one and the server can; else started here.
  std::optional<pid_t> forked;
  if (spec.server != nullptr) {
    auto argv = spec.argv;
    argv.insert(argv.end(), {"--parent-pid", std::to_string(spec.server->pid())});
    forked = spec.server->spawn(argv, spec.env, spec.log, spec.scan);
  }
  pid_t pid = forked.value_or(-1);
  if (!forked) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, log, STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, log, STDERR_FILENO);
    auto argv = spec.argv;
    argv.insert(argv.end(), {"--parent-pid", std::to_string(::getpid())});
    pid = spawn_process(argv, spec.env, actions);
    posix_spawn_file_actions_destroy(&actions);
  }
  ::close(log);
  if (pid < 0) throw Error(fmt::format("cannot start {} ({}): {}", spec.name, spec.argv.front(), std::strerror(-pid)));
  Child child;
  child.spec = spec;
  child.pid = pid;
  child.forked_by = forked ? spec.server : nullptr;
  child.running = true;
  child.last_beat = std::chrono::steady_clock::now();
  children_.push_back(std::move(child));
}

void Children::end_all(int signal) {
  for (const auto& c : children_) {
    if (c.running) ::kill(c.pid, signal);
  }
}

void Children::reap_all(std::chrono::milliseconds grace) {
  const auto deadline = grace == std::chrono::milliseconds::max() ? std::chrono::steady_clock::time_point::max()
                                                                  : std::chrono::steady_clock::now() + grace;
  for (;;) {
    bool any = false;
    for (auto& c : children_) {
      if (!c.running) continue;
      if (!reap(c, false)) any = true;
    }
    if (!any) return;
    if (std::chrono::steady_clock::now() >= deadline) {
      end_all(SIGKILL);  // a stopped child, or one that ignores SIGTERM
      for (auto& c : children_) {
        if (c.running) reap(c, true);
      }
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string Children::silent_ones(std::chrono::steady_clock::time_point now, const Child* except) const {
  std::string out;
  for (const auto& c : children_) {
    if (&c == except || !c.running || now - c.last_beat < kSilent || !c.beats) continue;
    out += fmt::format("{}{} had stopped answering ({:.1f} s without a heartbeat; it was at: {})",
                       out.empty() ? "" : "; ", c.spec.name,
                       std::chrono::duration<double>(now - c.last_beat).count(), c.activity);
  }
  return out;
}

bool Children::reap(Child& c, bool block) {
  if (c.forked_by != nullptr) {
    const auto status = c.forked_by->status(c.pid, block);
    if (!status) return false;
    c.status = *status;
  } else if (::waitpid(c.pid, &c.status, block ? 0 : WNOHANG) != c.pid) {
    return false;
  }
  c.running = false;
  return true;
}

bool Children::succeeded(const Child& c) { return WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0; }

// When a child fails its peers soon fail too (a collective whose peer has gone): the first to fail is the one whose
// log was last written first (it printed its error before they did); the others are ended.
std::string Children::end_after_failure(std::chrono::steady_clock::time_point now) {
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (auto& c : children_) {
    if (c.running) reap(c, false);
  }
  const Child* first = nullptr;
  timespec first_time{};
  for (const auto& c : children_) {
    if (c.running || succeeded(c) || c.pid < 0) continue;
    struct stat st {};
    const timespec written = ::stat(c.spec.log.c_str(), &st) == 0 ? st.st_mtim : timespec{};
    if (first == nullptr || written.tv_sec < first_time.tv_sec ||
        (written.tv_sec == first_time.tv_sec && written.tv_nsec < first_time.tv_nsec)) {
      first = &c;
      first_time = written;
    }
  }
  const auto silent = silent_ones(now, first);
  auto failure = fmt::format("{}{} {}: {}", silent.empty() ? "" : silent + "; then ", first->spec.name,
                             WIFEXITED(first->status)
                                 ? fmt::format("exited with status {}", WEXITSTATUS(first->status))
                                 : fmt::format("was killed by signal {} ({})", WTERMSIG(first->status),
                                               strsignal(WTERMSIG(first->status))),
                             cause_in_log(first->spec.log));
  end_all(SIGTERM);
  reap_all(kGrace);
  return failure;
}

std::optional<std::string> Children::wait() {
  for (;;) {
    if (const int signal = pending_signal(); signal != 0) {
      end_all(SIGTERM);
      reap_all(kGrace);
      dir_.remove();
      end_by_signal(signal);
    }
    const auto now = std::chrono::steady_clock::now();
    bool any = false;
    for (auto& c : children_) {
      if (!c.running) continue;
      if (auto reading = read_heartbeat(c.spec.heartbeat); reading && (!c.beats || *c.beats != reading->count)) {
        c.beats = reading->count;
        c.last_beat = now;
        c.activity = reading->activity;
      }
      if (reap(c, false)) {
        if (!succeeded(c)) return end_after_failure(now);
        continue;
      }
      // No heartbeat for the timeout: stopped, hung or swapped out (a child still starting gets a minute at least:
      // loading LibTorch, or a Python model's imports).
      const auto allowed = c.beats ? std::chrono::duration_cast<std::chrono::milliseconds>(timeout_)
                                   : std::max<std::chrono::milliseconds>(timeout_, std::chrono::minutes(1));
      if (now - c.last_beat > allowed) {
        auto failure = fmt::format(
            "{} stopped answering: no heartbeat for {:.1f} s (the timeout is {} s){}; every process of the probe was "
            "ended", c.spec.name, std::chrono::duration<double>(now - c.last_beat).count(), timeout_.count(),
            c.beats ? fmt::format(", it was at: {}", c.activity) : std::string(" since it started"));
        ::kill(c.pid, SIGKILL);
        end_all(SIGTERM);
        reap_all(kGrace);
        return failure;
      }
      any = true;
    }
    if (!any) return std::nullopt;
    std::this_thread::sleep_for(kPoll);
  }
}

}  // namespace memgate
