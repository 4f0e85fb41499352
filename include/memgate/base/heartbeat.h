// What a probe process is doing, told to the process that supervises it: a phase in words, a progress counter that
// the work itself advances (each phase, each block's forward, each collective, each call into a model's Python code,
// each module a Python probe imports), and a heartbeat file that a thread of its own rewrites with both while the
// process runs. The supervisor (launch/children.h) judges a process by its progress: a thread beats whatever the
// work is doing (a Python forward that sleeps or spins holding the GIL, a builder that waits for ever, a wedged CUDA
// call or collective), so a beat says the process is alive, and only progress says the work moves.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

namespace memgate {

/// Sets what this process is doing now ("measured step: backward") and advances the progress counter; cheap and
/// thread-safe.
void set_phase(std::string_view phase);

/// Advances the progress counter: the work has moved. Call it from the work itself (never from a thread that runs
/// regardless of it): one atomic increment.
void note_progress();

/// The progress counter: how many times the work has moved.
[[nodiscard]] std::uint64_t progress_count();

/// While it lives: the progress counter advanced on entry and on exit, and `detail` ("in a collective: broadcast",
/// "in the model's Python forward") said after the phase, so that a process stuck inside it is found there. Nested
/// sections restore the outer one's detail.
class ProgressSection {
 public:
  explicit ProgressSection(std::string detail);
  ~ProgressSection();
  ProgressSection(const ProgressSection&) = delete;
  ProgressSection& operator=(const ProgressSection&) = delete;

 private:
  std::string previous_;
};

/// The phase, "starting" before the first, with the detail of the innermost ProgressSection after it.
[[nodiscard]] std::string current_activity();

/// While it lives, a thread of its own rewrites `path` every `interval` with a beat count, the progress counter and
/// current_activity(), one line: "<beats> <progress> <activity>". The supervisor reads it with read_heartbeat.
class Heartbeat {
 public:
  Heartbeat(std::string path, std::chrono::milliseconds interval);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  void beat(std::uint64_t count) const;
  std::string path_;
  std::chrono::milliseconds interval_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

/// What a heartbeat file says: its beat count, the progress counter and the activity; nothing while the file is
/// missing or half-written.
struct HeartbeatReading {
  std::uint64_t count = 0;
  std::uint64_t progress = 0;
  std::string activity;
};
[[nodiscard]] std::optional<HeartbeatReading> read_heartbeat(const std::string& path);

}  // namespace memgate
