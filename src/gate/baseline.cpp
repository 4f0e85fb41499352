// Baseline files: strict reading, comparison with tolerance, and locked atomic updates that keep other entries.
#include "memgate/gate/baseline.h"

#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/base/process.h"
#include "memgate/base/units.h"
#include "memgate/gate/report.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <vector>

namespace memgate {
namespace {

constexpr int kSchema = 1;

[[noreturn]] void corrupt(const std::string& path, const std::string& key, const std::string& expected) {
  throw Error(path + ": " + key + ": expected " + expected +
              " (a corrupt baseline: restore it from git, or re-record it with the update-baselines preset)");
}

// Keys a baseline's writer never writes: an edit by hand or another tool's file, not to be dropped silently by the
// next update.
void reject_unknown_keys(const nlohmann::json& j, const std::string& path, const std::string& parent,
                         std::initializer_list<std::string_view> known) {
  if (!j.is_object()) return;
  for (const auto& [key, value] : j.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      std::string keys;
      for (const auto k : known) keys += (keys.empty() ? "" : ", ") + std::string(k);
      corrupt(path, parent.empty() ? key : parent + "." + key, "none of this name (the keys are " + keys + ")");
    }
  }
}

const nlohmann::json& need(const nlohmann::json& j, const std::string& path, const std::string& parent,
                           const std::string& key) {
  if (!j.is_object() || !j.contains(key)) corrupt(path, parent.empty() ? key : parent + "." + key, "a value (missing)");
  return j.at(key);
}

std::int64_t need_int(const nlohmann::json& j, const std::string& path, const std::string& parent,
                      const std::string& key, std::int64_t min) {
  const auto& v = need(j, path, parent, key);
  const auto where = parent.empty() ? key : parent + "." + key;
  if (!v.is_number_integer() || v.get<std::int64_t>() < min) {
    corrupt(path, where, "an integer >= " + std::to_string(min) + ", got " + v.dump());
  }
  return v.get<std::int64_t>();
}

// Every component a probe has: all but an optional one (`ema`), which is read where the baseline has it.
void read_components(const nlohmann::json& j, const std::string& path, const std::string& where, Components& out) {
  for (const auto& info : kComponentTable) {
    if (info.present != nullptr) {
      if (!j.contains(std::string(info.name))) continue;
      out.*info.present = true;
    }
    out.*info.member = need_int(j, path, where, std::string(info.name), 0);
  }
}

std::string read_file(const std::string& path) { return read_text_file(path, "a baseline JSON file"); }

constexpr const char* kFolderHint = "expected a folder this process can create and write (give --baselines one)";

// Exclusive advisory lock on a directory, held for the object's lifetime.
class DirectoryLock {
 public:
  explicit DirectoryLock(const std::string& dir) : fd_(::open(dir.c_str(), O_RDONLY | O_DIRECTORY)) {
    if (fd_ < 0 || ::flock(fd_, LOCK_EX) != 0) {
      throw Error(dir + ": cannot lock the baseline folder: " + std::strerror(errno) + "; " + kFolderHint);
    }
  }
  ~DirectoryLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

