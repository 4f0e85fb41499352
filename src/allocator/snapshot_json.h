// The snapshot reader's checks on plain data (snapshot_reader.cpp), shared by read_snapshot (a whole JSON tree) and
// read_snapshot_pickle (one pass over the pickle, JSON only for the parts that are not trace entries): both give
// the same Snapshot and the same errors, naming the file, the key's path and what was expected.
#pragma once

#include "memgate/allocator/replay.h"
#include "memgate/base/error.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace memgate::detail {

using nlohmann::json;

/// A value as an error message names it: "the integer 5", "a list of 3", "the string '...'" (40 bytes at most).
[[nodiscard]] std::string describe(const json& v);

/// Snapshot::texts, each text once.
class TextTable {
 public:
  explicit TextTable(std::vector<std::string>& texts) : texts_(texts) {
    for (std::size_t i = 0; i < texts_.size(); ++i) ids_.emplace(texts_[i], static_cast<std::uint32_t>(i));
  }
  std::uint32_t intern(const std::string& text) {
    const auto [it, added] = ids_.emplace(text, static_cast<std::uint32_t>(texts_.size()));
    if (added) texts_.push_back(text);
    return it->second;
  }

 private:
  std::vector<std::string>& texts_;
  std::unordered_map<std::string, std::uint32_t> ids_;
};

class Reader {
 public:
  explicit Reader(const std::string& origin) : origin_(origin) {}

  [[noreturn]] void fail(const std::string& path, std::string_view expected, const json& got) const {
    throw Error(fmt::format("{}: {}: expected {}, got {}", origin_, path, expected, describe(got)));
  }
  [[noreturn]] void fail(const std::string& path, std::string_view message) const {
    throw Error(fmt::format("{}: {}: {}", origin_, path, message));
  }
  const json& key(const json& obj, const std::string& path, const char* name) const {
    const auto it = obj.find(name);
    if (it == obj.end()) fail(path, fmt::format("the key '{}' is missing", name));
    return *it;
  }
  const json* optional_key(const json& obj, const char* name) const {
    const auto it = obj.find(name);
    return it == obj.end() ? nullptr : &*it;
  }
  const json& object(const json& v, const std::string& path) const {
    if (!v.is_object()) fail(path, "a dict", v);
    return v;
  }
  const json& list(const json& v, const std::string& path) const {
    if (!v.is_array()) fail(path, "a list", v);
    return v;
  }
  // Sizes of memory that existed (blocks, segments, requests served, free memory): up to kMaxSnapshotBytes.
  std::int64_t size(const json& v, const std::string& path) const {
    const auto n = count(v, path, "a size in bytes (an integer from 0 to 2^60)");
    if (n > kMaxSnapshotBytes) fail(path, "a size in bytes (an integer from 0 to 2^60: more than any GPU holds)", v);
    return n;
  }
  // A request that failed: a program may ask for any size PyTorch's int64 holds.
  std::int64_t request(const json& v, const std::string& path) const {
    return count(v, path, "a size in bytes (an integer from 0)");
  }
  std::int64_t count(const json& v, const std::string& path, std::string_view expected) const {
    if (v.is_number_integer() && !v.is_number_unsigned() && v.get<std::int64_t>() >= 0) return v.get<std::int64_t>();
    if (v.is_number_unsigned() && v.get<std::uint64_t>() <= static_cast<std::uint64_t>(INT64_MAX)) {
      return static_cast<std::int64_t>(v.get<std::uint64_t>());
    }
    fail(path, expected, v);
  }
  // A CUDA device's index: PyTorch's DeviceIndex is 8 or 16 bits, never negative in a snapshot.
  int device(const json& v, const std::string& path) const {
    if (v.is_number_unsigned() && v.get<std::uint64_t>() < kMaxSnapshotDevices) {
      return static_cast<int>(v.get<std::uint64_t>());
    }
    if (v.is_number_integer() && v.get<std::int64_t>() >= 0 && v.get<std::int64_t>() < kMaxSnapshotDevices) {
      return static_cast<int>(v.get<std::int64_t>());
    }
    fail(path, fmt::format("a device index (an integer from 0 to {})", kMaxSnapshotDevices - 1), v);
  }
  std::int64_t integer(const json& v, const std::string& path) const {
    if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<std::int64_t>();
    if (v.is_number_unsigned() && v.get<std::uint64_t>() <= static_cast<std::uint64_t>(INT64_MAX)) {
      return static_cast<std::int64_t>(v.get<std::uint64_t>());
    }
    fail(path, "an integer", v);
  }
  // Streams: 64 bits, as PyTorch casts the cudaStream_t to int64.
  std::uint64_t word(const json& v, const std::string& path) const {
    if (v.is_number_unsigned()) return v.get<std::uint64_t>();
    if (v.is_number_integer()) return static_cast<std::uint64_t>(v.get<std::int64_t>());
    fail(path, "a stream (an integer)", v);
  }
  // Addresses: a device pointer, never negative (PyTorch writes it as an int64; no GPU maps memory from 2^63).
  std::uint64_t address(const json& v, const std::string& path) const {
    if (v.is_number_unsigned()) return v.get<std::uint64_t>();
    if (v.is_number_integer() && v.get<std::int64_t>() >= 0) return static_cast<std::uint64_t>(v.get<std::int64_t>());
    fail(path, "an address (an integer from 0)", v);
  }
  // The memory from `address` for `size` bytes must not wrap past the top of the 64-bit address space.
  void fits_address_space(std::uint64_t address, std::int64_t size, const std::string& path) const {
    if (address > UINT64_MAX - static_cast<std::uint64_t>(size)) {
      fail(path, fmt::format("expected memory that ends within the 64-bit address space, not {:#x} + {} bytes",
                             address, size));
    }
  }
  std::string string(const json& v, const std::string& path) const {
    if (!v.is_string()) fail(path, "a string", v);
    return v.get<std::string>();
  }
  bool boolean(const json& v, const std::string& path) const {
    if (!v.is_boolean()) fail(path, "True or False", v);
    return v.get<bool>();
  }

 private:
  const std::string& origin_;
};

[[nodiscard]] TraceEvent::Action action_of(std::string_view name);
/// How much a frame of this file tells of the program: 3 its own Python, 2 any Python, 1 any other frame.
[[nodiscard]] int frame_rank(std::string_view file);
/// A frame as `where` names it: "file:line function", the file without its folders.
[[nodiscard]] std::string where_text(const std::string& file, std::int64_t line, const std::string& name);
/// The frame `where` names among an alloc's frames: the first of the highest rank.
[[nodiscard]] std::string where_of(const json& frames);

[[nodiscard]] AllocatorSettings read_settings(const Reader& r, const json& s, const std::string& origin,
                                              std::string& conf_text);
/// segments[i]; `reserved_by_device` sums the segments read so far.
[[nodiscard]] RecordedSegment read_segment(const Reader& r, const json& segment, const std::string& path,
                                           std::map<int, std::int64_t>& reserved_by_device);
/// device_traces[d][i]; `traced` sums the trace's sizes so far.
[[nodiscard]] TraceEvent read_event(const Reader& r, const json& entry, const std::string& path, std::int64_t& traced,
                                    TextTable& texts);

}  // namespace memgate::detail
