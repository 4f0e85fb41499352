// Memory snapshots read in one pass over their pickle: the same stack machine as read_plain_pickle (the opcodes
// that carry data, every opcode that names code refused), but values are 8 bytes that point back into the file,
// each trace entry becomes a TraceEvent as soon as its list takes it (its dict and its frames list are then
// dropped), and only the parts that are not trace entries (settings, final segments) become JSON, one at a time,
// for the checks read_snapshot makes. The result and every error are read_snapshot's.
#include "memgate/allocator/replay.h"

#include "pickle_cursor.h"
#include "snapshot_json.h"

#include "memgate/allocator/snapshot_pickle.h"
#include "memgate/base/error.h"
#include "memgate/base/files.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#define MEMGATE_MAP_SNAPSHOTS 1
#endif

namespace memgate {
namespace {

using nlohmann::json;
using detail::Reader;

// A value on the stack, in the memo or in a container: a tag and 60 bits, the byte offset of the opcode that made a
// scalar (decoded again when read) or a container's index.
enum class Tag : std::uint8_t { none, yes, no, scalar, list, tuple, dict };
struct Value {
  std::uint64_t bits = 0;
  static constexpr std::uint64_t kPayload = (std::uint64_t{1} << 60) - 1;
  static Value make(Tag tag, std::uint64_t payload) { return {(static_cast<std::uint64_t>(tag) << 60) | payload}; }
  [[nodiscard]] Tag tag() const { return static_cast<Tag>(bits >> 60); }
  [[nodiscard]] std::uint64_t payload() const { return bits & kPayload; }
  [[nodiscard]] bool container() const { return tag() == Tag::list || tag() == Tag::tuple || tag() == Tag::dict; }
};

// A list, tuple or dict (items in pairs), in 16 bytes. Once a trace entry is converted, its dict keeps only the
// event's index; its frames list only where it points (both no longer open: a file that changes them or reads them
// as something else goes the general way).
class Container {
 public:
  enum State : std::uint32_t { open, event, frames };
  Container() = default;
  Container(Container&& o) noexcept { *this = std::move(o); }
  Container(const Container&) = delete;
  Container& operator=(const Container&) = delete;
  Container& operator=(Container&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(cap_, o.cap_);
    return *this;
  }
  ~Container() { std::free(data_); }

  [[nodiscard]] State state() const { return cap_ >= kEvent ? static_cast<State>(cap_ - kEvent + 1) : open; }
  [[nodiscard]] std::span<const Value> items() const { return {data_, state() == open ? size_ : 0}; }
  [[nodiscard]] std::size_t size() const { return size_; }
  void append(const Value* first, std::size_t n) {
    if (n == 0) return;
    if (size_ + n > cap_) {
      auto cap = std::max<std::size_t>({4, size_ + n, std::size_t{cap_} * 2});
      if (cap >= kEvent) throw Error("a pickle container of more than 2^32 - 3 items");
      auto* data = static_cast<Value*>(std::realloc(data_, cap * sizeof(Value)));
      if (data == nullptr) throw std::bad_alloc();
      data_ = data;
      cap_ = static_cast<std::uint32_t>(cap);
    }
    std::memcpy(data_ + size_, first, n * sizeof(Value));
    size_ += static_cast<std::uint32_t>(n);
  }
  // Drops the items; keeps `payload` (event: the index in the records; frames: the text id of its `where`).
  void close(State state, std::uint32_t payload) {
    std::free(data_);
    data_ = nullptr;
    size_ = payload;
    cap_ = kEvent + static_cast<std::uint32_t>(state) - 1;
  }
  [[nodiscard]] std::uint32_t payload() const { return size_; }
 private:
  static constexpr std::uint32_t kEvent = UINT32_MAX - 1;
  Value* data_ = nullptr;
  std::uint32_t size_ = 0;
  std::uint32_t cap_ = 0;
};

// An array that grows by chunks of 1 MiB or so, never moving what it holds: no copy as it grows, and each chunk
// its own allocation, given back to the system when freed (release_front) rather than kept by the heap.
template <typename T>
class Chunked {
 public:
  static constexpr std::size_t kChunk = (std::size_t{1} << 20) / sizeof(T);
  T& operator[](std::size_t i) { return chunks_[i / kChunk - dropped_][i % kChunk]; }
  const T& operator[](std::size_t i) const { return chunks_[i / kChunk - dropped_][i % kChunk]; }
  [[nodiscard]] std::size_t size() const { return size_; }
  void push_back(T value) {
    if (size_ % kChunk == 0) chunks_.push_back(std::make_unique<T[]>(kChunk));
    chunks_.back()[size_ % kChunk] = std::move(value);
    ++size_;
  }
  // Frees the chunks wholly before index `i`.
  void release_before(std::size_t i) {
    while ((dropped_ + 1) * kChunk <= i && !chunks_.empty()) {
      chunks_.pop_front();
      ++dropped_;
    }
  }

