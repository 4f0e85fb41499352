// Progress lines on stderr: in place on a terminal, throttled plain lines in logs.
#include "memgate/base/progress.h"

#include <fmt/format.h>

#include <cstdlib>
#include <unistd.h>

namespace memgate {

Progress::Progress(std::FILE* stream, std::optional<bool> terminal) : stream_(stream) {
  const char* term = std::getenv("TERM");
  terminal_ = terminal.value_or(isatty(fileno(stream)) != 0 && (term == nullptr || std::string_view(term) != "dumb"));
  const char* env = std::getenv("MEMGATE_PROGRESS");
  enabled_ = env == nullptr || std::string_view(env) != "0";
  item_start_ = last_print_ = Clock::now();
}

Progress::~Progress() { clear_line(); }

void Progress::clear_line() {
  if (line_open_) {
    fmt::print(stream_, "\r\033[K");
    std::fflush(stream_);
    line_open_ = false;
  }
}

void Progress::update(std::string_view item, std::string_view detail) {
  if (!enabled_) return;
  const auto now = Clock::now();
  if (item != item_) {
    item_ = item;
    item_start_ = now;
  }
  const double elapsed = std::chrono::duration<double>(now - item_start_).count();
  const auto text = detail.empty() ? std::string(item) : fmt::format("{}: {}", item, detail);
  if (terminal_) {
    if (now - last_print_ < std::chrono::milliseconds(100) && line_open_) return;
    fmt::print(stream_, "\r\033[K[memgate] {} ({:.0f} s)", text, elapsed);
    std::fflush(stream_);
    line_open_ = true;
  } else {
    if (now - last_print_ < std::chrono::seconds(2)) return;
    fmt::print(stream_, "[memgate] {} ({:.0f} s)\n", text, elapsed);
  }
  last_print_ = now;
}

void Progress::done(std::string_view line) {
  if (!enabled_) return;
  clear_line();
  fmt::print(stream_, "[memgate] {}\n", line);
  std::fflush(stream_);
  item_.clear();
  last_print_ = Clock::now();
}

}  // namespace memgate
