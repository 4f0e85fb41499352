// Strict YAML map reading with file:line errors (see yaml_reader.h).
#include "memgate/spec/yaml_reader.h"

#include "memgate/base/files.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>
#include <vector>

namespace memgate::detail {

namespace {

// One pass over the parser's events before anything is built: where the first document starts, and the bounds of
// what building it and walking it (a Python fixture's `args` become JSON, the hash covers them) will cost. An alias
// (*name) stands for all that its anchor (&name) holds, so it counts that many nodes and that deep a nesting: nine
// levels of nine aliases each are 387,420,489 nodes to a walk, from a file of 736 bytes. The pass itself costs what
// the text does (one record per anchor, one per open map or list).
class Bounds : public YAML::EventHandler {
 public:
  explicit Bounds(const std::string& file) : file_(file) {}
  void OnDocumentStart(const YAML::Mark& mark) override {
    if (line == 0) line = mark.line + 1;
    mark_ = mark;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override { leaf(mark, anchor); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    mark_ = mark;
    const auto it = anchors_.find(anchor);
    const Anchored a = it != anchors_.end() ? it->second : Anchored{1, 0};
    add(a.nodes);
    reach(static_cast<int>(open_.size()) + a.levels);
  }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor, const std::string&) override {
    leaf(mark, anchor);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    open(mark, anchor);
  }
  void OnSequenceEnd() override { close(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    open(mark, anchor);
  }
  void OnMapEnd() override { close(); }

  int line = 0;  ///< where the first document starts

 private:
  struct Anchored {
    std::int64_t nodes;  // with what aliases in it stand for
    int levels;          // of maps and lists, 0 for a scalar
  };
  struct Open {
    std::int64_t nodes_before;
    int level;
    int deepest;
    YAML::anchor_t anchor;
  };

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(file_ + ":" + std::to_string(mark_.line + 1) + ": " + what);
  }
  void add(std::int64_t n) {
    if (n > kMaxYamlNodes - nodes_) {
      fail("more than " + std::to_string(kMaxYamlNodes) +
           " YAML values (maps, lists, keys and scalars, an alias counted as all that its anchor holds): expected at "
           "most " + std::to_string(kMaxYamlNodes) + " (a fixture, a suite or a GPU file needs a few hundred)");
    }
    nodes_ += n;
  }
  void reach(int level) {
    if (level > kMaxYamlDepth) {
      fail("maps and lists nested deeper than " + std::to_string(kMaxYamlDepth) +
           " levels (an alias counted as what its anchor holds): expected at most " + std::to_string(kMaxYamlDepth));
    }
    if (!open_.empty()) open_.back().deepest = std::max(open_.back().deepest, level);
  }
  void leaf(const YAML::Mark& mark, YAML::anchor_t anchor) {
    mark_ = mark;
    add(1);
    if (anchor != YAML::NullAnchor) anchors_[anchor] = Anchored{1, 0};
  }
  void open(const YAML::Mark& mark, YAML::anchor_t anchor) {
    mark_ = mark;
    const auto before = nodes_;
    add(1);
    const int level = static_cast<int>(open_.size()) + 1;
    reach(level);
    open_.push_back({before, level, level, anchor});
  }
  void close() {
    if (open_.empty()) return;
    const auto done = open_.back();
    open_.pop_back();
    if (done.anchor != YAML::NullAnchor) {
      anchors_[done.anchor] = Anchored{nodes_ - done.nodes_before, done.deepest - done.level + 1};
    }
    if (!open_.empty()) open_.back().deepest = std::max(open_.back().deepest, done.deepest);
  }

