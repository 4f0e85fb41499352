// What memgate's subcommands share: --help footers, flag value checks, GPU fixtures. No LibTorch.
#include "cli.h"

#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/base/status.h"
#include "memgate/report/profile_document.h"
#include "memgate/spec/gpus.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace memgate::cli {

namespace {

template <typename T>
std::optional<T> parse_whole(std::string_view text) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace

std::string footer(std::string_view what) { return fmt::format("{}\n\n{}", what, kExitCodes); }

namespace {

namespace fs = std::filesystem;

// `path` made absolute, its symlinks and ./ .. resolved as far as it exists, without a trailing separator.
fs::path real_path(const std::string& path) {
  std::error_code ec;
  const auto absolute = fs::absolute(path, ec);
  auto real = fs::weakly_canonical(absolute, ec);
  if (ec) real = absolute.lexically_normal();
  if (!real.has_filename() && real.has_relative_path()) real = real.parent_path();
  return real;
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (fs::equivalent(a, b, ec)) return true;  // both there: hard links too
  return real_path(a) == real_path(b);
}

// Whether `path` is `folder` or lies inside it.
bool within(const std::string& path, const std::string& folder) {
  const auto p = real_path(path), f = real_path(folder);
  auto pi = p.begin();
  for (auto fi = f.begin(); fi != f.end(); ++fi, ++pi) {
    if (pi == p.end() || *pi != *fi) return false;
  }
  return true;
}

}  // namespace

void refuse_colliding_files(const std::vector<FileArg>& inputs, const std::vector<FileArg>& outputs) {
  for (const auto& out : outputs) {
    if (out.path.empty()) continue;
    for (const auto& in : inputs) {
      if (in.path.empty()) continue;
      if (same_file(out.path, in.path)) {
        throw UsageError(fmt::format("{} {}: is also an input ({}: {}): writing it would destroy it; give {} another "
                                     "file", out.what, out.path, in.what, in.path, out.what));
      }
      if (in.folder && within(out.path, in.path)) {
        throw UsageError(fmt::format("{} {}: is inside an input ({}: {}): memgate would read it back as one of that "
                                     "folder's files (or overwrite one); give {} a path outside it",
                                     out.what, out.path, in.what, in.path, out.what));
      }
    }
  }
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    for (std::size_t j = i + 1; j < outputs.size(); ++j) {
      const auto& a = outputs[i];
      const auto& b = outputs[j];
      if (a.path.empty() || b.path.empty() || !same_file(a.path, b.path)) continue;
      throw UsageError(fmt::format("{} {} and {} {} name one file: one output would overwrite the other; give each "
                                   "its own file", a.what, a.path, b.what, b.path));
    }
  }
  for (const auto& out : outputs) {
    if (out.path.empty()) continue;
    std::error_code ec;
    if (fs::is_directory(out.path, ec)) {
      throw UsageError(fmt::format("{} {}: is a folder: expected a file to write", out.what, out.path));
    }
    // The nearest folder on the way that exists must be a folder: a file there cannot hold the output.
    for (auto up = fs::absolute(out.path, ec).lexically_normal().parent_path(); !up.empty(); up = up.parent_path()) {
      const auto st = fs::status(up, ec);
      if (!fs::exists(st)) {
        if (up == up.parent_path()) break;
        continue;
      }
      if (!fs::is_directory(st)) {
        throw UsageError(fmt::format("{} {}: cannot be written: {} is a file, not a folder; give {} a path in a folder",
                                     out.what, out.path, up.string(), out.what));
      }
      break;
    }
  }
}

void write_output(std::string_view flag, const std::string& path, const std::string& text) {
  try {
    memgate::write_file_atomically(path, text);
  } catch (const std::exception& e) {
    throw memgate::Error(fmt::format("{} {}: cannot write it: {}", flag, path, e.what()));
  }
}

void check_env_switches() {
  try {
    memgate::check_env_switches();
  } catch (const memgate::Error& e) {
    throw UsageError(e.what());
  }
}

void append_step_summary(const std::string& markdown) {
  const char* path = std::getenv("GITHUB_STEP_SUMMARY");
  if (path == nullptr || *path == '\0') return;
  std::string reason;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    reason = "it is a folder, not a file";
  } else {
    errno = 0;
    std::FILE* f = std::fopen(path, "a");
    if (f == nullptr) {
      reason = std::strerror(errno);
    } else {
      const bool written = std::fwrite(markdown.data(), 1, markdown.size(), f) == markdown.size();
      int error = errno;
      const bool flushed = std::fflush(f) == 0;
      if (!flushed && error == 0) error = errno;
      const bool closed = std::fclose(f) == 0;
      if (!closed && error == 0) error = errno;
      if (!written || !flushed || !closed) reason = error != 0 ? std::strerror(error) : "the write failed";
    }
  }
  if (reason.empty()) return;
  std::fflush(stdout);
  fmt::print(stderr, "memgate: warning: GITHUB_STEP_SUMMARY={}: the Markdown summary was not appended: {}\n", path,
             reason);
}

// --- Values ---------------------------------------------------------------------------------------------------

CLI::Validator check_value(bool (*ok)(std::string_view), std::string expected) {
  return {[ok, expected](const std::string& value) {
            return ok(value) ? std::string() : fmt::format("expected {}, got '{}'", expected, value);
          },
          ""};
}

