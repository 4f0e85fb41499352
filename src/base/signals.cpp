// memgate's SIGINT/SIGTERM/SIGHUP handler: temporary files removed, the signal deferred while a supervisor ends its
// children, and a child's folder removed when its parent dies. Everything the handler touches is async-signal-safe:
// fixed buffers published with atomics, and system calls only.
#include "memgate/base/signals.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <mutex>

namespace memgate {

namespace {

constexpr std::array kSignals{SIGINT, SIGTERM, SIGHUP};

// Pending temporary files: fixed slots of fixed-size paths, published with an atomic flag (a handler may only read
// what is complete).
constexpr int kSlots = 16;
struct PendingSlot {
  std::atomic<bool> used{false};
  std::atomic<bool> ready{false};
  std::array<char, PATH_MAX> path{};
};
std::array<PendingSlot, kSlots> g_pending;

std::atomic<int> g_deferrals{0};
std::atomic<int> g_pending_signal{0};

// A child's job folder and the parent that made it (end_with_parent).
std::array<char, PATH_MAX> g_folder{};
std::atomic<bool> g_folder_set{false};
std::atomic<pid_t> g_parent{0};

void remove_temporary_files() {
  for (auto& slot : g_pending) {
    if (slot.ready.load(std::memory_order_acquire)) ::unlink(slot.path.data());
  }
}

// The kernel's record of a directory entry (getdents64(2)); glibc declares none.
struct LinuxDirent64 {
  ino64_t d_ino;
  off64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[1];
};

// A flat folder (files only) and its files, with system calls only: opendir and readdir may allocate.
void remove_flat_folder(const char* folder) {
  for (int pass = 0; pass < 4; ++pass) {
    const int fd = ::open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    alignas(8) std::array<char, 4096> buffer{};
    for (;;) {
      const long n = ::syscall(SYS_getdents64, fd, buffer.data(), buffer.size());
      if (n <= 0) break;
      for (long offset = 0; offset < n;) {
        const auto* entry = reinterpret_cast<const LinuxDirent64*>(buffer.data() + offset);
        const char* name = entry->d_name;
        const bool dots = name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'));
        if (!dots) ::unlinkat(fd, name, 0);
        offset += entry->d_reclen;
      }
    }
    ::close(fd);
    if (::rmdir(folder) == 0 || errno != ENOTEMPTY) return;  // a file made meanwhile: once more
  }
}

bool orphaned() {
  const pid_t parent = g_parent.load();
  return parent != 0 && ::getppid() != parent;
}

extern "C" void on_signal(int signal_number) {
  const int saved = errno;
  const bool orphan = g_folder_set.load(std::memory_order_acquire) && orphaned();
  if (orphan) remove_flat_folder(g_folder.data());
  if (g_deferrals.load() > 0) {
    g_pending_signal.store(signal_number);
    errno = saved;
    return;
  }
  remove_temporary_files();
  // A probe process whose parent died leads a process group of its own (launch/children.h): what its model's code
  // started (a builder's subprocess) is in it, and nothing else would end it. The group, this process with it.
  if (orphan && ::getpgrp() == ::getpid()) ::kill(0, SIGKILL);
  ::signal(signal_number, SIG_DFL);
  ::raise(signal_number);
  errno = saved;
}

std::mutex g_install_mutex;
std::array<bool, kSignals.size()> g_installed{};

}  // namespace

void install_signal_handlers(bool force) {
  const std::lock_guard lock(g_install_mutex);
  for (std::size_t i = 0; i < kSignals.size(); ++i) {
    if (g_installed[i]) continue;
    struct sigaction current {};
    if (::sigaction(kSignals[i], nullptr, &current) != 0) continue;
    if (!force && current.sa_handler != SIG_DFL) continue;  // someone else's: theirs to handle
    struct sigaction action {};
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    if (::sigaction(kSignals[i], &action, nullptr) == 0) g_installed[i] = true;
  }
}

int register_temporary_file(const std::string& path) {
  install_signal_handlers();
  if (path.size() >= PATH_MAX) return -1;
  for (int i = 0; i < kSlots; ++i) {
    bool expected = false;
    if (g_pending[i].used.compare_exchange_strong(expected, true)) {
      std::memcpy(g_pending[i].path.data(), path.c_str(), path.size() + 1);
      g_pending[i].ready.store(true, std::memory_order_release);
      return i;
    }
  }
  return -1;
}

void unregister_temporary_file(int slot) {
  if (slot < 0 || slot >= kSlots) return;
  g_pending[slot].ready.store(false, std::memory_order_release);
  g_pending[slot].used.store(false, std::memory_order_release);
}

SignalDeferral::SignalDeferral() {
  install_signal_handlers();
  ++g_deferrals;
}

SignalDeferral::~SignalDeferral() {
  --g_deferrals;
}

int pending_signal() { return g_pending_signal.load(); }

void end_by_signal(int signal) {
  remove_temporary_files();
  ::signal(signal, SIG_DFL);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, signal);
  ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  ::raise(signal);
  ::_exit(128 + signal);
}

bool end_with_parent(pid_t parent, const std::string& folder) {
  if (folder.size() < PATH_MAX) {
    std::memcpy(g_folder.data(), folder.c_str(), folder.size() + 1);
    g_folder_set.store(true, std::memory_order_release);
  }
  g_parent.store(parent);
  install_signal_handlers(/*force=*/true);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  // The parent may have died before the death signal was asked for: then no signal comes.
  if (::getppid() != parent) {
    if (g_folder_set.load()) remove_flat_folder(g_folder.data());
    return false;
  }
  return true;
}

}  // namespace memgate
