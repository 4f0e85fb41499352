// A reader of plain-data pickles (Python's pickle module, protocols 2-5, and torch's own Pickler), for memory
// snapshots: a small stack machine over the opcodes that carry data, refusing every opcode that names code or
// builds an object. Containers are built as a graph first (a memoized dict can be filled after it is memoized and
// then referenced), measured (size, depth, cycles) against the limits, and only then turned into JSON.
#include "memgate/allocator/snapshot_pickle.h"

#include "pickle_cursor.h"

#include "memgate/base/error.h"
#include "memgate/base/files.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace memgate {
namespace {

struct Node;
using NodePtr = std::shared_ptr<Node>;

struct List {
  std::vector<NodePtr> items;
};
struct Dict {
  std::vector<std::pair<NodePtr, NodePtr>> items;
};
struct Bytes {
  std::string data;
};

// A value on the machine's stack: scalars by value, containers shared (memo references alias them).
struct Node {
  std::variant<std::nullptr_t, bool, std::int64_t, std::uint64_t, double, std::string, Bytes, List, Dict> v;
  bool tuple = false;  // a tuple is a list that no opcode may append to
};

class Machine : detail::PickleCursor {
 public:
  Machine(std::string_view data, const std::string& origin) : PickleCursor(data, origin) {}
  // A container may hold itself (a hostile file's cycle): emptying every container frees them all.
  ~Machine() {
    for (const auto& node : containers_) {
      if (auto* list = std::get_if<List>(&node->v)) list->items.clear();
      if (auto* dict = std::get_if<Dict>(&node->v)) dict->items.clear();
    }
  }
  Machine(const Machine&) = delete;
  Machine& operator=(const Machine&) = delete;

  NodePtr run() {
    while (true) {
      const auto at = pos_;
      const auto op = byte();
      if (const char* name = detail::refused_opcode(op)) {
        fail(at, fmt::format("opcode {} names Python code or builds an object; a memory snapshot is plain data "
                             "(dicts, lists, strings, numbers), so memgate does not run it", name));
      }
      switch (op) {
        case 0x80: {  // PROTO
          const auto proto = byte();
          if (proto < 2 || proto > 5) fail(at, fmt::format("pickle protocol {}: expected 2 to 5", proto));
          break;
        }
        case 0x95: (void)fixed<std::uint64_t>(8); break;  // FRAME: a size hint
        case '.': {                                          // STOP
          if (stack_.size() != 1 || !marks_.empty()) fail(at, "STOP with a stack of other than one value");
          if (pos_ != data_.size()) fail(pos_, fmt::format("{} bytes after the pickle's end", data_.size() - pos_));
          return stack_.back();
        }
        case '}': push(Dict{}); break;
        case ']': push(List{}); break;
        case ')': push_tuple({}); break;
        case '(': marks_.push_back(stack_.size()); break;
        case 'N': push(nullptr); break;
        case 0x88: push(true); break;
        case 0x89: push(false); break;
        case 'J': push(static_cast<std::int64_t>(static_cast<std::int32_t>(fixed<std::uint32_t>(4)))); break;
        case 'K': push(static_cast<std::int64_t>(fixed<std::uint32_t>(1))); break;
        case 'M': push(static_cast<std::int64_t>(fixed<std::uint32_t>(2))); break;
        case 0x8a: push_long(at, fixed<std::uint64_t>(1)); break;  // LONG1
        case 0x8b: push_long(at, fixed<std::uint64_t>(4)); break;  // LONG4
        case 'G': {                                                     // BINFLOAT, big-endian
          const auto raw = take(8);
          std::uint64_t bits = 0;
          for (const char c : raw) bits = (bits << 8) | static_cast<unsigned char>(c);
          double d = 0;
          std::memcpy(&d, &bits, sizeof d);
          push(d);
          break;
        }
        case 0x8c: push(std::string(take(fixed<std::uint64_t>(1)))); break;  // SHORT_BINUNICODE
        case 'X': push(std::string(take(fixed<std::uint64_t>(4)))); break;   // BINUNICODE
        case 0x8d: push(std::string(take(fixed<std::uint64_t>(8)))); break;  // BINUNICODE8
        case 'C': push(Bytes{std::string(take(fixed<std::uint64_t>(1)))}); break;
        case 'B': push(Bytes{std::string(take(fixed<std::uint64_t>(4)))}); break;
        case 0x8e: push(Bytes{std::string(take(fixed<std::uint64_t>(8)))}); break;
        case 0x94: memoize(at); break;                              // MEMOIZE
        case 'q': put(at, fixed<std::uint64_t>(1)); break;          // BINPUT
        case 'r': put(at, fixed<std::uint64_t>(4)); break;          // LONG_BINPUT
        case 'h': get(at, fixed<std::uint64_t>(1)); break;          // BINGET
        case 'j': get(at, fixed<std::uint64_t>(4)); break;          // LONG_BINGET
        case 0x85: push_tuple(pop_n(at, 1)); break;                 // TUPLE1
        case 0x86: push_tuple(pop_n(at, 2)); break;                 // TUPLE2
        case 0x87: push_tuple(pop_n(at, 3)); break;                 // TUPLE3
        case 't': push_tuple(pop_mark(at)); break;                  // TUPLE
        case 'a': {                                                 // APPEND
          auto item = pop(at);
          list_at(at, top(at)).items.push_back(std::move(item));
          break;
        }
        case 'e': {  // APPENDS
          auto items = pop_mark(at);
          auto& list = list_at(at, top(at));
          for (auto& item : items) list.items.push_back(std::move(item));
          break;
        }
        case 's': {  // SETITEM
          auto value = pop(at);
          auto key = pop(at);
          dict_at(at, top(at)).items.emplace_back(std::move(key), std::move(value));
          break;
        }
        case 'u': {  // SETITEMS
          auto items = pop_mark(at);
          if (items.size() % 2 != 0) fail(at, "SETITEMS with an odd number of keys and values");
          auto& dict = dict_at(at, top(at));
          for (std::size_t i = 0; i < items.size(); i += 2) dict.items.emplace_back(items[i], items[i + 1]);
          break;
        }
        case '0': (void)pop(at); break;  // POP
        case '1': (void)pop_mark(at); break;  // POP_MARK
        case '2': stack_.push_back(top(at)); break;  // DUP
        default:
          fail(at, fmt::format("opcode 0x{:02x} is not one of a plain-data pickle's (protocols 2 to 5)", op));
      }
    }
  }