 private:
  std::deque<std::unique_ptr<T[]>> chunks_;
  std::size_t size_ = 0;
  std::size_t dropped_ = 0;
};

// A scalar decoded from its opcode.
struct Scalar {
  enum Kind { i64, u64, f64, str, bytes } kind = i64;
  std::int64_t i = 0;
  std::uint64_t u = 0;
  double d = 0;
  std::string_view s;
};

// Thrown where the file is one PyTorch does not write (a converted trace entry changed or read as something else):
// the snapshot is then read the general way.
struct NeedsTree {};

constexpr std::int64_t kDeviceTracesDepth = 3;  // the root, device_traces, a device's trace: an entry's depth

class StreamReader : detail::PickleCursor {
 public:
  StreamReader(std::string_view data, const std::string& origin, std::function<void(std::size_t)> progress)
      : PickleCursor(data, origin), progress_(std::move(progress)), r_(origin), texts_(snap_.texts) {
    snap_.origin = origin;
    constexpr std::int64_t kFloor = std::int64_t{1} << 16;
    const PickleLimits limits;
    const auto size = static_cast<std::int64_t>(std::max<std::size_t>(data.size(), 1));
    max_values_ = std::min(limits.max_values, kFloor + size * limits.max_values_per_byte);
    max_depth_ = limits.max_depth;
  }

  Snapshot read() {
    if (data_.empty()) throw Error(origin_ + ": not a memory snapshot pickle memgate can read: the file is empty");
    if (static_cast<unsigned char>(data_.front()) != 0x80) {
      throw Error(origin_ + ": not a memory snapshot pickle memgate can read: it does not start with a pickle's "
                            "protocol header (0x80: protocol 2 or later)");
    }
    const auto root = run();
    if (bad_key_) fail_tree("a dict key that is neither a string nor an integer");
    walk(root);
    return std::move(snap_);
  }

 private:
  // ------------------------------------------------------------------------------------------------------------
  // The machine.

  Value run() {
    std::size_t next_progress = kProgressStep;
    while (true) {
      const auto at = pos_;
      if (at >= next_progress) {
        if (progress_) progress_(at);
        next_progress = at + kProgressStep;
      }
      const auto op = byte();
      switch (op) {
        case 0x80: {  // PROTO
          const auto proto = byte();
          if (proto < 2 || proto > 5) fail(at, fmt::format("pickle protocol {}: expected 2 to 5", proto));
          break;
        }
        case 0x95: (void)fixed(8); break;  // FRAME: a size hint
        case '.': {                          // STOP
          if (stack_.size() != 1 || !marks_.empty()) fail(at, "STOP with a stack of other than one value");
          if (pos_ != data_.size()) fail(pos_, fmt::format("{} bytes after the pickle's end", data_.size() - pos_));
          return stack_.back();
        }
        case '}': push_container(Tag::dict, {}); break;
        case ']': push_container(Tag::list, {}); break;
        case ')': push_container(Tag::tuple, {}); break;
        case '(': marks_.push_back(stack_.size()); break;
        case 'N': stack_.push_back(Value::make(Tag::none, 0)); break;
        case 0x88: stack_.push_back(Value::make(Tag::yes, 0)); break;
        case 0x89: stack_.push_back(Value::make(Tag::no, 0)); break;
        case 'J': skip_scalar(at, 4); break;
        case 'K': skip_scalar(at, 1); break;
        case 'M': skip_scalar(at, 2); break;
        case 'G': skip_scalar(at, 8); break;
        case 0x8a: {  // LONG1
          const auto n = fixed(1);
          check_long(at, take(n));
          stack_.push_back(Value::make(Tag::scalar, at));
          break;
        }
        case 0x8b: {  // LONG4
          const auto n = fixed(4);
          check_long(at, take(n));
          stack_.push_back(Value::make(Tag::scalar, at));
          break;
        }
        case 0x8c: case 'C': sized_scalar(at, 1); break;   // SHORT_BINUNICODE, SHORT_BINBYTES
        case 'X': case 'B': sized_scalar(at, 4); break;    // BINUNICODE, BINBYTES
        case 0x8d: case 0x8e: sized_scalar(at, 8); break;  // BINUNICODE8, BINBYTES8
        case 0x94: memo_put(memo_size(), top(at)); break;  // MEMOIZE: at the memo's length, as Python does
        case 'q': memo_put(fixed(1), top(at)); break;      // BINPUT
        case 'r': memo_put(fixed(4), top(at)); break;      // LONG_BINPUT
        case 'h': memo_get(at, fixed(1)); break;           // BINGET
        case 'j': memo_get(at, fixed(4)); break;           // LONG_BINGET
        case 0x85: push_tuple_of(at, 1); break;            // TUPLE1
        case 0x86: push_tuple_of(at, 2); break;            // TUPLE2
        case 0x87: push_tuple_of(at, 3); break;            // TUPLE3
        case 't': {                                        // TUPLE
          const auto mark = pop_mark(at);
          std::vector<Value> items(stack_.begin() + static_cast<std::ptrdiff_t>(mark), stack_.end());
          stack_.resize(mark);
          push_container(Tag::tuple, std::move(items));
          break;
        }
        case 'a': {  // APPEND
          const auto item = pop(at);
          auto& list = list_at(at, top(at));
          list.append(&item, 1);
          taken(item);
          break;
        }
        case 'e': {  // APPENDS
          const auto mark = pop_mark(at);
          auto& list = list_at(at, below(at, mark));
          list.append(stack_.data() + mark, stack_.size() - mark);
          for (auto i = mark; i < stack_.size(); ++i) taken(stack_[i]);
          stack_.resize(mark);
          break;
        }
        case 's': {  // SETITEM
          const auto value = pop(at);
          const auto key = pop(at);
          auto& dict = dict_at(at, top(at));
          check_key(key);
          const std::array<Value, 2> pair{key, value};
          dict.append(pair.data(), 2);
          break;
        }
        case 'u': {  // SETITEMS
          const auto mark = pop_mark(at);
          if ((stack_.size() - mark) % 2 != 0) fail(at, "SETITEMS with an odd number of keys and values");
          auto& dict = dict_at(at, below(at, mark));
          for (auto i = mark; i < stack_.size(); i += 2) check_key(stack_[i]);
          dict.append(stack_.data() + mark, stack_.size() - mark);
          stack_.resize(mark);
          break;
        }
        case '0': (void)pop(at); break;                       // POP
        case '1': stack_.resize(pop_mark(at)); break;         // POP_MARK
        case '2': stack_.push_back(top(at)); break;           // DUP
        default:
          if (const char* name = detail::refused_opcode(op)) {
            fail(at, fmt::format("opcode {} names Python code or builds an object; a memory snapshot is plain data "
                                 "(dicts, lists, strings, numbers), so memgate does not run it", name));
          }
          fail(at, fmt::format("opcode 0x{:02x} is not one of a plain-data pickle's (protocols 2 to 5)", op));
      }
    }
  }

