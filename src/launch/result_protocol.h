// The launcher's side of the result protocol (memgate/launch/result.h): reading a child's result file.
#pragma once

#include "memgate/measure/probe.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

namespace memgate::detail {

/// The JSON object of a child's result file (`what` names it in an error: "a rank's result file").
[[nodiscard]] nlohmann::json read_child_result(const std::filesystem::path& file, const std::string& what);

/// The result's memgate version must be this one's: a program of another memgate may write other figures. `who` (rank
/// 1, the Python probe) ran `program`.
void require_same_version(const nlohmann::json& j, const std::string& who, const std::string& program);

/// A rank's out-of-memory, named: "rank 1: <its error>".
[[nodiscard]] std::string rank_oom_error(int rank, const nlohmann::json& j);

/// One rank's figures, from the result it wrote.
[[nodiscard]] RankComponents rank_components_of(int rank, const ProbeResult& result);

}  // namespace memgate::detail
