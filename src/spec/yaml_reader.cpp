// Strict YAML map reading with file:line errors (see yaml_reader.h).
#include "memgate/spec/yaml_reader.h"

#include "memgate/base/files.h"

#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

namespace memgate::detail {

namespace {

// Listens to the parser's events only to learn where a document starts.
class DocumentStarts : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override { line = mark.line + 1; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
  int line = 0;
};

}  // namespace

YAML::Node load_yaml_file(const std::string& path) {
  const auto text = read_text_file(path, "a YAML file");
  YAML::Node document;
  try {
    document = YAML::Load(text);
    // A second document would be ignored: say so. The parser is asked for two documents at most (yaml-cpp 0.7's
    // LoadAll never returns on some malformed input, which fuzzing found).
    std::istringstream in(text);
    YAML::Parser parser(in);
    DocumentStarts starts;
    if (parser.HandleNextDocument(starts) && parser.HandleNextDocument(starts)) {
      throw Error(path + ":" + std::to_string(starts.line) +
                  ": a second YAML document (after '---'): expected one document per file");
    }
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
    if (!n.IsScalar()) fail(key, range.str(), describe(n));
    try {
      std::size_t used = 0;
      v = std::stoll(n.Scalar(), &used);
      if (used != n.Scalar().size()) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      fail(key, range.str(), describe(n));
    }
    if (v < min || v > max) fail(key, range.str(), describe(n));
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
    if (!n.IsScalar()) fail(key, range.str(), describe(n));
    try {
      std::size_t used = 0;
      v = std::stod(n.Scalar(), &used);
      if (used != n.Scalar().size()) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      fail(key, range.str(), describe(n));
    }
    if (!std::isfinite(v) || v < min || v > max) fail(key, range.str(), describe(n));
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
      std::int64_t v = 0;
      try {
        std::size_t used = 0;
        if (!item.IsScalar()) throw std::invalid_argument("not scalar");
        v = std::stoll(item.Scalar(), &used);
        if (used != item.Scalar().size()) throw std::invalid_argument("trailing");
      } catch (const std::exception&) {
        fail(key, what.str(), describe(item));
      }
      if (v < min || v > max) fail(key, what.str(), describe(item));
      out.push_back(v);
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
      if (!known.empty()) msg << " (expected one of: " << known << ")";
      throw Error(msg.str());
    }
  }
}

}  // namespace memgate::detail