  using PickleCursor::fail;  // beside fail(path, expected, got) below
  [[noreturn]] void fail_tree(const std::string& what) const {
    throw Error(fmt::format("{}: not a memory snapshot pickle memgate can read: {}", origin_, what));
  }

  void skip_scalar(std::size_t at, int n) {
    (void)take(static_cast<std::uint64_t>(n));
    stack_.push_back(Value::make(Tag::scalar, at));
  }
  void sized_scalar(std::size_t at, int n) {
    (void)take(fixed(n));
    stack_.push_back(Value::make(Tag::scalar, at));
  }
  // LONG1/LONG4: memgate takes -2^63 to 2^64 - 1, as read_plain_pickle does.
  void check_long(std::size_t at, std::string_view raw) const {
    if (raw.empty()) return;
    const auto at_byte = [&](std::size_t i) { return static_cast<unsigned char>(raw[i]); };
    const bool negative = (at_byte(raw.size() - 1) & 0x80) != 0;
    const unsigned char fill = negative ? 0xff : 0x00;
    for (std::size_t i = 8; i < raw.size(); ++i) {
      if (at_byte(i) != fill) fail(at, "an integer beyond 64 bits");
    }
    const auto v = long_value(raw);
    const bool top_bit = (v >> 63) != 0;
    if (negative && !top_bit) fail(at, "an integer beyond 64 bits");  // below -2^63
  }
  static std::uint64_t long_value(std::string_view raw) {
    if (raw.empty()) return 0;
    const bool negative = (static_cast<unsigned char>(raw.back()) & 0x80) != 0;
    std::uint64_t v = negative ? ~std::uint64_t{0} : 0;
    for (std::size_t i = 0; i < std::min<std::size_t>(raw.size(), 8); ++i) {
      v &= ~(std::uint64_t{0xff} << (8 * i));
      v |= static_cast<std::uint64_t>(static_cast<unsigned char>(raw[i])) << (8 * i);
    }
    return v;
  }

