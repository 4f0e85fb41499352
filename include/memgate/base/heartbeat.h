// What a probe process is doing, told to the process that supervises it: a phase in words and a heartbeat file that
// a thread of its own rewrites while the process runs (a stopped or swapped-out process stops it).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

namespace memgate {

/// Sets what this process is doing now ("measured step: backward"); cheap and thread-safe.
void set_phase(std::string_view phase);

/// The phase, "starting" before the first.
[[nodiscard]] std::string current_activity();

/// While it lives, a thread of its own rewrites `path` every `interval` with a beat count and current_activity(),
/// one line: "<count> <activity>". The supervisor reads it with read_heartbeat.
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

/// What a heartbeat file says: its beat count and the activity; nothing while the file is missing or half-written.
struct HeartbeatReading {
  std::uint64_t count = 0;
  std::string activity;
};
[[nodiscard]] std::optional<HeartbeatReading> read_heartbeat(const std::string& path);

}  // namespace memgate
