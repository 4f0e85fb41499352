// Byte counts for people: binary units picked per value.
#include "memgate/base/units.h"

#include <fmt/format.h>

#include <cstdlib>

namespace memgate {

std::string format_mib(std::int64_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

std::string format_bytes(std::int64_t bytes) {
  const double magnitude = std::abs(static_cast<double>(bytes));
  if (magnitude < 1024.0) return fmt::format("{} B", bytes);
  const double b = static_cast<double>(bytes);
  if (magnitude < 1024.0 * 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  if (magnitude < 1024.0 * 1024.0 * 1024.0) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024.0));
  return fmt::format("{:.2f} GiB", b / (1024.0 * 1024.0 * 1024.0));
}

std::string format_bytes_delta(std::int64_t bytes) { return (bytes < 0 ? "" : "+") + format_bytes(bytes); }

}  // namespace memgate