  // The scalar whose opcode is at `at` (checked when it was read).
  [[nodiscard]] Scalar decode(std::uint64_t at) const {
    const char* p = data_.data() + at;
    Scalar s;
    const auto sized = [&](int n, Scalar::Kind kind) {
      const auto length = le(p + 1, n);
      s.kind = kind;
      s.s = std::string_view(p + 1 + n, length);
    };
    switch (static_cast<unsigned char>(*p)) {
      case 'J': s.i = static_cast<std::int32_t>(static_cast<std::uint32_t>(le(p + 1, 4))); break;
      case 'K': s.i = static_cast<std::int64_t>(le(p + 1, 1)); break;
      case 'M': s.i = static_cast<std::int64_t>(le(p + 1, 2)); break;
      case 0x8a:
      case 0x8b: {
        const int n = static_cast<unsigned char>(*p) == 0x8a ? 1 : 4;
        const auto raw = std::string_view(p + 1 + n, le(p + 1, n));
        const auto v = long_value(raw);
        const bool negative = !raw.empty() && (static_cast<unsigned char>(raw.back()) & 0x80) != 0;
        if (!negative && (v >> 63) != 0) {
          s.kind = Scalar::u64;
          s.u = v;
        } else {
          s.i = static_cast<std::int64_t>(v);
        }
        break;
      }
      case 'G': {
        std::uint64_t bits = 0;
        for (int i = 1; i <= 8; ++i) bits = (bits << 8) | static_cast<unsigned char>(p[i]);
        s.kind = Scalar::f64;
        std::memcpy(&s.d, &bits, sizeof s.d);
        break;
      }
      case 0x8c: sized(1, Scalar::str); break;
      case 'X': sized(4, Scalar::str); break;
      case 0x8d: sized(8, Scalar::str); break;
      case 'C': sized(1, Scalar::bytes); break;
      case 'B': sized(4, Scalar::bytes); break;
      default: sized(8, Scalar::bytes); break;  // 0x8e
    }
    return s;
  }
  // The raw bytes of a str value, or nothing.
  [[nodiscard]] std::optional<std::string_view> str_of(Value v) const {
    if (v.tag() != Tag::scalar) return std::nullopt;
    const auto op = static_cast<unsigned char>(data_[v.payload()]);
    if (op != 0x8c && op != 'X' && op != 0x8d) return std::nullopt;
    return decode(v.payload()).s;
  }