  const std::string& file_;
  YAML::Mark mark_;
  std::int64_t nodes_ = 0;
  std::vector<Open> open_;
  std::unordered_map<YAML::anchor_t, Anchored> anchors_;
};

}  // namespace

std::string nearest_key(const std::string& key, const std::set<std::string>& known) {
  const auto distance = [](const std::string& a, const std::string& b) {
    std::vector<std::size_t> row(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
      std::size_t diagonal = row[0];
      row[0] = i;
      for (std::size_t j = 1; j <= b.size(); ++j) {
        const auto above = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
        diagonal = above;
      }
    }
    return row[b.size()];
  };
  std::string best;
  std::size_t best_distance = 3;
  bool tie = false;
  for (const auto& k : known) {
    auto d = distance(key, k);
    const auto& shorter = key.size() < k.size() ? key : k;
    const auto& longer = key.size() < k.size() ? k : key;
    if (shorter.size() >= 3 && longer.compare(0, shorter.size() + 1, shorter + "_") == 0) {
      d = std::min<std::size_t>(d, 2);
    }
    if (d < best_distance) {
      best = k;
      best_distance = d;
      tie = false;
    } else if (d == best_distance) {
      tie = true;
    }
  }
  return tie ? std::string() : best;
}

namespace {

// The file's text, at most kMaxYamlBytes of it: a larger file is an error before it is read whole.
std::string read_bounded(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (std::filesystem::exists(status) && !std::filesystem::is_directory(status)) {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      std::string text(static_cast<std::size_t>(kMaxYamlBytes) + 1, '\0');
      in.read(text.data(), static_cast<std::streamsize>(text.size()));
      if (in.bad()) throw Error(path + ": reading failed: " + std::strerror(errno));
      text.resize(static_cast<std::size_t>(in.gcount()));
      if (text.size() > kMaxYamlBytes) {
        const auto size = std::filesystem::is_regular_file(status) ? std::filesystem::file_size(path, ec) : 0;
        throw Error(path + ": " + (size > 0 && !ec ? std::to_string(size) + " bytes" : std::string("more bytes")) +
                    ": expected a YAML file of at most " + std::to_string(kMaxYamlBytes) +
                    " bytes (1 MiB; a fixture, a suite or a GPU file is a few KiB)");
      }
      return text;
    }
  }
  return read_text_file(path, "a YAML file");  // its error: not there, a folder, not readable
}

// A YAML scalar's whole text as a number, read by `parse` (std::stoll, std::stod); nothing where the node is not a
// scalar, its text is no such number, or more follows the number.
template <typename Parse>
auto whole_number(const YAML::Node& n, Parse parse) -> std::optional<decltype(parse(std::string(), nullptr))> {
  if (!n.IsScalar()) return std::nullopt;
  try {
    std::size_t used = 0;
    const auto v = parse(n.Scalar(), &used);
    if (used == n.Scalar().size()) return v;
  } catch (const std::exception&) {
    // not a number, or out of the type's range: nothing
  }
  return std::nullopt;
}

std::optional<std::int64_t> whole_integer(const YAML::Node& n) {
  return whole_number(n, [](const std::string& text, std::size_t* used) -> std::int64_t {
    return std::stoll(text, used);
  });
}

std::optional<double> whole_double(const YAML::Node& n) {
  return whole_number(n, [](const std::string& text, std::size_t* used) { return std::stod(text, used); });
}

}  // namespace

YAML::Node load_yaml_file(const std::string& path) {
  const auto text = read_bounded(path);
  YAML::Node document;
  try {
    // Bounded first (see Bounds); then a second document would be ignored: say so. The parser is asked for two
    // documents at most (yaml-cpp 0.7's LoadAll never returns on some malformed input, which fuzzing found).
    std::istringstream in(text);
    YAML::Parser parser(in);
    Bounds bounds(path);
    if (parser.HandleNextDocument(bounds) && parser.HandleNextDocument(bounds)) {
      throw Error(path + ":" + std::to_string(bounds.line) +
                  ": a second YAML document (after '---'): expected one document per file");
    }
    document = YAML::Load(text);
  } catch (const YAML::DeepRecursion& e) {  // yaml-cpp's own bound, past the one above
    throw Error(path + ":" + std::to_string(e.mark.line + 1) + ": maps and lists nested deeper than " +
                std::to_string(kMaxYamlDepth) + " levels: expected at most " + std::to_string(kMaxYamlDepth));
  } catch (const YAML::Exception& e) {
    throw Error(path + ":" + std::to_string(e.mark.line + 1) + ": not valid YAML: " + e.msg);
  }
  return document;
}

std::string describe(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing";
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return "a list";
  return "'" + node.Scalar() + "'";
}

