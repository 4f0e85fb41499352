// A profile as the CLI prints it and as JSON (the format of DESIGN.md, "The command-line tool").
#pragma once

#include "memgate/base/units.h"
#include "memgate/gate/budget.h"
#include "memgate/measure/probe.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace memgate {

/// Every component by name, in the table's order.
[[nodiscard]] nlohmann::json components_to_json(const Components& components);
/// A distributed probe's ranks as JSON: [{"rank", "components", "comm_buffer_bytes", "comm_buffers"}, ...] (profile
/// JSON and baselines alike).
[[nodiscard]] nlohmann::json ranks_to_json(const std::vector<RankComponents>& ranks);
/// The profile's JSON: device, model (parameter counts), one entry per probe with its components.
[[nodiscard]] nlohmann::json profile_to_json(const Profile& profile);
/// The device description's JSON (name, slug and versions).
[[nodiscard]] nlohmann::json device_to_json(const DeviceInfo& device);

/// The human report: parameter counts, a component x batch-size table, out-of-memory batch sizes, and the
/// largest batch size that fits each of `gpus`.
[[nodiscard]] std::string format_profile(const Profile& profile, const std::vector<GpuSpec>& gpus);

}  // namespace memgate
