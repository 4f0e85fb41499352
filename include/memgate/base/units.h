// Bytes as people read them: KiB, MiB and GiB chosen so that a small change still shows.
#pragma once

#include <cstdint>
#include <string>

namespace memgate {

/// Bytes as MiB with one decimal: "412.0 MiB" (the unit of the profile report's tables).
[[nodiscard]] std::string format_mib(std::int64_t bytes);

/// Bytes in the largest binary unit that keeps three significant digits: "512 B", "170.5 KiB", "412.0 MiB",
/// "1.25 GiB"; negative values keep their sign.
[[nodiscard]] std::string format_bytes(std::int64_t bytes);

/// A signed difference: "+1.5 MiB", "-512 B", "+0 B".
[[nodiscard]] std::string format_bytes_delta(std::int64_t bytes);

}  // namespace memgate