  void push_container(Tag tag, std::vector<Value> items) {
    Container c;
    c.append(items.data(), items.size());
    containers_.push_back(std::move(c));
    stack_.push_back(Value::make(tag, containers_.size() - 1));
  }
  void push_tuple_of(std::size_t at, std::size_t n) {
    const std::size_t floor = marks_.empty() ? 0 : marks_.back();
    if (stack_.size() < floor + n) fail(at, fmt::format("a tuple of {} with fewer values on the stack", n));
    std::vector<Value> items(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
    stack_.resize(stack_.size() - n);
    push_container(Tag::tuple, std::move(items));
  }
  Value top(std::size_t at) const {
    if (stack_.empty() || (!marks_.empty() && marks_.back() == stack_.size())) fail(at, "an opcode with no value to use");
    return stack_.back();
  }
  // The value under the items from `mark` (the MARK just popped): what APPENDS and SETITEMS fill.
  Value below(std::size_t at, std::size_t mark) const {
    if (mark == 0 || (!marks_.empty() && marks_.back() == mark)) fail(at, "an opcode with no value to use");
    return stack_[mark - 1];
  }
  Value pop(std::size_t at) {
    const auto v = top(at);
    stack_.pop_back();
    return v;
  }
  std::size_t pop_mark(std::size_t at) {
    if (marks_.empty()) fail(at, "an opcode that needs a MARK without one");
    const auto mark = marks_.back();
    marks_.pop_back();
    return mark;
  }
  Container& open_container(Value v) {
    auto& c = containers_[v.payload()];
    if (c.state() != Container::open) throw NeedsTree{};  // a converted entry changed after its list took it
    return c;
  }
  Container& list_at(std::size_t at, Value v) {
    if (v.tag() != Tag::list) fail(at, "APPEND to something that is not a list");
    return open_container(v);
  }
  Container& dict_at(std::size_t at, Value v) {
    if (v.tag() != Tag::dict) fail(at, "SETITEM to something that is not a dict");
    return open_container(v);
  }
  // A dict key read_plain_pickle cannot name (JSON's keys are strings; integers become their decimal text).
  void check_key(Value key) {
    if (key.tag() != Tag::scalar) {
      bad_key_ = true;
      return;
    }
    const auto op = static_cast<unsigned char>(data_[key.payload()]);
    if (op == 0x8c || op == 'X' || op == 0x8d || op == 'J' || op == 'K' || op == 'M') return;
    if ((op == 0x8a || op == 0x8b) && decode(key.payload()).kind == Scalar::i64) return;
    bad_key_ = true;
  }

  // The memo, keyed by index as Python's unpickler keys it: dense from 0 as PyTorch's pickles use it, and a map for
  // the indices a hostile file scatters (2^31, 4e9), so that it stays within the file's size.
  [[nodiscard]] std::uint64_t memo_size() const { return dense_.size() + sparse_.size(); }
  void memo_put(std::uint64_t index, Value v) {
    if (index < dense_.size()) {
      dense_[index] = v;
    } else if (index == dense_.size() && !sparse_.contains(index)) {
      dense_.push_back(v);
      for (auto it = sparse_.find(dense_.size()); it != sparse_.end(); it = sparse_.find(dense_.size())) {
        dense_.push_back(it->second);
        sparse_.erase(it);
      }
    } else {
      sparse_[index] = v;
    }
  }
  void memo_get(std::size_t at, std::uint64_t index) {
    if (index < dense_.size()) {
      stack_.push_back(dense_[index]);
      return;
    }
    const auto it = sparse_.find(index);
    if (it == sparse_.end()) fail(at, fmt::format("a memo index {} never stored", index));
    stack_.push_back(it->second);
  }

  // ------------------------------------------------------------------------------------------------------------
  // Trace entries, converted as their list takes them.

  enum Key : int { k_action, k_addr, k_size, k_stream, k_device_free, k_frames, k_filename, k_line, k_name, k_count };
  static constexpr std::array<std::string_view, k_count> kKeys = {"action", "addr", "size", "stream", "device_free",
                                                                  "frames", "filename", "line", "name"};
  // Which of kKeys a dict key is (k_count: none); keys are memoized strings, so their offsets repeat.
  int key_of(Value key) {
    if (key.tag() != Tag::scalar) return k_count;
    const auto offset = key.payload();
    for (const auto& [o, k] : key_cache_) {
      if (o == offset) return k;
    }
    int found = k_count;
    if (const auto s = str_of(key)) {
      for (int k = 0; k < k_count; ++k) {
        if (*s == kKeys[static_cast<std::size_t>(k)]) found = k;
      }
    }
    if (key_cache_.size() < 64) key_cache_.emplace_back(offset, found);
    return found;
  }

  // A list took `item`: a trace entry's dict becomes a TraceEvent where read_event would accept it.
  void taken(Value item) {
    if (item.tag() != Tag::dict) return;
    auto& c = containers_[item.payload()];
    if (c.state() != Container::open || c.items().empty()) return;
    std::array<const Value*, k_count> at{};
    for (std::size_t i = 0; i + 1 < c.items().size(); i += 2) {
      const int k = key_of(c.items()[i]);
      if (k < k_filename) at[static_cast<std::size_t>(k)] = &c.items()[i + 1];
    }
    if (at[k_action] == nullptr) return;
    const auto action = str_of(*at[k_action]);
    if (!action) return;
    TraceEvent ev;
    // A known name is ASCII, as utf8_text() leaves it; an unknown one is kept as utf8_text() makes it.
    ev.action = detail::action_of(*action);
    using A = TraceEvent::Action;
    if (ev.action == A::other) ev.text = texts_.intern(utf8_text(*action));
    Scalar a, b;
    if (ev.action == A::oom) {
      if (!integer(at[k_device_free], a) || !is_size(a) || !integer(at[k_size], b) || !is_count(b)) return;
      ev.device_free = a.i;
      ev.size = b.i;
    } else if (ev.action != A::other && ev.action != A::snapshot && ev.action != A::user_defined) {
      if (!integer(at[k_addr], a) || !integer(at[k_size], b) || !is_size(b)) return;
      if (a.kind == Scalar::u64) {
        ev.addr = a.u;
      } else if (a.i >= 0) {
        ev.addr = static_cast<std::uint64_t>(a.i);
      } else {
        return;
      }
      ev.size = b.i;
      if (ev.addr > UINT64_MAX - static_cast<std::uint64_t>(ev.size)) return;
    }
    if (ev.action != A::other && ev.action != A::snapshot && ev.action != A::user_defined && at[k_stream]) {
      if (!integer(at[k_stream], a)) return;
      ev.stream = a.kind == Scalar::u64 ? a.u : static_cast<std::uint64_t>(a.i);
    }
    std::uint32_t where = 0;
    if (at[k_frames] != nullptr) {
      const auto frames = *at[k_frames];
      if (frames.tag() == Tag::list || frames.tag() == Tag::tuple) {
        auto& list = containers_[frames.payload()];
        if (list.state() == Container::open) {
          list.close(Container::frames, where_of(list));
        } else if (list.state() != Container::frames) {
          return;
        }
        where = list.payload();
      }
    }
    if (ev.action == A::alloc) ev.text = where;
    c.close(Container::event, static_cast<std::uint32_t>(records_.size()));
    records_.push_back(ev);
  }

  // An integer as JSON holds it (a bool or float is not one), into `out`.
  bool integer(const Value* v, Scalar& out) const {
    if (v == nullptr || v->tag() != Tag::scalar) return false;
    out = decode(v->payload());
    return out.kind == Scalar::i64 || out.kind == Scalar::u64;
  }
  static bool is_count(const Scalar& s) { return s.kind == Scalar::i64 && s.i >= 0; }
  static bool is_size(const Scalar& s) { return is_count(s) && s.i <= kMaxSnapshotBytes; }

  // where_of: the text id of the first frame of the highest rank, its text made once per frame dict.
  std::uint32_t where_of(const Container& frames) {
    Container* chosen = nullptr;
    std::uint32_t* chosen_info = nullptr;
    int rank = 0;
    for (const auto item : frames.items()) {
      if (item.tag() != Tag::dict) continue;
      auto& f = containers_[item.payload()];
      if (f.state() != Container::open) throw NeedsTree{};
      auto& info = frame_info_[item.payload()];
      if (info == 0) info = static_cast<std::uint32_t>(frame_rank(f));
      const int r = static_cast<int>(info & 3);
      if (r > rank) {
        rank = r;
        chosen = &f;
        chosen_info = &info;
        if (r == 3) break;
      }
    }
    if (chosen == nullptr) return 0;
    if ((*chosen_info >> 2) == 0) {
      const auto file = text_at(*chosen, k_filename);
      std::int64_t line = 0;
      Scalar s;
      if (integer(last(*chosen, k_line), s)) line = s.kind == Scalar::u64 ? static_cast<std::int64_t>(s.u) : s.i;
      const auto id = texts_.intern(detail::where_text(file, line, text_at(*chosen, k_name)));
      if (id >= (1U << 30)) throw NeedsTree{};
      *chosen_info |= id << 2;
    }
    return *chosen_info >> 2;
  }
  int frame_rank(const Container& f) { return detail::frame_rank(text_at(f, k_filename)); }
  const Value* last(const Container& dict, int key) {
    const Value* found = nullptr;
    for (std::size_t i = 0; i + 1 < dict.items().size(); i += 2) {
      if (key_of(dict.items()[i]) == key) found = &dict.items()[i + 1];
    }
    return found;
  }
  std::string text_at(const Container& dict, int key) {
    const auto* v = last(dict, key);
    const auto s = v != nullptr ? str_of(*v) : std::nullopt;
    return s ? utf8_text(*s) : std::string();
  }

  // ------------------------------------------------------------------------------------------------------------
  // The snapshot's structure, checked as read_snapshot checks it.

  // describe() of a value, as its JSON would read.
  std::string describe(Value v) {
    switch (v.tag()) {
      case Tag::none: return "None";
      case Tag::yes: return "True";
      case Tag::no: return "False";
      case Tag::list:
      case Tag::tuple: {
        const auto& c = containers_[v.payload()];
        if (c.state() != Container::open) throw NeedsTree{};
        return fmt::format("a list of {}", c.items().size());
      }
      case Tag::dict: return "a dict";
      case Tag::scalar: break;
    }
    const auto s = decode(v.payload());
    switch (s.kind) {
      case Scalar::i64: return fmt::format("the integer {}", s.i);
      case Scalar::u64: return fmt::format("the integer {}", s.u);
      case Scalar::f64: return fmt::format("the float {}", s.d);
      case Scalar::bytes: return "bytes";
      case Scalar::str: break;
    }
    return detail::describe(json(utf8_text(s.s)));
  }
  [[noreturn]] void fail(const std::string& path, std::string_view expected, Value got) {
    r_.fail(path, fmt::format("expected {}, got {}", expected, describe(got)));
  }

  // The JSON of a value, as read_plain_pickle makes it, with its bounds: nesting, cycles, values.
  json to_json(Value v, int depth) {
    if (depth > max_depth_) fail_tree(fmt::format("containers nested deeper than {}", max_depth_));
    if (++values_ > max_values_) {
      fail_tree(fmt::format("more than {} values for a file of {} bytes (memo references repeated to build a value "
                            "this large?)", max_values_, data_.size()));
    }
    switch (v.tag()) {
      case Tag::none: return nullptr;
      case Tag::yes: return true;
      case Tag::no: return false;
      case Tag::scalar: {
        const auto s = decode(v.payload());
        switch (s.kind) {
          case Scalar::i64: return s.i;
          case Scalar::u64: return s.u;
          case Scalar::f64: return s.d;
          case Scalar::str: return utf8_text(s.s);
          case Scalar::bytes: return json::binary(std::vector<std::uint8_t>(s.s.begin(), s.s.end()));
        }
        return nullptr;
      }
      default: break;
    }
    const auto index = v.payload();
    if (containers_[index].state() != Container::open) throw NeedsTree{};
    if (!open_.insert(index).second) fail_tree("a container that contains itself");
    json out;
    if (v.tag() == Tag::dict) {
      out = json::object();
      const auto& items = containers_[index].items();
      for (std::size_t i = 0; i + 1 < items.size(); i += 2) {
        ++values_;
        out[key_text(items[i])] = to_json(items[i + 1], depth + 1);
      }
    } else {
      out = json::array();
      for (const auto item : containers_[index].items()) out.push_back(to_json(item, depth + 1));
    }
    open_.erase(index);
    return out;
  }
  std::string key_text(Value key) {
    const auto s = decode(key.payload());  // check_key has refused every other key
    return s.kind == Scalar::str ? utf8_text(s.s) : std::to_string(s.i);
  }
  // A dict's JSON with only the keys read_snapshot reads (`nested`: the keys of the dicts a list under `list_key`
  // holds); anything else whole.
  json to_json_only(Value v, int depth, std::initializer_list<std::string_view> keys, std::string_view list_key = {},
                    std::initializer_list<std::string_view> nested = {}) {
    if (v.tag() != Tag::dict) return to_json(v, depth);
    const auto index = v.payload();
    if (containers_[index].state() != Container::open) throw NeedsTree{};
    json out = json::object();
    const auto& items = containers_[index].items();
    for (std::size_t i = 0; i + 1 < items.size(); i += 2) {
      auto key = key_text(items[i]);
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) continue;
      const auto value = items[i + 1];
      if (!list_key.empty() && key == list_key && (value.tag() == Tag::list || value.tag() == Tag::tuple) &&
          containers_[value.payload()].state() == Container::open) {
        json list = json::array();
        for (const auto item : containers_[value.payload()].items()) list.push_back(to_json_only(item, depth + 2, nested));
        out[key] = std::move(list);
      } else {
        out[key] = to_json(value, depth + 1);
      }
    }
    return out;
  }
  // The last value of `key` in a dict (a str key, as JSON's last-wins).
  const Value* member(Value dict, std::string_view key) {
    const auto& items = containers_[dict.payload()].items();
    const Value* found = nullptr;
    for (std::size_t i = 0; i + 1 < items.size(); i += 2) {
      if (key_text(items[i]) == key) found = &items[i + 1];
    }
    return found;
  }
  const Container& list(Value v, const std::string& path, std::string_view expected = "a list") {
    if (v.tag() != Tag::list && v.tag() != Tag::tuple) fail(path, expected, v);
    const auto& c = containers_[v.payload()];
    if (c.state() != Container::open) throw NeedsTree{};
    return c;
  }

