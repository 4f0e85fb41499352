// A probe process's phase, its progress counter and its heartbeat file.
#include "memgate/base/heartbeat.h"

#include <fcntl.h>
#include <unistd.h>

#include <condition_variable>
#include <fstream>
#include <mutex>
#include <sstream>
#include <utility>

namespace memgate {

namespace {

std::mutex g_mutex;
std::string g_phase;
std::string g_detail;  // the innermost ProgressSection's

// Advanced by the work only (phases, blocks, collectives, calls into Python): the heartbeat thread reads it.
std::atomic<std::uint64_t> g_progress{0};

// The heartbeat thread waits on this between beats; a new phase wakes it, so that the file says what the process
// does now, not up to an interval ago (a process that stops right after a phase begins is found at that phase).
std::mutex g_wake_mutex;
std::condition_variable g_wake;
bool g_changed = false;

void wake_heartbeat() {
  {
    const std::lock_guard lock(g_wake_mutex);
    g_changed = true;
  }
  g_wake.notify_all();
}

}  // namespace

void set_phase(std::string_view phase) {
  {
    const std::lock_guard lock(g_mutex);
    g_phase = phase;
  }
  note_progress();
  wake_heartbeat();
}

void note_progress() { g_progress.fetch_add(1, std::memory_order_relaxed); }

std::uint64_t progress_count() { return g_progress.load(std::memory_order_relaxed); }

ProgressSection::ProgressSection(std::string detail) {
  {
    const std::lock_guard lock(g_mutex);
    previous_ = std::exchange(g_detail, std::move(detail));
  }
  note_progress();
}

ProgressSection::~ProgressSection() {
  {
    const std::lock_guard lock(g_mutex);
    g_detail = std::move(previous_);
  }
  note_progress();
}

std::string current_activity() {
  const std::lock_guard lock(g_mutex);
  auto activity = g_phase.empty() ? std::string("starting") : g_phase;
  if (!g_detail.empty()) activity += ", " + g_detail;
  return activity;
}

Heartbeat::Heartbeat(std::string path, std::chrono::milliseconds interval)
    : path_(std::move(path)), interval_(interval) {
  beat(0);
  thread_ = std::thread([this] {
    for (std::uint64_t count = 1;; ++count) {
      std::unique_lock lock(g_wake_mutex);
      g_wake.wait_for(lock, interval_, [this] { return stop_.load() || g_changed; });
      if (stop_) return;
      g_changed = false;
      lock.unlock();
      beat(count);
    }
  });
}

Heartbeat::~Heartbeat() {
  {
    const std::lock_guard lock(g_wake_mutex);
    stop_ = true;
  }
  g_wake.notify_all();
  if (thread_.joinable()) thread_.join();
}

// Written in place, one write of a whole line (the reader takes a line only when it ends with a newline): no
// temporary file to leave behind.
void Heartbeat::beat(std::uint64_t count) const {
  const auto line = std::to_string(count) + " " + std::to_string(progress_count()) + " " + current_activity() + "\n";
  // Created by the first beat only: a file removed later (a rank whose launcher died clears the probe's folder, and
  // this thread may still beat meanwhile) stays removed.
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC | (count == 0 ? O_CREAT : 0), 0644);
  if (fd < 0) return;  // the supervisor will see no beat, and say so
  if (::pwrite(fd, line.data(), line.size(), 0) == static_cast<ssize_t>(line.size())) {
    (void)::ftruncate(fd, static_cast<off_t>(line.size()));
  }
  ::close(fd);
}

std::optional<HeartbeatReading> read_heartbeat(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line) || in.eof()) return std::nullopt;  // no newline yet: half-written
  std::istringstream fields(line);
  HeartbeatReading reading;
  if (!(fields >> reading.count >> reading.progress)) return std::nullopt;
  std::getline(fields >> std::ws, reading.activity);
  return reading;
}

}  // namespace memgate