std::optional<std::vector<std::int64_t>> parse_batch_sizes(std::string_view text) {
  std::vector<std::int64_t> out;
  for (std::size_t start = 0;;) {
    const auto comma = text.find(',', start);
    const auto value = parse_whole<std::int64_t>(text.substr(start, comma - start));
    if (!value || *value < 1) return std::nullopt;
    out.push_back(*value);
    if (comma == std::string_view::npos) return out;
    start = comma + 1;
  }
}

bool is_batch_sizes(std::string_view text) { return parse_batch_sizes(text).has_value(); }

bool is_finite_non_negative(std::string_view text) {
  const auto value = parse_whole<double>(text);
  return value && std::isfinite(*value) && *value >= 0.0;
}

bool is_memory_limit_mib(std::string_view text) {
  const auto value = parse_whole<std::int64_t>(text);
  return value && *value >= 1 && *value <= kMaxMemoryLimitMib;
}

bool is_device_spec(std::string_view text) {
  if (text == "auto" || text == "cpu" || text == "cuda") return true;
  if (!text.starts_with("cuda:")) return false;
  const auto index = parse_whole<int>(text.substr(5));
  return index && *index >= 0;
}

std::string default_gpus_dir() {
  try {
    return memgate::gpus_dir(memgate::project_dir());
  } catch (const memgate::Error&) {
    return "";
  }
}

std::vector<memgate::GpuSpec> gpu_specs(const std::string& dir) {
  if (dir.empty() || !std::filesystem::is_directory(dir)) return {};
  return memgate::load_gpus(dir);
}

memgate::GpuSpec gpu_fixture(const std::string& dir, const std::string& id) {
  const auto folder = dir.empty() ? memgate::gpus_dir(memgate::project_dir()) : dir;
  return gpu_by_id(memgate::load_gpus(folder), id, folder);
}

const memgate::GpuSpec& gpu_by_id(const std::vector<memgate::GpuSpec>& gpus, const std::string& id,
                                  const std::string& dir) {
  for (const auto& g : gpus) {
    if (g.id == id) return g;
  }
  std::vector<std::string> known;
  for (const auto& g : gpus) known.push_back(g.id);
  throw UsageError(fmt::format("--gpu {}: no GPU fixture {}/{}.yaml; expected one of the known ids: {}", id, dir, id,
                               known.empty() ? std::string("(none: the folder has no *.yaml)")
                                             : fmt::format("{}", fmt::join(known, ", "))));
}

std::vector<memgate::GpuLine> gpu_lines(const std::string& dir) {
  std::vector<memgate::GpuLine> lines;
  for (const auto& g : gpu_specs(dir)) {
    lines.push_back({g.id, g.name, g.memory_bytes, g.usable_bytes()});
  }
  return lines;
}

std::string generator() { return std::string("memgate ") + MEMGATE_VERSION; }

int run_command_line(int argc, char** argv, AddSubcommand (*adder)(std::string_view name)) {
  CLI::App app{"memgate: memory regression tests for deep-learning training on LibTorch", "memgate"};
  app.set_version_flag("--version", generator());
  app.require_subcommand(1);
  app.footer(kExitCodes);
  std::vector<std::pair<CLI::App*, Run>> runs;
  for (const auto& s : kSubcommands) {
    auto* sub = app.add_subcommand(s.name, s.description);
    if (const auto add = adder(s.name)) {
      runs.emplace_back(sub, add(*sub));
    } else {
      sub->allow_extras();  // the other program's: listed, and refused below whatever its arguments
    }
  }
  if (argc < 2) {
    fmt::print(stderr, "{}", app.help());
    return kUsageError;
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);  // --help, --version
    const auto parsed = app.get_subcommands();
    std::string message = e.what();
    // CLI11 checks required options before unknown ones: `advise --bogus` would say "--config is required".
    // An unknown argument is the first thing to fix, so say that.
    if (const auto extra = app.remaining(/*recurse=*/true);
        !extra.empty() && dynamic_cast<const CLI::RequiredError*>(&e) != nullptr && !parsed.empty()) {
      message = fmt::format("unknown argument{} {}", extra.size() > 1 ? "s" : "", fmt::join(extra, " "));
    }
    if (parsed.empty() && dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
      // CLI11 says "A subcommand is required"; name what was given instead.
      std::vector<std::string_view> names;
      for (const auto& s : kSubcommands) names.emplace_back(s.name);
      const std::string_view given = argv[1];
      message = fmt::format("{} '{}'; the subcommands are {}",
                            given.starts_with('-') ? "a subcommand must come first, not" : "unknown subcommand", given,
                            fmt::join(names, ", "));
    }
    const std::string command = parsed.empty() ? "memgate" : "memgate " + parsed.front()->get_name();
    fmt::print(stderr, "memgate: {}\nRun '{} --help' for the options.\n", message, command);
    return kUsageError;
  }

  try {
    for (const auto& [sub, run] : runs) {
      if (sub->parsed()) return run();
    }
    // A subcommand of the other program (main hands those over before parsing: only a direct call gets here).
    fmt::print(stderr, "memgate: error: this program does not run '{}': run it with bin/memgate\n",
               app.get_subcommands().front()->get_name());
    return kError;
  } catch (const UsageError& e) {
    fmt::print(stderr, "memgate: {}\n", e.what());
    return kUsageError;
  } catch (const memgate::Error& e) {
    fmt::print(stderr, "memgate: error: {}\n", e.what());
  } catch (const std::exception& e) {
    fmt::print(stderr, "memgate: unexpected error: {}\n", e.what());
  }
  return kError;
}

}  // namespace memgate::cli