 private:
  // An unsigned little-endian integer of `n` bytes, as T.
  template <typename T>
  T fixed(int n) {
    return static_cast<T>(PickleCursor::fixed(n));
  }
  // LONG1/LONG4: little-endian two's complement of `n` bytes. memgate takes -2^63 to 2^64 - 1 (snapshots hold
  // unsigned 64-bit values, e.g. 2^64 - 1 for "none"): an int64, or a uint64 from 2^63 up.
  void push_long(std::size_t at, std::uint64_t n) {
    const auto raw = take(n);
    if (n == 0) return push(std::int64_t{0});
    auto at_byte = [&](std::size_t i) { return static_cast<unsigned char>(raw[i]); };
    const bool negative = (at_byte(raw.size() - 1) & 0x80) != 0;
    const unsigned char fill = negative ? 0xff : 0x00;
    for (std::size_t i = 8; i < raw.size(); ++i) {
      if (at_byte(i) != fill) fail(at, "an integer beyond 64 bits");
    }
    std::uint64_t v = negative ? ~std::uint64_t{0} : 0;
    for (std::size_t i = 0; i < std::min<std::size_t>(raw.size(), 8); ++i) {
      v &= ~(std::uint64_t{0xff} << (8 * i));
      v |= static_cast<std::uint64_t>(at_byte(i)) << (8 * i);
    }
    const bool top_bit = (v >> 63) != 0;
    if (negative && !top_bit) fail(at, "an integer beyond 64 bits");  // below -2^63
    if (!negative && top_bit) return push(v);                          // 2^63 .. 2^64 - 1
    push(static_cast<std::int64_t>(v));
  }

