// A probe's child processes: its run folder, starting them each in a process group of its own, watching the progress
// their heartbeats report and ending them (with their groups) together.
#include "children.h"

#include "fork_server.h"
#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/base/heartbeat.h"
#include "memgate/launch/fault_points.h"

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
#include <tuple>

namespace memgate {

namespace {

// The free space a probe's folder needs at least: its store, logs, results and heartbeats take kilobytes; memory
// snapshots, when asked for, more (their writes then fail with a message of their own).
constexpr std::uintmax_t kMinFreeBytes = std::uintmax_t{1} << 20;

// How often the supervisor looks at its children, and how long a child that was told to end (SIGTERM) has before
// it is killed.
constexpr std::chrono::milliseconds kPoll{50};
constexpr std::chrono::milliseconds kGrace{3000};

// No progress (or no heartbeat) for this long, when it is less than the timeout, says a child may be stuck: named as
// the likely cause when another child fails meanwhile (its peers, waiting on it in a collective).
constexpr std::chrono::milliseconds kSilent{2000};

// What a child that has not yet written a heartbeat gets at least to start: loading LibTorch, a Python's imports.
constexpr std::chrono::milliseconds kStarting = std::chrono::minutes(1);

double seconds_of(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

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
                    const posix_spawn_file_actions_t& actions, bool own_group) {
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
  short flags = POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK;
  if (own_group) {
    posix_spawnattr_setpgroup(&attributes, 0);  // its own: its pid
    flags |= POSIX_SPAWN_SETPGROUP;
  }
  posix_spawnattr_setflags(&attributes, flags);
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
  // memgate's tests: a child that cannot start (the others start and must be ended).
  if (fault_points::fails_to_start(children_.size())) {
    throw Error(fmt::format("cannot start {} ({}): a fault injected by the test", spec.name, spec.argv.front()));
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
    pid = spawn_process(argv, spec.env, actions, /*own_group=*/true);
    posix_spawn_file_actions_destroy(&actions);
  }
  ::close(log);
  if (pid < 0) throw Error(fmt::format("cannot start {} ({}): {}", spec.name, spec.argv.front(), std::strerror(-pid)));
  Child child;
  child.spec = spec;
  child.pid = pid;
  child.forked_by = forked ? spec.server : nullptr;
  // Its own group: started so here, and a server puts what it forks in one before it answers. Never this process's
  // (a test's, a CI job's): that one is not ended with a child.
  if (const pid_t group = ::getpgid(pid); group == pid && group != ::getpgrp()) child.group = group;
  child.running = true;
  child.last_beat = child.last_progress = Clock::now();
  children_.push_back(std::move(child));
}

void Children::signal_child(const Child& c, int signal) {
  if (c.group > 0) ::kill(-c.group, signal);
  else ::kill(c.pid, signal);
}

void Children::end_all(int signal) {
  for (const auto& c : children_) {
    if (c.running) signal_child(c, signal);
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

std::string Children::silent_ones(Clock::time_point now, const Child* except) const {
  std::string out;
  for (const auto& c : children_) {
    if (&c == except || !c.running || now - c.last_progress < kSilent || !c.beats) continue;
    out += (out.empty() ? "" : "; ") +
           (now - c.last_beat >= kSilent
                ? fmt::format("{} had stopped answering ({:.1f} s without a heartbeat; it was at: {})", c.spec.name,
                              seconds_of(now - c.last_beat), c.activity)
                : fmt::format("{} had made no progress for {:.1f} s (it was at: {})", c.spec.name,
                              seconds_of(now - c.last_progress), c.activity));
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
  // What it started and left (a builder's subprocess) ends now: the group outlives its leader.
  if (c.group > 0) ::kill(-c.group, SIGKILL);
  std::error_code ec;
  c.no_result = WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0 && !c.spec.result.empty() &&
                !std::filesystem::exists(c.spec.result, ec);
  return true;
}

bool Children::succeeded(const Child& c) {
  return WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0 && !c.no_result;
}

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
  const auto how = first->no_result
                       ? fmt::format("exited with status 0 but wrote no result (did the model call os._exit or "
                                     "sys.exit? is a local memgate.py shadowing the package?){}; the end of its log",
                                     first->spec.no_result_note.empty() ? "" : ". " + first->spec.no_result_note)
                   : WIFEXITED(first->status)
                       ? fmt::format("exited with status {}", WEXITSTATUS(first->status))
                       : fmt::format("was killed by signal {} ({})", WTERMSIG(first->status),
                                     strsignal(WTERMSIG(first->status)));
  auto failure = fmt::format("{}{} {}: {}", silent.empty() ? "" : silent + "; then ", first->spec.name, how,
                             cause_in_log(first->spec.log));
  end_all(SIGTERM);
  reap_all(kGrace);
  return failure;
}

void Children::observe(Child& c, Clock::time_point now) {
  const auto reading = read_heartbeat(c.spec.heartbeat);
  if (!reading) return;
  if (!c.beats || *c.beats != reading->count) {
    c.beats = reading->count;
    c.last_beat = now;
  }
  if (!c.progress || *c.progress != reading->progress) {
    c.progress = reading->progress;
    c.last_progress = now;
  }
  c.activity = reading->activity;
}

std::chrono::milliseconds Children::allowance(const Child& c) const {
  const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(timeout_);
  return c.beats ? timeout : std::max(timeout, kStarting);
}

// A child that made no progress for the timeout: hung (its heartbeat goes on: a Python call that sleeps, spins or
// waits, a wedged CUDA call or collective) or stopped (no heartbeat either: stopped, swapped out, blocked in the
// kernel). It is killed with its group, and the others ended.
std::string Children::end_stuck(Child& c, Clock::time_point now) {
  const auto timeout = fmt::format("the timeout is {} s: --rank-timeout or MEMGATE_RANK_TIMEOUT", timeout_.count());
  std::string what;
  if (!c.beats) {
    what = fmt::format("{} stopped answering: no heartbeat for {:.1f} s since it started ({}; a starting process gets "
                       "{} s at least)", c.spec.name, seconds_of(now - c.last_progress), timeout,
                       std::chrono::duration_cast<std::chrono::seconds>(allowance(c)).count());
  } else if (now - c.last_beat >= kSilent) {
    what = fmt::format("{} stopped answering: no progress and no heartbeat for {:.1f} s, at: {} ({}); it is stopped, "
                       "swapped out or blocked in the kernel", c.spec.name, seconds_of(now - c.last_progress),
                       c.activity, timeout);
  } else {
    what = fmt::format("{} is stuck: no progress for {:.1f} s, at: {} ({}); it is alive, but its work does not move "
                       "(a Python call that sleeps, spins or waits, a wedged CUDA call or collective)", c.spec.name,
                       seconds_of(now - c.last_progress), c.activity, timeout);
  }
  const auto others = silent_ones(now, &c);
  signal_child(c, SIGKILL);
  end_all(SIGTERM);
  reap_all(kGrace);
  return fmt::format("{}{}; every process of the probe was ended", what, others.empty() ? "" : "; meanwhile " + others);
}

// Which of the children that made no progress lately is named when one has made none for the timeout: its peers
// stopped moving about when it did (a rank waits on it in a collective), and the heartbeat says when only to a beat.
// Among those without progress for all but kSilent of the timeout: a stopped one (no heartbeat either), then one that
// is not waiting in a collective, then the one without progress longest.
Children::Child* Children::culprit(Clock::time_point now) {
  Child* best = nullptr;
  const auto rank = [&](const Child& c) {
    const bool stopped = !c.beats || now - c.last_beat >= kSilent;
    const bool waiting = c.activity.find("in a collective") != std::string::npos;
    return std::make_tuple(stopped ? 0 : 1, waiting ? 1 : 0, c.last_progress);
  };
  for (auto& c : children_) {
    if (!c.running || now - c.last_progress + kSilent <= allowance(c)) continue;
    if (best == nullptr || rank(c) < rank(*best)) best = &c;
  }
  return best;
}

std::optional<std::string> Children::wait() {
  for (;;) {
    if (const int signal = pending_signal(); signal != 0) {
      end_all(SIGTERM);
      reap_all(kGrace);
      dir_.remove();
      end_by_signal(signal);
    }
    const auto now = Clock::now();
    bool any = false;
    Child* stuck = nullptr;
    for (auto& c : children_) {
      if (!c.running) continue;
      observe(c, now);
      if (reap(c, false)) {
        if (!succeeded(c)) return end_after_failure(now);
        continue;
      }
      any = true;
      if (now - c.last_progress > allowance(c)) stuck = &c;
    }
    if (stuck != nullptr) return end_stuck(*culprit(now), now);
    if (!any) return std::nullopt;
    std::this_thread::sleep_for(kPoll);
  }
}

// No fault anywhere (launch/fault_points.h): weak, for the test-only program memgate-measure-faults to replace.
[[gnu::weak]] void fault_points::at_phase(int /*rank*/, std::string_view /*phase*/) {}
[[gnu::weak]] bool fault_points::fails_to_start(std::size_t /*index*/) { return false; }

}  // namespace memgate