  void walk(Value root) {
    if (root.tag() != Tag::dict || containers_[root.payload()].state() != Container::open) {
      if (root.tag() == Tag::dict) throw NeedsTree{};
      throw Error(fmt::format("{}: expected a memory snapshot (a dict with 'segments' and 'device_traces', as "
                              "torch.cuda.memory._dump_snapshot writes), got {}{}", origin_, describe(root),
                              root.tag() == Tag::list || root.tag() == Tag::tuple
                                  ? " (torch.cuda.memory_snapshot()'s list of segments has no trace)" : ""));
    }
    const auto* segments_value = member(root, "segments");
    if (segments_value == nullptr) r_.fail("snapshot", "the key 'segments' is missing");
    const auto& segments = list(*segments_value, "segments");
    const auto* traces_value = member(root, "device_traces");
    if (traces_value == nullptr) {
      throw Error(fmt::format("{}: the snapshot has no 'device_traces': record the trace with "
                              "torch.cuda.memory._record_memory_history() before _dump_snapshot", origin_));
    }
    if (const auto* settings_value = member(root, "allocator_settings")) {
      const auto settings = to_json(*settings_value, 1);
      snap_.has_settings = true;
      snap_.settings = detail::read_settings(r_, settings, origin_, snap_.settings_text);
      if (settings.is_object() && settings.contains("memgate_allocator")) {
        snap_.settings_text = "memgate:" + r_.string(settings["memgate_allocator"], "allocator_settings.memgate_allocator");
      }
    }
    std::map<int, std::int64_t> reserved_by_device;
    for (std::size_t i = 0; i < segments.items().size(); ++i) {
      const auto segment = to_json_only(segments.items()[i], 2,
                                        {"device", "address", "total_size", "stream", "segment_type", "is_expandable",
                                         "segment_pool_id", "blocks"},
                                        "blocks", {"address", "size", "requested_size", "state"});
      snap_.segments.push_back(detail::read_segment(r_, segment, fmt::format("segments[{}]", i), reserved_by_device));
    }
    const auto& traces = list(*traces_value, "device_traces");
    if (traces.items().size() > static_cast<std::size_t>(kMaxSnapshotDevices)) {
      fail("device_traces", fmt::format("a list of at most {} devices' traces", kMaxSnapshotDevices), *traces_value);
    }
    for (std::size_t d = 0; d < traces.items().size(); ++d) {
      const auto dpath = fmt::format("device_traces[{}]", d);
      const auto& trace = list(traces.items()[d], dpath);
      std::vector<TraceEvent> events;
      events.reserve(trace.items().size());
      std::int64_t traced = 0;
      for (std::size_t i = 0; i < trace.items().size(); ++i) {
        const auto item = trace.items()[i];
        if (item.tag() == Tag::dict && containers_[item.payload()].state() == Container::event) {
          const auto index = containers_[item.payload()].payload();
          if (index < records_front_) throw NeedsTree{};  // an entry in two places, after its record was given back
          const auto& ev = records_[index];
          using A = TraceEvent::Action;
          if (ev.action != A::other && ev.action != A::snapshot && ev.action != A::user_defined) {
            traced += ev.size <= kMaxSnapshotBytes ? ev.size : 0;
            if (traced > (std::int64_t{1} << 62)) {
              r_.fail(fmt::format("{}[{}].size", dpath, i),
                      "sizes that sum to at most 2^62 bytes over the trace (more than any real trace moves)",
                      json(ev.size));
            }
          }
          events.push_back(ev);
          // The common case, each entry once and in order: the records are given back as they are copied.
          if (index == records_front_) records_.release_before(++records_front_);
          continue;
        }
        const auto path = fmt::format("{}[{}]", dpath, i);
        const auto entry = to_json_only(item, kDeviceTracesDepth,
                                        {"action", "addr", "size", "stream", "device_free", "frames"});
        events.push_back(detail::read_event(r_, entry, path, traced, texts_));
      }
      snap_.device_traces.push_back(std::move(events));
    }
  }

