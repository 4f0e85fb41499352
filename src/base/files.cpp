// Whole-or-nothing file writes.
#include "memgate/base/files.h"

#include "memgate/base/error.h"

#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <climits>
#include <cstring>
#include <mutex>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <fstream>
#include <system_error>

namespace memgate {

namespace {

// Pending temporary files, readable from a signal handler: fixed slots of fixed-size paths, published with an
// atomic flag (a handler may only read what is complete, and only call async-signal-safe functions).
constexpr int kSlots = 16;
struct PendingSlot {
  std::atomic<bool> used{false};
  std::atomic<bool> ready{false};
  std::array<char, PATH_MAX> path{};
};
std::array<PendingSlot, kSlots> g_pending;

extern "C" void remove_pending_and_reraise(int signal_number) {
  for (auto& slot : g_pending) {
    if (slot.ready.load(std::memory_order_acquire)) ::unlink(slot.path.data());
  }
  ::signal(signal_number, SIG_DFL);
  ::raise(signal_number);
}

void install_signal_handlers_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const int s : {SIGINT, SIGTERM, SIGHUP}) {
      struct sigaction current {};
      if (::sigaction(s, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) continue;  // someone else's
      struct sigaction action {};
      action.sa_handler = remove_pending_and_reraise;
      sigemptyset(&action.sa_mask);
      ::sigaction(s, &action, nullptr);
    }
  });
}

}  // namespace

TemporaryFileGuard::TemporaryFileGuard(const std::string& path) : path_(path) {
  install_signal_handlers_once();
  if (path.size() >= PATH_MAX) return;  // too long to register: removed by the destructor only
  for (int i = 0; i < kSlots; ++i) {
    bool expected = false;
    if (g_pending[i].used.compare_exchange_strong(expected, true)) {
      std::memcpy(g_pending[i].path.data(), path.c_str(), path.size() + 1);
      g_pending[i].ready.store(true, std::memory_order_release);
      slot_ = i;
      return;
    }
  }
}

TemporaryFileGuard::~TemporaryFileGuard() {
  if (!path_.empty()) ::unlink(path_.c_str());
  release();
}

void TemporaryFileGuard::release() {
  path_.clear();
  if (slot_ >= 0) {
    g_pending[slot_].ready.store(false, std::memory_order_release);
    g_pending[slot_].used.store(false, std::memory_order_release);
    slot_ = -1;
  }
}

std::string read_text_file(const std::string& path, const std::string& what) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) throw Error(path + ": no such file: expected " + what);
  if (std::filesystem::is_directory(status)) throw Error(path + ": is a directory: expected " + what);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot read it: " + std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error(path + ": reading failed: " + std::strerror(errno));
  return text;
}

void write_file_atomically(const std::string& path, const std::string& text) {
  std::filesystem::path file(path);
  std::error_code ec;
  const auto status = std::filesystem::status(file, ec);  // follows a symlink to what it names
  if (!ec && std::filesystem::exists(status)) {
    if (std::filesystem::is_directory(status)) throw Error(path + ": is a directory: expected a file to write");
    if (!std::filesystem::is_regular_file(status)) {
      // A device, a FIFO or a socket: written to directly; replacing it with a file would destroy it.
      std::ofstream out(path, std::ios::binary);
      if (!out) throw Error(path + ": cannot write");
      out << text;
      out.flush();
      if (!out) throw Error(path + ": write failed");
      return;
    }
    // A symlink to a regular file: the file it names is replaced, and the link stays.
    if (std::filesystem::is_symlink(std::filesystem::symlink_status(file, ec))) file = std::filesystem::canonical(file);
  }
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
  const auto tmp = file.string() + ".tmp." + std::to_string(::getpid());
  TemporaryFileGuard guard(tmp);  // gone on an error, a return or Ctrl-C before the rename
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error(tmp + ": cannot write");
    out << text;
    out.flush();
    if (!out) throw Error(tmp + ": write failed");
  }
  std::filesystem::rename(tmp, file, ec);
  if (ec) throw Error(path + ": cannot replace: " + ec.message());
  guard.release();
}

}  // namespace memgate
