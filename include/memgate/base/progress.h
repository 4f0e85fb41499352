// What a long run is doing, on stderr: one line updated in place on a terminal, plain lines in a log.
#pragma once

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

namespace memgate {

/// Progress of a long run (a 7B fixture's probe, an advise search, a suite outside CTest).
///
///   memgate::Progress progress;                      // stderr; a terminal is detected
///   progress.update("vit_large bs 32 (2/5): measured step: backward");
///   progress.done("vit_large bs 32: 41.2 GiB step peak, 12.3 s");
///
/// On a terminal, update() rewrites one line (with the seconds the current item has run) at most ten times a
/// second and done() leaves its line behind. Elsewhere (CI logs) update() prints a line only when the last line
/// is two seconds old, so short items print just their done() line. MEMGATE_PROGRESS=0 silences it.
class Progress {
 public:
  explicit Progress(std::FILE* stream = stderr, std::optional<bool> terminal = std::nullopt);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  /// What runs now; starts the item's clock when `item` differs from the current one.
  void update(std::string_view item, std::string_view detail = {});
  /// The current item is over: prints `line` and keeps it.
  void done(std::string_view line);
  [[nodiscard]] bool terminal() const { return terminal_; }
  [[nodiscard]] bool enabled() const { return enabled_; }

 private:
  using Clock = std::chrono::steady_clock;
  void clear_line();

  std::FILE* stream_;
  bool terminal_;
  bool enabled_;
  bool line_open_ = false;
  std::string item_;
  Clock::time_point item_start_;
  Clock::time_point last_print_;
};

}  // namespace memgate