  template <typename T>
  void push(T value) {
    auto node = std::make_shared<Node>();
    node->v = std::move(value);
    if constexpr (std::is_same_v<T, List> || std::is_same_v<T, Dict>) containers_.push_back(node);
    stack_.push_back(std::move(node));
  }
  void push_tuple(std::vector<NodePtr> items) {
    auto node = std::make_shared<Node>();
    node->v = List{std::move(items)};
    node->tuple = true;
    containers_.push_back(node);
    stack_.push_back(std::move(node));
  }
  NodePtr top(std::size_t at) const {
    if (stack_.empty() || (!marks_.empty() && marks_.back() == stack_.size())) fail(at, "an opcode with no value to use");
    return stack_.back();
  }
  NodePtr pop(std::size_t at) {
    auto v = top(at);
    stack_.pop_back();
    return v;
  }
  std::vector<NodePtr> pop_n(std::size_t at, std::size_t n) {
    const std::size_t floor = marks_.empty() ? 0 : marks_.back();
    if (stack_.size() < floor + n) fail(at, fmt::format("a tuple of {} with fewer values on the stack", n));
    std::vector<NodePtr> out(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
    stack_.resize(stack_.size() - n);
    return out;
  }
  std::vector<NodePtr> pop_mark(std::size_t at) {
    if (marks_.empty()) fail(at, "an opcode that needs a MARK without one");
    const auto mark = marks_.back();
    marks_.pop_back();
    std::vector<NodePtr> out(stack_.begin() + static_cast<std::ptrdiff_t>(mark), stack_.end());
    stack_.resize(mark);
    return out;
  }
  List& list_at(std::size_t at, const NodePtr& node) const {
    auto* list = std::get_if<List>(&node->v);
    if (list == nullptr || node->tuple) fail(at, "APPEND to something that is not a list");
    return *list;
  }
  Dict& dict_at(std::size_t at, const NodePtr& node) const {
    auto* dict = std::get_if<Dict>(&node->v);
    if (dict == nullptr) fail(at, "SETITEM to something that is not a dict");
    return *dict;
  }
  // The memo is keyed by index, as Python's unpickler reads it: BINPUT and LONG_BINPUT may name any index (a
  // hostile file names 2^31 or 4e9), and an entry per PUT opcode keeps the memo within the file's size.
  void put(std::size_t at, std::uint64_t index) { memo_[index] = top(at); }
  // MEMOIZE stores at the memo's length, as Python does (len(memo), not the highest index plus one).
  void memoize(std::size_t at) {
    const auto index = static_cast<std::uint64_t>(memo_.size());
    memo_[index] = top(at);
  }
  void get(std::size_t at, std::uint64_t index) {
    const auto it = memo_.find(index);
    if (it == memo_.end()) fail(at, fmt::format("a memo index {} never stored", index));
    stack_.push_back(it->second);
  }

  std::vector<NodePtr> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<std::uint64_t, NodePtr> memo_;
  std::vector<NodePtr> containers_;
};

class ToJson {
 public:
  ToJson(const std::string& origin, const PickleLimits& limits) : origin_(origin), limits_(limits) {}

  // The values the JSON would hold, each memoized container counted at every reference, computed once per node
  // (saturating), so that a file whose references expand exponentially is refused before anything is expanded.
  // Nesting is checked the same way: a container met again deeper down than where it was first measured nests its
  // whole height there (memo references can stack chains of containers far deeper than any one path shows).
  std::int64_t expanded_size(const Node& node, int depth = 0) {
    if (depth > limits_.max_depth) fail(fmt::format("containers nested deeper than {}", limits_.max_depth));
    if (const auto it = measured_.find(&node); it != measured_.end()) {
      if (it->second.size < 0) fail("a container that contains itself");
      if (depth + it->second.height > limits_.max_depth) {
        fail(fmt::format("containers nested deeper than {}", limits_.max_depth));
      }
      return it->second.size;
    }
    const auto* list = std::get_if<List>(&node.v);
    const auto* dict = std::get_if<Dict>(&node.v);
    if (list == nullptr && dict == nullptr) return 1;
    measured_[&node] = {-1, 0};  // open: meeting it again below is a cycle
    Measure m{1, 0};
    auto add = [&](const Node& child) {
      m.size = std::min(limits_.max_values + 1, m.size + expanded_size(child, depth + 1));
      const auto it = measured_.find(&child);  // a container's height, or none for a scalar
      m.height = std::max(m.height, 1 + (it != measured_.end() ? it->second.height : 0));
    };
    if (list != nullptr) {
      for (const auto& item : list->items) add(*item);
    } else {
      for (const auto& [key, value] : dict->items) {
        add(*key);
        add(*value);
      }
    }
    measured_[&node] = m;
    return m.size;
  }