 private:
  int fd_;
};

// The folder of a baseline file and the folders above it, made where missing; an error names the folder and why.
void make_baseline_folder(const std::filesystem::path& dir) {
  // The first folder on the way that is there but is no folder (a file given as --baselines, or above it).
  for (auto p = dir; !p.empty(); p = p.parent_path()) {
    std::error_code ec;
    const auto status = std::filesystem::status(p, ec);
    if (std::filesystem::exists(status)) {
      if (!std::filesystem::is_directory(status)) {
        throw Error(p.string() + ": is " + (std::filesystem::is_regular_file(status) ? "a file" : "not a folder") +
                    ", so the baseline folder " + dir.string() + " cannot be made there; " + kFolderHint);
      }
      break;
    }
    if (p == p.parent_path()) break;
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(dir.string() + ": cannot create the baseline folder: " + ec.message() + "; " + kFolderHint);
}

// What an update killed between writing its temporary file and renaming it left: `<fixture>.json.tmp.<pid>` of a
// process that is gone (kill(pid, 0) says ESRCH). Called under the folder's lock; a live writer's file is kept.
void remove_stray_temporary_files(const std::filesystem::path& dir) {
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const auto name = it->path().filename().string();
    const auto at = name.rfind(".json.tmp.");
    if (at == std::string::npos || at == 0) continue;
    const auto digits = std::string_view(name).substr(at + std::string_view(".json.tmp.").size());
    if (digits.empty() || digits.size() > 9 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    const auto pid = static_cast<pid_t>(std::stol(std::string(digits)));
    if (pid <= 0 || pid == ::getpid()) continue;
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec) || it->is_symlink(type_ec)) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to ask about (EPERM): kept
    ::unlink(it->path().c_str());
  }
}

// The first line a program prints, without its line end; empty where it failed.
std::string first_line_of(const std::vector<std::string>& argv) {
  const auto result = run_program(argv);
  if (result.exit_code != 0) return {};
  std::istringstream lines(result.output);
  std::string line;
  std::getline(lines, line);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return line;
}

}  // namespace

std::string BaselineProbe::fixture_hash() const { return provenance.value("fixture_hash", std::string()); }

const BaselineProbe* Baseline::find(std::int64_t batch_size) const {
  for (const auto& p : probes) {
    if (p.batch_size == batch_size) return &p;
  }
  return nullptr;
}

std::string baseline_path(const std::string& root, const std::string& slug, const std::string& fixture) {
  return root + "/" + slug + "/" + fixture + ".json";
}

