// Helpers shared by the tests: temporary folders, files and subprocesses. Needs no LibTorch.
#pragma once

#include "memgate/base/files.h"
#include "memgate/base/process.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>

#include <sys/wait.h>


namespace memgate::testing {

/// memgate's source tree, whose fixtures and baselines the tests read: $MEMGATE_SOURCE_DIR (CTest sets it), else
/// the tree the tests were built from (compiled into the test executables only, never into the library), so that
/// GoogleTest's listing at build time finds the fixtures too.
/// This CPU's `flags` line of /proc/cpuinfo (empty where there is none): what a test may ask of the host it runs
/// on, never what it expects the recorder's CPU to have been.
inline std::string host_cpu_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0 || line.rfind("Features", 0) == 0) return line.substr(line.find(':') + 1);
  }
  return {};
}

/// |estimate - measured| as a percentage of measured (0 when both are 0, 100 when only measured is).
inline double error_pct(std::int64_t estimate, std::int64_t measured) {
  return measured == 0 ? (estimate == 0 ? 0.0 : 100.0)
                       : 100.0 * std::abs(static_cast<double>(estimate - measured)) / static_cast<double>(measured);
}

inline std::string source_dir() {
  if (const char* dir = std::getenv("MEMGATE_SOURCE_DIR"); dir != nullptr && *dir != '\0') return dir;
  return MEMGATE_TEST_SOURCE_DIR;
}

/// A fresh folder under the system's temporary folder, removed with the object.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / ("memgate-test-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { (void)memgate::remove_tree(path_.string()); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  [[nodiscard]] std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// How many times `what` occurs in `text`, not overlapping.
inline int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

/// What a test's shell command printed on stdout and its exit status (-1: it could not start or a signal ended it).
struct ShellResult {
  int exit_code = -1;
  std::string output;
};

/// Runs `command` with /bin/sh: for the tests' own scripts only. memgate itself never runs a shell (it runs programs
/// with an argument vector: memgate::run_program).
inline ShellResult run_test_shell(const std::string& command) {
  ShellResult result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer{};
  std::size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.output.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  result.exit_code = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

/// Runs a shell command (run_test_shell); returns its exit status and fills `output` with stdout and stderr.
inline int run(const std::string& command, std::string* output = nullptr) {
  auto result = run_test_shell(command + " 2>&1");
  if (output != nullptr) *output = std::move(result.output);
  return result.exit_code;
}

}  // namespace memgate::testing
