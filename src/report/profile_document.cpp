// Profile and advice JSON read back strictly enough that a report never draws a number it misread.
#include "memgate/report/profile_document.h"

#include "memgate/base/error.h"
#include "memgate/base/files.h"

#include <algorithm>
#include <fmt/format.h>

#include <filesystem>
#include <map>

namespace memgate {
namespace {

// A JSON value with where it sits in its file, for errors: "out/a.json: probes[2].components.params: ...".
class Node {
 public:
  Node(const nlohmann::json& j, std::string source, std::string path)
      : j_(j), source_(std::move(source)), path_(std::move(path)) {}

  [[nodiscard]] bool has(const char* key) const { return j_.is_object() && j_.contains(key) && !j_[key].is_null(); }
  [[nodiscard]] Node at(const char* key, const char* expected) const {
    if (!has(key)) fail(child(key), fmt::format("missing; expected {}", expected));
    return {j_[key], source_, child(key)};
  }
  [[nodiscard]] Node item(std::size_t i) const { return {j_[i], source_, fmt::format("{}[{}]", path_, i)}; }
  [[nodiscard]] std::size_t size() const { return j_.size(); }

  [[nodiscard]] std::string string(const char* key) const { return at(key, "a string").as_string(); }
  [[nodiscard]] std::string string_or(const char* key, std::string fallback) const {
    return has(key) ? at(key, "a string").as_string() : fallback;
  }
  [[nodiscard]] std::int64_t integer(const char* key) const { return at(key, "an integer").as_integer(); }
  [[nodiscard]] std::int64_t integer_or(const char* key, std::int64_t fallback) const {
    return has(key) ? at(key, "an integer").as_integer() : fallback;
  }
  [[nodiscard]] std::optional<std::int64_t> optional_integer(const char* key) const {
    if (!has(key)) return std::nullopt;
    return at(key, "an integer").as_integer();
  }
  [[nodiscard]] double number_or(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const auto n = at(key, "a number");
    if (!n.j_.is_number()) n.fail_type("a number");
    return n.j_.get<double>();
  }
  [[nodiscard]] bool boolean_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const auto n = at(key, "true or false");
    if (!n.j_.is_boolean()) n.fail_type("true or false");
    return n.j_.get<bool>();
  }
  [[nodiscard]] Node array(const char* key) const {
    auto n = at(key, "an array");
    if (!n.j_.is_array()) n.fail_type("an array");
    return n;
  }
  [[nodiscard]] Node object(const char* key) const {
    auto n = at(key, "an object");
    if (!n.j_.is_object()) n.fail_type("an object");
    return n;
  }
  [[nodiscard]] std::string as_string() const {
    if (!j_.is_string()) fail_type("a string");
    return j_.get<std::string>();
  }
  [[nodiscard]] std::int64_t as_integer() const {
    if (!j_.is_number_integer()) fail_type("an integer");
    return j_.get<std::int64_t>();
  }
  [[noreturn]] void fail_type(const char* expected) const {
    fail(path_, fmt::format("expected {}, got {}", expected, j_.type_name()));
  }
  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw Error(fmt::format("{}: {}: {}", source_, where.empty() ? "(top level)" : where, what));
  }
  [[nodiscard]] const std::string& path() const { return path_; }
  [[nodiscard]] const std::string& source() const { return source_; }
  [[nodiscard]] const nlohmann::json& json() const { return j_; }

 private:
  [[nodiscard]] std::string child(const char* key) const { return path_.empty() ? key : path_ + "." + key; }

  const nlohmann::json& j_;
  std::string source_;
  std::string path_;
};

std::int64_t bytes_at(const Node& n, const char* key) {
  const auto value = n.integer(key);
  if (value < 0) n.fail(n.path() + "." + key, fmt::format("expected bytes (>= 0), got {}", value));
  return value;
}

DocumentProbe read_probe(const Node& p) {
  DocumentProbe probe;
  probe.batch_size = p.integer("batch_size");
  if (probe.batch_size < 1) p.fail(p.path() + ".batch_size", "expected an integer >= 1");
  probe.oom = p.boolean_or("oom", false);
  probe.failed = p.boolean_or("failed", false);
  if (probe.oom || probe.failed) {
    probe.error = p.string_or("error", probe.oom ? "out of memory" : "failed");
    probe.error = probe.error.substr(0, probe.error.find('\n'));
    return probe;
  }
  const auto components = p.object("components");
  for (const auto& info : kComponentTable) {
    if (info.present != nullptr) {
      if (!components.has(info.name.data())) continue;  // `ema`: only where the fixture keeps an EMA copy
      probe.components.*info.present = true;
    }
    probe.components.*info.member = bytes_at(components, info.name.data());
  }
  if (p.has("modules")) {
    probe.modules = module_breakdown_from_json(p.object("modules").json(), fmt::format("{}: {}.modules", p.source(), p.path()));
  }
  probe.step_seconds = p.number_or("step_seconds", 0.0);
  return probe;
}

