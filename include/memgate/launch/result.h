// The result protocol between a probe's process and its launcher, one type at both ends: the child writes its
// ProbeResult as one JSON object (rank_result_text), the launcher reads it back as a ProbeResult
// (probe_result_from_json), each file named by probe_file.
#pragma once

#include "memgate/measure/probe.h"

#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <string>

namespace memgate {

/// What a probe's process leaves for its parent: its result as one JSON object (its ranks' and the model's
/// parameter counts too where it has them), with the memgate version that wrote it.
[[nodiscard]] std::string rank_result_text(int rank, const ProbeResult& result);

/// The ProbeResult that rank_result_text wrote (its snapshots, which are files of their own, aside).
[[nodiscard]] ProbeResult probe_result_from_json(const nlohmann::json& j);

/// Where a probe's process writes what it has of the `index`-th of `count` batch sizes (its result, its snapshot):
/// `path` itself for one batch size, else `<path>.<index>`. The process and its launcher both name files by it.
[[nodiscard]] std::string probe_file(const std::string& path, std::size_t index, std::size_t count);

}  // namespace memgate
