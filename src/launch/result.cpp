// The result protocol: a probe's process writes its ProbeResult as one JSON object, and its launcher reads it back.
#include "memgate/launch/result.h"

#include "result_protocol.h"

#include "memgate/base/components.h"
#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/base/module_breakdown.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace memgate {

namespace {

Components components_from(const nlohmann::json& j) {
  Components c;
  for (const auto& info : kComponentTable) {
    const auto key = std::string(info.name);
    if (info.present != nullptr) {
      if (!j.contains(key)) continue;
      c.*info.present = true;
    }
    c.*info.member = j.at(key).get<std::int64_t>();
  }
  return c;
}

nlohmann::json components_json(const Components& c) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& info : kComponentTable) {
    if (has_component(c, info)) out[std::string(info.name)] = c.*info.member;
  }
  return out;
}

// One rank's figures as rank_result_text writes them (an entry of `ranks`).
RankComponents rank_components_from(const nlohmann::json& j) {
  return {.rank = j.at("rank").get<int>(),
          .components = components_from(j.at("components")),
          .comm_buffer_bytes = j.at("comm_buffer_bytes").get<std::int64_t>(),
          .comm_buffers = j.at("comm_buffers").get<std::int64_t>(),
          .communicator_bytes = j.at("communicator_bytes").get<std::int64_t>(),
          .outside_allocator_bytes = j.at("outside_allocator_bytes").get<std::int64_t>(),
          .library_workspace_bytes = j.at("library_workspace_bytes").get<std::int64_t>()};
}

}  // namespace

std::string probe_file(const std::string& path, std::size_t index, std::size_t count) {
  return count == 1 ? path : path + "." + std::to_string(index);
}

std::string rank_result_text(int rank, const ProbeResult& r) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& one : r.ranks) {
    ranks.push_back({{"rank", one.rank},
                     {"components", components_json(one.components)},
                     {"comm_buffer_bytes", one.comm_buffer_bytes},
                     {"comm_buffers", one.comm_buffers},
                     {"communicator_bytes", one.communicator_bytes},
                     {"outside_allocator_bytes", one.outside_allocator_bytes},
                     {"library_workspace_bytes", one.library_workspace_bytes}});
  }
  nlohmann::json out{{"rank", rank},
                     {"memgate_version", MEMGATE_VERSION},
                     {"batch_size", r.batch_size},
                     {"oom", r.oom},
                     {"failed", r.failed},
                     {"error", r.error},
                     {"components", components_json(r.components)},
                     {"comm_buffer_bytes", r.comm_buffer_bytes},
                     {"comm_buffers", r.comm_buffers},
                     {"communicator_bytes", r.communicator_bytes},
                     {"outside_allocator_bytes", r.outside_allocator_bytes},
                     {"library_workspace_bytes", r.library_workspace_bytes},
                     {"seconds", r.seconds},
                     {"step_seconds", r.step_seconds},
                     {"ranks", ranks}};
  if (!r.modules.empty()) out["modules"] = module_breakdown_to_json(r.modules);
  if (r.param_counts) {
    out["params"] = {{"total", r.param_counts->total},
                     {"trainable", r.param_counts->trainable},
                     {"frozen", r.param_counts->frozen}};
  }
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // an error may quote a non-UTF-8 path
}


ProbeResult probe_result_from_json(const nlohmann::json& j) {
  ProbeResult result;
  result.batch_size = j.at("batch_size").get<std::int64_t>();
  result.oom = j.at("oom").get<bool>();
  result.failed = j.value("failed", false);
  result.error = j.at("error").get<std::string>();
  result.components = components_from(j.at("components"));
  if (j.contains("modules")) result.modules = module_breakdown_from_json(j.at("modules"), "the Python probe's modules");
  result.comm_buffer_bytes = j.at("comm_buffer_bytes").get<std::int64_t>();
  result.comm_buffers = j.at("comm_buffers").get<std::int64_t>();
  result.communicator_bytes = j.at("communicator_bytes").get<std::int64_t>();
  result.outside_allocator_bytes = j.at("outside_allocator_bytes").get<std::int64_t>();
  result.library_workspace_bytes = j.at("library_workspace_bytes").get<std::int64_t>();
  result.seconds = j.at("seconds").get<double>();
  result.step_seconds = j.at("step_seconds").get<double>();
  for (const auto& r : j.at("ranks")) result.ranks.push_back(rank_components_from(r));
  if (j.contains("params")) {
    const auto& p = j.at("params");
    result.param_counts = ParamCounts{p.at("total").get<std::int64_t>(), p.at("trainable").get<std::int64_t>(),
                                      p.at("frozen").get<std::int64_t>()};
  }
  return result;
}

namespace detail {

nlohmann::json read_child_result(const std::filesystem::path& file, const std::string& what) {
  return nlohmann::json::parse(read_text_file(file.string(), what));
}

void require_same_version(const nlohmann::json& j, const std::string& who, const std::string& program) {
  const auto version = j.contains("memgate_version") ? j.at("memgate_version").get<std::string>() : "an older one";
  if (version != MEMGATE_VERSION) {
    throw Error(fmt::format("{} ran {}, memgate {}, and this is memgate {}: the probe's processes must run the same "
                            "memgate (set MEMGATE_RANK_EXECUTABLE, or MEMGATE_PYTHON and MEMGATE_PYTHONPATH, to this "
                            "one's)", who, program, version, MEMGATE_VERSION));
  }
}

std::string rank_oom_error(int rank, const nlohmann::json& j) {
  return fmt::format("rank {}: {}", rank, j.at("error").get<std::string>());
}

RankComponents rank_components_of(int rank, const ProbeResult& result) {
  return {.rank = rank,
          .components = result.components,
          .comm_buffer_bytes = result.comm_buffer_bytes,
          .comm_buffers = result.comm_buffers,
          .communicator_bytes = result.communicator_bytes,
          .outside_allocator_bytes = result.outside_allocator_bytes,
          .library_workspace_bytes = result.library_workspace_bytes};
}

}  // namespace detail

}  // namespace memgate
