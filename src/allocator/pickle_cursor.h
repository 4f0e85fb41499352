// What memgate's two pickle readers share (read_plain_pickle's general one in snapshot_pickle.cpp, and the streamed
// snapshot reader in snapshot_stream.cpp): the opcodes they refuse, and reading the file's bytes with errors that
// name the file and the byte offset.
#pragma once

#include "memgate/base/error.h"

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace memgate::detail {

/// The opcodes of pickle protocols 0-5 that memgate refuses (each would run code or make an object), by name;
/// nullptr for the others.
inline const char* refused_opcode(unsigned char op) {
  switch (op) {
    case 'c': return "GLOBAL";
    case 0x93: return "STACK_GLOBAL";
    case 'R': return "REDUCE";
    case 'b': return "BUILD";
    case 'i': return "INST";
    case 'o': return "OBJ";
    case 0x81: return "NEWOBJ";
    case 0x92: return "NEWOBJ_EX";
    case 'P': return "PERSID";
    case 'Q': return "BINPERSID";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    default: return nullptr;
  }
}

/// A pickle's bytes, read from the front: `pos_` is the next byte's offset.
class PickleCursor {
 protected:
  PickleCursor(std::string_view data, const std::string& origin) : data_(data), origin_(origin) {}

  [[noreturn]] void fail(std::size_t at, const std::string& what) const {
    throw Error(fmt::format("{}: not a memory snapshot pickle memgate can read: at byte {}: {}", origin_, at, what));
  }
  unsigned char byte() {
    if (pos_ >= data_.size()) fail(pos_, "the file ends before the pickle's STOP (truncated?)");
    return static_cast<unsigned char>(data_[pos_++]);
  }
  std::string_view take(std::uint64_t n) {
    if (n > data_.size() - pos_) {
      fail(pos_, fmt::format("a length of {} bytes runs past the end of the file ({} left: truncated?)", n,
                             data_.size() - pos_));
    }
    const auto out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  /// An unsigned little-endian integer of `n` bytes.
  std::uint64_t fixed(int n) {
    const auto raw = take(static_cast<std::uint64_t>(n));
    return le(raw.data(), n);
  }
  static std::uint64_t le(const char* p, int n) {
    std::uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
    return v;
  }

  std::string_view data_;
  const std::string& origin_;
  std::size_t pos_ = 0;
};

}  // namespace memgate::detail