Baseline load_baseline(const std::string& path, const std::string& expected_fixture,
                       const std::string& expected_slug) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {  // a syntax error, or a number out of range (1e309)
    throw Error(path + ": not valid JSON (" + e.what() +
                "); restore it from git, or re-record it with the update-baselines preset");
  }
  if (!j.is_object()) corrupt(path, "(top level)", "an object");
  reject_unknown_keys(j, path, "", {"schema", "fixture", "device", "tolerance", "probes"});
  if (need_int(j, path, "", "schema", 1) != kSchema) corrupt(path, "schema", "1");
  Baseline b;
  b.path = path;
  if (!need(j, path, "", "fixture").is_string()) corrupt(path, "fixture", "a string");
  b.fixture = j["fixture"].get<std::string>();
  const auto& device = need(j, path, "", "device");
  if (!need(device, path, "device", "slug").is_string()) corrupt(path, "device.slug", "a string");
  b.device_slug = device["slug"].get<std::string>();
  reject_unknown_keys(device, path, "device", {"slug"});
  if (!expected_fixture.empty() && b.fixture != expected_fixture) {
    corrupt(path, "fixture", "\"" + expected_fixture + "\" (the file's name), got \"" + b.fixture + "\"");
  }
  if (!expected_slug.empty() && b.device_slug != expected_slug) {
    corrupt(path, "device.slug", "\"" + expected_slug + "\" (its folder), got \"" + b.device_slug + "\"");
  }
  const auto& tol = need(j, path, "", "tolerance");
  reject_unknown_keys(tol, path, "tolerance", {"relative", "absolute_bytes", "reserved_relative", "reserved_absolute_bytes"});
  if (!need(tol, path, "tolerance", "relative").is_number()) corrupt(path, "tolerance.relative", "a number");
  b.tolerance.relative = tol["relative"].get<double>();
  b.tolerance.absolute = need_int(tol, path, "tolerance", "absolute_bytes", 0);
  if (!need(tol, path, "tolerance", "reserved_relative").is_number()) {
    corrupt(path, "tolerance.reserved_relative", "a number");
  }
  b.tolerance.reserved_relative = tol["reserved_relative"].get<double>();
  b.tolerance.reserved_absolute = need_int(tol, path, "tolerance", "reserved_absolute_bytes", 0);
  const auto& probes = need(j, path, "", "probes");
  if (!probes.is_array()) corrupt(path, "probes", "a list");
  for (std::size_t i = 0; i < probes.size(); ++i) {
    const auto where = "probes[" + std::to_string(i) + "]";
    reject_unknown_keys(probes[i], path, where, {"batch_size", "components", "ranks", "modules", "provenance"});
    BaselineProbe p;
    p.batch_size = need_int(probes[i], path, where, "batch_size", 1);
    for (const auto& earlier : b.probes) {
      if (earlier.batch_size == p.batch_size) {
        corrupt(path, where + ".batch_size", "each batch size once, got " + std::to_string(p.batch_size) + " twice");
      }
    }
    const auto& components = need(probes[i], path, where, "components");
    for (const auto& [key, value] : components.items()) {
      if (find_component(key) == nullptr) {
        corrupt(path, where + ".components." + key, "a component of memgate (params, gradients, ...)");
      }
    }
    read_components(components, path, where + ".components", p.components);
    if (probes[i].contains("ranks")) {
      const auto& ranks = probes[i].at("ranks");
      if (!ranks.is_array() || ranks.empty()) corrupt(path, where + ".ranks", "a non-empty list of ranks");
      for (std::size_t k = 0; k < ranks.size(); ++k) {
        const auto at = where + ".ranks[" + std::to_string(k) + "]";
        const auto& entry = ranks.at(k);
        reject_unknown_keys(entry, path, at, {"rank", "components", "comm_buffer_bytes", "comm_buffers"});
        RankComponents r;
        r.rank = static_cast<int>(need_int(entry, path, at, "rank", 0));
        if (r.rank != static_cast<int>(k)) corrupt(path, at + ".rank", "ranks in order from 0, got " + std::to_string(r.rank));
        const auto& rc = need(entry, path, at, "components");
        for (const auto& [key, value] : rc.items()) {
          if (find_component(key) == nullptr) corrupt(path, at + ".components." + key, "a component of memgate (params, gradients, ...)");
        }
        read_components(rc, path, at + ".components", r.components);
        r.comm_buffer_bytes = need_int(entry, path, at, "comm_buffer_bytes", 0);
        r.comm_buffers = need_int(entry, path, at, "comm_buffers", 0);
        p.ranks.push_back(r);
      }
    }
    if (probes[i].contains("modules")) {
      p.modules = module_breakdown_from_json(probes[i].at("modules"), path + ": " + where + ".modules");
    }
    p.provenance = need(probes[i], path, where, "provenance");
    if (!p.provenance.is_object()) corrupt(path, where + ".provenance", "an object");
    b.probes.push_back(std::move(p));
  }
  return b;
}

nlohmann::json baseline_to_json(const Baseline& b) {
  nlohmann::json probes = nlohmann::json::array();
  for (const auto& p : b.probes) {
    nlohmann::json probe = {
        {"batch_size", p.batch_size}, {"components", components_to_json(p.components)}, {"provenance", p.provenance}};
    if (!p.ranks.empty()) probe["ranks"] = ranks_to_json(p.ranks);
    if (!p.modules.empty()) probe["modules"] = module_breakdown_to_json(p.modules);
    probes.push_back(probe);
  }
  return {{"schema", kSchema},
          {"fixture", b.fixture},
          {"device", {{"slug", b.device_slug}}},
          {"tolerance",
           {{"relative", b.tolerance.relative},
            {"absolute_bytes", b.tolerance.absolute},
            {"reserved_relative", b.tolerance.reserved_relative},
            {"reserved_absolute_bytes", b.tolerance.reserved_absolute}}},
          {"probes", probes}};
}

std::string source_commit(const std::string& source_dir) {
  if (const char* c = std::getenv("MEMGATE_COMMIT"); c != nullptr && *c != '\0') return c;
  // git's own arguments, no shell: any folder name (quotes, `$(...)`, spaces, a newline) is the folder's name.
  auto commit = first_line_of({"git", "-C", source_dir, "rev-parse", "--short=12", "HEAD"});
  if (commit.empty()) return "unknown";
  auto dirty = first_line_of(
      {"git", "-C", source_dir, "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)baselines"});
  return dirty.empty() ? commit : commit + "+dirty";
}

