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
  /// And at most this many values per byte of the file, beyond the first 65,536: a few kilobytes of memo references
  /// cannot expand to gigabytes of JSON. Real snapshots hold about 1 per byte (frames shared by memo references
  /// raise it to 10 or so at most).
  std::int64_t max_values_per_byte = 64;
  /// Containers nested in each other.
  int max_depth = 512;
};

/// Reads a pickle of plain data (protocols 2 to 5: dicts, lists, tuples, str, bytes, int, float, bool, None, with
/// memo references) into JSON: tuples become arrays, bytes JSON binary; dict keys must be strings or integers
/// (integers become their decimal text); a str that is not UTF-8 (a C++ frame's symbol, a file name Python decoded
/// with surrogateescape) is read as utf8_text() makes it. Memory stays proportional to the file's size. Anything
/// that names Python code or builds objects (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, persistent ids,
/// extensions, out-of-band buffers), an integer beyond 64 bits, a truncated or malformed stream, a cycle, or a value
/// past `limits` throws memgate::Error naming `origin`, the byte offset and what was expected. Never executes
/// anything.
[[nodiscard]] nlohmann::json read_plain_pickle(std::string_view data, const std::string& origin,
                                               const PickleLimits& limits = {});

/// `bytes` as valid UTF-8 (what nlohmann::json can write): the well-formed sequences as they are, every other byte
/// as the four characters \xNN; a lone surrogate U+DC80..U+DCFF (Python's surrogateescape of a byte that is not
/// UTF-8) as the byte it stands for: "caf\xe9.py" for a Latin-1 file name.
[[nodiscard]] std::string utf8_text(std::string_view bytes);

/// read_plain_pickle of a file (errors name the file).
[[nodiscard]] nlohmann::json load_plain_pickle(const std::string& path, const PickleLimits& limits = {});

}  // namespace memgate