  // The JSON of `node`; expanded_size has refused cycles, depth and size on every path first.
  nlohmann::json convert(const Node& node) {
    return std::visit(
        [&](const auto& v) -> nlohmann::json {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, std::nullptr_t>) {
            return nullptr;
          } else if constexpr (std::is_same_v<T, Bytes>) {
            return nlohmann::json::binary(std::vector<std::uint8_t>(v.data.begin(), v.data.end()));
          } else if constexpr (std::is_same_v<T, std::string>) {
            return utf8_text(v);
          } else if constexpr (std::is_same_v<T, List>) {
            auto out = nlohmann::json::array();
            for (const auto& item : v.items) out.push_back(convert(*item));
            return out;
          } else if constexpr (std::is_same_v<T, Dict>) {
            auto out = nlohmann::json::object();
            for (const auto& [key, value] : v.items) {
              std::string name;
              if (const auto* s = std::get_if<std::string>(&key->v)) {
                name = utf8_text(*s);
              } else if (const auto* i = std::get_if<std::int64_t>(&key->v)) {
                name = std::to_string(*i);
              } else {
                fail("a dict key that is neither a string nor an integer");
              }
              out[name] = convert(*value);
            }
            return out;
          } else {
            return v;
          }
        },
        node.v);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(fmt::format("{}: not a memory snapshot pickle memgate can read: {}", origin_, what));
  }

  const std::string& origin_;
  const PickleLimits& limits_;
  // A container's expanded size (-1 while it is being measured) and height (how far below it its deepest value
  // nests: 0 when empty, 1 when it holds scalars only).
  struct Measure {
    std::int64_t size;
    int height;
  };
  std::map<const Node*, Measure> measured_;
};

}  // namespace

std::string utf8_text(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  const auto at = [&](std::size_t i) { return static_cast<unsigned char>(bytes[i]); };
  const auto escape = [&](unsigned char c) { out += fmt::format("\\x{:02x}", c); };
  std::size_t i = 0;
  while (i < bytes.size()) {
    const auto c = at(i);
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    // RFC 3629's well-formed sequences (what nlohmann::json writes): the second byte's range depends on the lead,
    // which rules out overlong forms, surrogates and code points past U+10FFFF.
    std::size_t more = 0;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
      more = 1;
    } else if (c >= 0xe0 && c <= 0xef) {
      more = 2;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      more = 3;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    }
    bool ok = more > 0 && more < bytes.size() - i;
    for (std::size_t k = 1; ok && k <= more; ++k) {
      const auto b = at(i + k);
      ok = k == 1 ? b >= lo && b <= hi : (b & 0xc0) == 0x80;
    }
    if (ok) {
      out.append(bytes.substr(i, more + 1));
      i += more + 1;
      continue;
    }
    // U+DC80..U+DCFF, as Python's pickle writes a file name it decoded with surrogateescape: the byte it stands for.
    if (c == 0xed && i + 2 < bytes.size() && (at(i + 1) == 0xb2 || at(i + 1) == 0xb3) && (at(i + 2) & 0xc0) == 0x80) {
      escape(static_cast<unsigned char>(((at(i + 1) & 0x03) << 6) | (at(i + 2) & 0x3f)));
      i += 3;
      continue;
    }
    escape(c);
    ++i;
  }
  return out;
}

nlohmann::json read_plain_pickle(std::string_view data, const std::string& origin, const PickleLimits& limits) {
  if (data.empty()) throw Error(origin + ": not a memory snapshot pickle memgate can read: the file is empty");
  if (static_cast<unsigned char>(data.front()) != 0x80) {
    throw Error(origin + ": not a memory snapshot pickle memgate can read: it does not start with a pickle's "
                         "protocol header (0x80: protocol 2 or later)");
  }
  Machine machine(data, origin);  // lives until the JSON is made: its destructor frees what the file built
  const auto root = machine.run();
  // The bound on values follows the file's size too, so that memory does: the JSON of a value is some 16 to 100
  // bytes, and a small file of memo references would otherwise expand to max_values.
  constexpr std::int64_t kFloor = std::int64_t{1} << 16;
  const auto size = static_cast<std::int64_t>(std::max<std::size_t>(data.size(), 1));
  const auto per_byte = std::max<std::int64_t>(limits.max_values_per_byte, 0);
  const auto by_size = per_byte >= (INT64_MAX - kFloor) / size ? INT64_MAX : kFloor + size * per_byte;
  const auto max_values = std::min(limits.max_values, by_size);
  PickleLimits bounded = limits;
  bounded.max_values = max_values;
  ToJson to_json(origin, bounded);
  if (to_json.expanded_size(*root) > max_values) {
    throw Error(fmt::format("{}: not a memory snapshot pickle memgate can read: more than {} values for a file of {} "
                            "bytes (memo references repeated to build a value this large?)",
                            origin, max_values, data.size()));
  }
  return to_json.convert(*root);
}

nlohmann::json load_plain_pickle(const std::string& path, const PickleLimits& limits) {
  const auto data = read_text_file(path, "a memory snapshot (.pickle)");
  return read_plain_pickle(data, path, limits);
}

}  // namespace memgate
