// A replay's results (allocator/replay.h) as JSON, text and HTML.
#pragma once

#include "memgate/allocator/replay.h"

#include <nlohmann/json.hpp>

#include <string>

namespace memgate {

/// The report as DESIGN.md's JSON.
[[nodiscard]] nlohmann::json replay_to_json(const ReplayReport& report);
/// The report as text for a terminal.
[[nodiscard]] std::string replay_summary(const ReplayReport& report);
/// A self-contained HTML page: reserved and allocated over the trace, recorded against each what-if.
[[nodiscard]] std::string replay_html(const ReplayReport& report);

}  // namespace memgate