  static constexpr std::size_t kProgressStep = std::size_t{16} << 20;

  std::function<void(std::size_t)> progress_;
  Snapshot snap_;
  Reader r_;
  detail::TextTable texts_;
  std::vector<Value> stack_;
  std::vector<std::size_t> marks_;
  Chunked<Value> dense_;
  std::unordered_map<std::uint64_t, Value> sparse_;
  Chunked<Container> containers_;
  Chunked<TraceEvent> records_;
  std::unordered_map<std::uint64_t, std::uint32_t> frame_info_;  // an open dict read as a frame: rank, text id << 2
  std::uint32_t records_front_ = 0;  // the index of records_.front()
  std::vector<std::pair<std::uint64_t, int>> key_cache_;
  bool bad_key_ = false;
  std::unordered_set<std::uint64_t> open_;  // containers to_json is inside
  std::int64_t values_ = 0, max_values_ = 0;
  int max_depth_ = 0;
};

}  // namespace

Snapshot read_snapshot_pickle(std::string_view data, const std::string& origin) {
  try {
    return StreamReader(data, origin, {}).read();
  } catch (const NeedsTree&) {
    return read_snapshot(read_plain_pickle(data, origin), origin);
  }
}

namespace {

#if MEMGATE_MAP_SNAPSHOTS
// A file mapped read-only; pages behind the reader are given back as it goes (they are read again from the file
// if a later value points into them).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) return;
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) return;
    size_ = static_cast<std::size_t>(st.st_size);
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
    if (p == MAP_FAILED) {
      size_ = 0;
      return;
    }
    data_ = static_cast<const char*>(p);
    (void)::madvise(p, size_, MADV_SEQUENTIAL);
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
    if (fd_ >= 0) ::close(fd_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  [[nodiscard]] bool mapped() const { return data_ != nullptr; }
  [[nodiscard]] std::string_view view() const { return {data_, size_}; }
  // Gives back the pages more than kKeep before `pos`.
  void release_before(std::size_t pos) const {
    constexpr std::size_t kKeep = std::size_t{8} << 20;
    const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    if (pos <= kKeep) return;
    const auto end = (pos - kKeep) / page * page;
    if (end > 0) (void)::madvise(const_cast<char*>(data_), end, MADV_DONTNEED);
  }

 private:
  int fd_ = -1;
  const char* data_ = nullptr;
  std::size_t size_ = 0;
};
#endif

}  // namespace

Snapshot load_snapshot(const std::string& path) {
#if MEMGATE_MAP_SNAPSHOTS
  const MappedFile file(path);
  if (file.mapped()) {
    try {
      return StreamReader(file.view(), path, [&](std::size_t pos) { file.release_before(pos); }).read();
    } catch (const NeedsTree&) {
      return read_snapshot(read_plain_pickle(file.view(), path), path);
    }
  }
#endif
  // Not mapped (an empty file, a pipe, a system without mmap): read, with the errors read_text_file gives.
  const auto data = read_text_file(path, "a memory snapshot (.pickle)");
  return read_snapshot_pickle(data, path);
}

}  // namespace memgate