nlohmann::json probe_provenance(const DeviceInfo& device, const std::string& fixture_hash, const std::string& commit) {
  nlohmann::json p = {{"torch", device.torch_version}, {"fixture_hash", fixture_hash}, {"commit", commit}};
  if (device.device.is_cpu()) {
    p["cpu_kernels"] = device.cpu_kernels;
    p["cpu_threads"] = device.cpu_threads;
    if (device.cpu_kernels != "portable") {
      p["device"] = device.name;
      p["cpu_isa"] = device.cpu_isa;
      p["cpu_features"] = device.cpu_features;
    }
    return p;
  }
  p.update({{"device", device.name},
            {"cuda", device.cuda_version},
            {"cudnn", device.cudnn_version},
            {"driver", device.driver_version},
            {"allocator", device.allocator_settings},
            {"cpu_threads", device.cpu_threads},
            {"cuda_module_loading", device.cuda_module_loading}});
  return p;
}

namespace {
nlohmann::json without_commit(nlohmann::json provenance) {
  provenance.erase("commit");
  return provenance;
}

// A record measured in a tree with uncommitted changes (its commit ends in "+dirty"): no commit reproduces it.
bool from_a_dirty_tree(const nlohmann::json& provenance) {
  const auto it = provenance.find("commit");
  return it != provenance.end() && it->is_string() && it->get<std::string>().ends_with("+dirty");
}
}  // namespace

bool update_baseline(const std::string& path, const Fixture& fixture, const DeviceInfo& device,
                     const std::vector<ProbeResult>& probes, const std::string& commit) {
  const std::filesystem::path file(path);
  make_baseline_folder(file.parent_path());
  DirectoryLock lock(file.parent_path().string());
  remove_stray_temporary_files(file.parent_path());

  Baseline b;
  const bool existed = std::filesystem::exists(file);
  if (existed) {
    b = load_baseline(path, fixture.name, device.slug);  // a corrupt file stops the update, never overwritten
  } else {
    b.path = path;
    b.fixture = fixture.name;
    b.device_slug = device.slug;
  }
  bool changed = !existed;
  if (const auto tolerance = effective_tolerance(fixture, device.device.is_cuda()); b.tolerance != tolerance) {
    b.tolerance = tolerance;
    changed = true;
  }
  for (const auto& probe : probes) {
    if (!probe.measured()) continue;  // an out-of-memory (or a failure) is no baseline
    BaselineProbe fresh;
    fresh.batch_size = probe.batch_size;
    fresh.components = probe.components;
    fresh.ranks = probe.ranks;
    fresh.modules = probe.modules;
    fresh.provenance = probe_provenance(device, fixture.hash, commit);
    auto it = std::find_if(b.probes.begin(), b.probes.end(),
                           [&](const BaselineProbe& p) { return p.batch_size == probe.batch_size; });
    if (it == b.probes.end()) {
      b.probes.push_back(std::move(fresh));
      changed = true;
    } else if (it->components != fresh.components || it->ranks != fresh.ranks || it->modules != fresh.modules ||
               without_commit(it->provenance) != without_commit(fresh.provenance) ||
               (from_a_dirty_tree(it->provenance) && !from_a_dirty_tree(fresh.provenance))) {
      // New bytes, or the same bytes from a setup that could have changed them (versions, kernels, fixture): the
      // record says so. The same bytes from another commit, or another CPU under portable kernels, change nothing,
      // but for a record from a dirty tree, which the same bytes from a commit replace: its commit can be checked out.
      *it = std::move(fresh);
      changed = true;
    }
  }
  if (!changed) return false;
  std::sort(b.probes.begin(), b.probes.end(),
            [](const BaselineProbe& x, const BaselineProbe& y) { return x.batch_size < y.batch_size; });
  const auto text = baseline_to_json(b).dump(2) + "\n";
  if (existed && read_file(path) == text) return false;
  write_file_atomically(path, text);
  return true;
}