MapReader::MapReader(YAML::Node node, std::string file, std::string path, nlohmann::json* out)
    : node_(std::move(node)), file_(std::move(file)), path_(std::move(path)), out_(out) {
  if (node_.IsDefined() && !node_.IsNull() && !node_.IsMap()) {
    std::ostringstream msg;
    msg << file_ << ":" << node_.Mark().line + 1 << ": " << (path_.empty() ? "the document" : path_)
        << ": expected a map of keys, got " << describe(node_);
    throw Error(msg.str());
  }
  if (out_ != nullptr && !out_->is_object()) *out_ = nlohmann::json::object();
  // A key given twice: YAML says keys are unique, yaml-cpp keeps both and reads the first; say so instead. Checked
  // map by map as they are read (a walk over the whole tree would be exponential for aliases of aliases).
  if (node_.IsMap()) {
    std::map<std::string, int> lines;
    for (const auto& item : node_) {
      const auto key = item.first.IsScalar() ? item.first.Scalar() : std::string("(a complex key)");
      const int line = item.first.Mark().line + 1;
      if (const auto [it, fresh] = lines.emplace(key, line); !fresh) {
        throw Error(file_ + ":" + std::to_string(line) + ": " + key_path(key) + ": given twice (first on line " +
                    std::to_string(it->second) + "): expected each key once");
      }
    }
  }
}

std::string MapReader::key_path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

int MapReader::line_of(const std::string& key) const {
  if (node_.IsMap()) {
    for (const auto& kv : node_) {
      if (kv.first.Scalar() == key) return kv.first.Mark().line + 1;
    }
  }
  return node_.Mark().line >= 0 ? node_.Mark().line + 1 : 1;
}

void MapReader::fail(const std::string& key, const std::string& expected, const std::string& got) const {
  std::ostringstream msg;
  msg << file_ << ":" << line_of(key) << ": " << key_path(key) << ": expected " << expected;
  if (!got.empty()) msg << ", got " << got;
  throw Error(msg.str());
}

bool MapReader::has(const std::string& key) const {
  return node_.IsMap() && node_[key].IsDefined() && !node_[key].IsNull();
}

bool MapReader::optional(const std::string& key) {
  read_.insert(key);
  return has(key);
}

YAML::Node MapReader::value(const std::string& key) const {
  if (!node_.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
  return node_[key];
}

void MapReader::record(const std::string& key, nlohmann::json value) {
  read_.insert(key);
  if (out_ != nullptr) (*out_)[key] = std::move(value);
}

void MapReader::leave_out_of_hash(const std::string& key) {
  if (out_ != nullptr) out_->erase(key);
}

std::int64_t MapReader::get_int(const std::string& key, std::optional<std::int64_t> fallback, std::int64_t min,
                                std::int64_t max) {
  std::ostringstream range;
  if (max == INT64_MAX) range << "an integer >= " << min;
  else range << "an integer from " << min << " to " << max;
  std::int64_t v = 0;
  if (!has(key)) {
    if (!fallback) fail(key, range.str() + " (the key is required)", "nothing");
    v = *fallback;
  } else {
    auto n = value(key);
    const auto parsed = whole_integer(n);
    if (!parsed || *parsed < min || *parsed > max) fail(key, range.str(), describe(n));
    v = *parsed;
  }
  record(key, v);
  return v;
}

double MapReader::get_double(const std::string& key, std::optional<double> fallback, double min, double max) {
  std::ostringstream range;
  range << "a number from " << min << " to " << max;
  double v = 0;
  if (!has(key)) {
    if (!fallback) fail(key, range.str() + " (the key is required)", "nothing");
    v = *fallback;
  } else {
    auto n = value(key);
    const auto parsed = whole_double(n);
    if (!parsed || !std::isfinite(*parsed) || *parsed < min || *parsed > max) fail(key, range.str(), describe(n));
    v = *parsed;
  }
  record(key, v);
  return v;
}

bool MapReader::get_bool(const std::string& key, std::optional<bool> fallback) {
  bool v = false;
  if (!has(key)) {
    if (!fallback) fail(key, "true or false (the key is required)", "nothing");
    v = *fallback;
  } else {
    auto n = value(key);
    const std::string s = n.IsScalar() ? n.Scalar() : "";
    if (s == "true" || s == "True") v = true;
    else if (s == "false" || s == "False") v = false;
    else fail(key, "true or false", describe(n));
  }
  record(key, v);
  return v;
}

namespace {
std::string one_of(const std::vector<std::string>& allowed) {
  std::string s = "one of ";
  for (std::size_t i = 0; i < allowed.size(); ++i) s += (i ? ", " : "") + allowed[i];
  return s;
}
}  // namespace

std::string MapReader::get_string(const std::string& key, std::optional<std::string> fallback,
                                  const std::vector<std::string>& allowed) {
  const std::string what = allowed.empty() ? std::string("a string") : one_of(allowed);
  std::string v;
  if (!has(key)) {
    if (!fallback) fail(key, what + " (the key is required)", "nothing");
    v = *fallback;
  } else {
    auto n = value(key);
    if (!n.IsScalar()) fail(key, what, describe(n));
    v = n.Scalar();
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
      fail(key, what, describe(n));
    }
  }
  record(key, v);
  return v;
}

