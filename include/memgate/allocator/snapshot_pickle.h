// Memory snapshots as PyTorch writes them (torch.cuda.memory._dump_snapshot, memory_viz's format) and as memgate's
// --snapshot writes them, read without Python and without a general unpickler: plain data only.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace memgate {

/// Limits that keep a hostile file from costing more than a real one.
struct PickleLimits {
  /// Values (scalars and containers) the result may hold, counting each use of a memoized value anew: a file
  /// that repeats one reference to build an exponentially large value is refused, not expanded.
  std::int64_t max_values = 64LL << 20;
  /// Containers nested in each other.
  int max_depth = 512;
};

/// Reads a pickle of plain data (protocols 2 to 5: dicts, lists, tuples, str, bytes, int, float, bool, None, with
/// memo references) into JSON: tuples become arrays, bytes JSON binary; dict keys must be strings or integers
/// (integers become their decimal text). Anything that names Python code or builds objects (GLOBAL, STACK_GLOBAL,
/// REDUCE, BUILD, INST, OBJ, NEWOBJ, persistent ids, extensions, out-of-band buffers), an integer beyond 64 bits,
/// a truncated or malformed stream, a cycle, or a value past `limits` throws memgate::Error naming `origin`, the
/// byte offset and what was expected. Never executes anything.
[[nodiscard]] nlohmann::json read_plain_pickle(std::string_view data, const std::string& origin,
                                               const PickleLimits& limits = {});

/// read_plain_pickle of a file (errors name the file).
[[nodiscard]] nlohmann::json load_plain_pickle(const std::string& path, const PickleLimits& limits = {});

}  // namespace memgate