DocumentTarget read_target(const Node& t) {
  DocumentTarget target;
  target.id = t.string("id");
  target.name = t.string_or("name", target.id);
  target.usable_bytes = bytes_at(t, "usable_bytes");
  target.batch_size = t.optional_integer("batch_size");
  target.predicted = t.optional_integer("predicted_batch_size");
  if (t.has("fit")) {
    const auto fit = t.object("fit");
    target.fixed_bytes = fit.number_or("fixed_bytes", 0.0);
    target.per_sample_bytes = fit.number_or("per_sample_bytes", 0.0);
  }
  if (t.has("trials")) {
    const auto trials = t.array("trials");
    for (std::size_t i = 0; i < trials.size(); ++i) {
      const auto trial = trials.item(i);
      target.trials.push_back({trial.integer("batch_size"), trial.boolean_or("fits", false),
                               trial.optional_integer("peak_bytes")});
    }
  }
  target.wanted_batch = t.integer_or("wanted_batch", 0);
  if (t.has("accumulation")) {
    const auto a = t.object("accumulation");
    if (a.boolean_or("fits", false)) {
      target.effective_batch = a.integer("effective_batch");
      target.micro_batch = a.integer("micro_batch");
      target.accumulation_steps = a.integer("steps");
    }
  }
  if (t.has("variants")) {
    const auto variants = t.array("variants");
    for (std::size_t i = 0; i < variants.size(); ++i) {
      const auto v = variants.item(i);
      target.variants.push_back({v.string("name"), v.string_or("change", ""), v.optional_integer("batch_size")});
    }
  }
  return target;
}

}  // namespace

bool ProfileDocument::has(const ComponentInfo& info) const {
  return std::any_of(probes.begin(), probes.end(),
                     [&](const DocumentProbe& p) { return p.measured() && has_component(p.components, info); });
}

const DocumentProbe* ProfileDocument::measured(std::int64_t batch_size) const {
  for (const auto& p : probes) {
    if (p.batch_size == batch_size && p.measured()) return &p;
  }
  return nullptr;
}

ProfileDocument profile_document_from_json(const nlohmann::json& json, const std::string& source) {
  const Node root(json, source, "");
  if (!json.is_object()) root.fail_type("a JSON object (the output of memgate profile, estimate or advise)");
  ProfileDocument doc;
  const auto device = root.object("device");
  doc.device_slug = device.string("slug");
  doc.device_name = device.string_or("name", doc.device_slug);
  const auto model = root.object("model");
  doc.model = model.string("name");
  doc.fixture_hash = model.string_or("fixture_hash", "");
  doc.total_params = model.integer_or("total_params", 0);
  doc.trainable_params = model.integer_or("trainable_params", 0);
  doc.frozen_params = model.integer_or("frozen_params", 0);
  doc.estimated = root.boolean_or("estimated", false);
  if (root.has("probes")) {
    const auto probes = root.array("probes");
    for (std::size_t i = 0; i < probes.size(); ++i) doc.probes.push_back(read_probe(probes.item(i)));
  } else if (root.has("targets")) {
    doc.kind = ProfileDocument::Kind::kAdvice;
    const auto targets = root.array("targets");
    for (std::size_t i = 0; i < targets.size(); ++i) doc.targets.push_back(read_target(targets.item(i)));
  } else {
    root.fail("probes", "missing; expected the probes of memgate profile (or the targets of memgate advise)");
  }
  return doc;
}

ProfileDocument load_profile_document(const std::string& path) {
  const auto text = read_text_file(path, "a profile or advice JSON file (memgate profile/advise --output)");
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // a syntax error, or a number out of range (1e309)
    throw Error(fmt::format("{}: not valid JSON ({})", path, e.what()));
  }
  auto doc = profile_document_from_json(json, path);
  doc.path = path;
  return doc;
}

void label_documents(std::vector<ProfileDocument>& documents) {
  std::map<std::string, int> uses;
  for (const auto& d : documents) ++uses[d.model];
  for (auto& d : documents) {
    d.label = d.model;
    const auto stem = std::filesystem::path(d.path).stem().string();
    if (uses[d.model] > 1 && !stem.empty() && stem != d.model) d.label += fmt::format(" ({})", stem);
    if (d.estimated) d.label += " [estimate]";
  }
  // Still the same (the same model from files of the same name): number them in the order given.
  std::map<std::string, int> labels, seen;
  for (const auto& d : documents) ++labels[d.label];
  for (auto& d : documents) {
    if (labels[d.label] > 1) d.label += fmt::format(" #{}", ++seen[d.label]);
  }
}

std::optional<std::int64_t> largest_fitting_batch(const ProfileDocument& document, const GpuLine& gpu) {
  if (document.kind == ProfileDocument::Kind::kAdvice) {
    for (const auto& t : document.targets) {
      if (t.id == gpu.id) return t.batch_size;
    }
    return std::nullopt;
  }
  std::optional<std::int64_t> best;
  for (const auto& p : document.probes) {
    if (p.measured() && p.components.step_peak_reserved <= gpu.allocator_bytes) {
      best = std::max(best.value_or(0), p.batch_size);
    }
  }
  return best;
}

}  // namespace memgate