double Comparison::percent() const {
  return baseline == 0 ? (measured == 0 ? 0.0 : 100.0)
                       : 100.0 * static_cast<double>(difference()) / static_cast<double>(baseline);
}

std::string Comparison::message() const {
  std::ostringstream m;
  char pct[32];
  std::snprintf(pct, sizeof pct, "%+.2f%%", percent());
  const auto diff = difference();
  const std::string sign = diff >= 0 ? "+" : "-";
  m << fixture << " at batch " << batch_size << ": " << component << " ";
  switch (verdict) {
    case Verdict::kRegression: m << "grew beyond its baseline"; break;
    case Verdict::kStale: m << "shrank beyond its tolerance (the baseline is stale)"; break;
    case Verdict::kWithin: m << "is within its baseline"; break;
  }
  // Bytes in the unit that keeps a small change visible (format_bytes: "4.0 KiB", "412.0 MiB"), and exactly.
  m << "\n  baseline:  " << format_bytes(baseline) << " (" << baseline << " bytes)"
    << "\n  measured:  " << format_bytes(measured) << " (" << measured << " bytes)"
    << "\n  change:    " << sign << format_bytes(std::llabs(diff)) << " (" << sign << std::llabs(diff) << " bytes, "
    << pct << ")"
    << "\n  tolerance: " << format_bytes(allowed) << " (" << allowed << " bytes)";
  const auto record = record_command.empty()
                          ? std::string("ctest --preset update-baselines (update-baselines-gpu on a GPU runner)")
                          : record_command;
  if (verdict == Verdict::kRegression) {
    m << "\n  If this growth is intended, record the new baseline: " << record << " and commit baselines/.";
  } else if (verdict == Verdict::kStale) {
    m << "\n  Memory went down: record the smaller baseline so that the gate keeps it: " << record << ".";
  }
  return m.str();
}

Comparison compare_component(const std::string& fixture, std::int64_t batch_size, std::string_view component,
                             std::int64_t baseline, std::int64_t measured, const Tolerance& tolerance) {
  const bool reserved = component == "step_peak_reserved";
  const double relative = reserved ? tolerance.reserved_relative : tolerance.relative;
  const std::int64_t absolute = reserved ? tolerance.reserved_absolute : tolerance.absolute;
  Comparison c;
  c.fixture = fixture;
  c.batch_size = batch_size;
  c.component = std::string(component);
  c.baseline = baseline;
  c.measured = measured;
  // Rounded down: a relative share never lets a whole byte more through than it says. Saturating: a share or a sum
  // beyond what 64 bits hold is the largest they hold (a baseline of 2^63-1 bytes is within itself, not "grew").
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  const double share = std::floor(relative * static_cast<double>(baseline));
  const std::int64_t relative_bytes = !(share > 0) ? 0 : share >= 0x1p63 ? kMax : static_cast<std::int64_t>(share);
  c.allowed = std::max(relative_bytes, absolute);
  const auto saturating_add = [](std::int64_t a, std::int64_t b) {
    std::int64_t sum = 0;
    return __builtin_add_overflow(a, b, &sum) ? (b > 0 ? kMax : std::numeric_limits<std::int64_t>::min()) : sum;
  };
  const auto saturating_sub = [](std::int64_t a, std::int64_t b) {
    std::int64_t difference = 0;
    return __builtin_sub_overflow(a, b, &difference) ? (b > 0 ? std::numeric_limits<std::int64_t>::min() : kMax)
                                                      : difference;
  };
  if (measured > saturating_add(baseline, c.allowed)) c.verdict = Verdict::kRegression;
  else if (measured < saturating_sub(baseline, c.allowed)) c.verdict = Verdict::kStale;
  return c;
}


}  // namespace memgate