std::vector<std::int64_t> MapReader::get_int_list(const std::string& key,
                                                  std::optional<std::vector<std::int64_t>> fallback,
                                                  std::int64_t min, std::int64_t max) {
  std::ostringstream what;
  what << "a list of integers >= " << min;
  if (max != INT64_MAX) what << " and <= " << max;
  std::vector<std::int64_t> out;
  if (!has(key)) {
    if (!fallback) fail(key, what.str() + " (the key is required)", "nothing");
    out = *fallback;
  } else {
    auto n = value(key);
    if (!n.IsSequence() || n.size() == 0) fail(key, "a non-empty " + what.str().substr(2), describe(n));
    for (const auto& item : n) {
      const auto v = whole_integer(item);
      if (!v || *v < min || *v > max) fail(key, what.str(), describe(item));
      out.push_back(*v);
    }
  }
  record(key, out);
  return out;
}

std::vector<std::string> MapReader::get_string_list(const std::string& key,
                                                    std::optional<std::vector<std::string>> fallback,
                                                    const std::vector<std::string>& allowed) {
  const std::string what = "a list of " + (allowed.empty() ? std::string("strings") : one_of(allowed));
  std::vector<std::string> out;
  if (!has(key)) {
    if (!fallback) fail(key, what + " (the key is required)", "nothing");
    out = *fallback;
  } else {
    auto n = value(key);
    if (!n.IsSequence()) fail(key, what, describe(n));
    for (const auto& item : n) {
      if (!item.IsScalar()) fail(key, what, describe(item));
      if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), item.Scalar()) == allowed.end()) {
        fail(key, what, describe(item));
      }
      out.push_back(item.Scalar());
    }
  }
  record(key, out);
  return out;
}

MapReader MapReader::child(const std::string& key, bool required) {
  if (required && !has(key)) fail(key, "a map (the key is required)", "nothing");
  read_.insert(key);
  nlohmann::json* sub = nullptr;
  if (out_ != nullptr) {
    (*out_)[key] = nlohmann::json::object();
    sub = &(*out_)[key];
  }
  auto n = value(key);
  if (n.IsDefined() && !n.IsNull() && !n.IsMap()) fail(key, "a map of keys", describe(n));
  return {n.IsDefined() ? n : YAML::Node(YAML::NodeType::Map), file_, key_path(key), sub};
}

std::vector<YAML::Node> MapReader::get_sequence(const std::string& key, bool required) {
  read_.insert(key);
  std::vector<YAML::Node> out;
  if (!has(key)) {
    if (required) fail(key, "a list (the key is required)", "nothing");
    return out;
  }
  auto n = value(key);
  if (!n.IsSequence()) fail(key, "a list", describe(n));
  for (const auto& item : n) out.push_back(item);
  return out;
}

void MapReader::finish() const {
  if (!node_.IsMap()) return;
  for (const auto& kv : node_) {
    const auto key = kv.first.Scalar();
    if (read_.count(key) == 0) {
      std::ostringstream msg;
      msg << file_ << ":" << kv.first.Mark().line + 1 << ": " << key_path(key) << ": unknown key";
      std::string known;
      for (const auto& k : read_) known += (known.empty() ? "" : ", ") + k;
      if (const auto near = nearest_key(key, read_); !near.empty()) msg << ": did you mean '" << near << "'?";
      if (!known.empty()) msg << " (expected one of: " << known << ")";
      throw Error(msg.str());
    }
  }
}

}  // namespace memgate::detail
