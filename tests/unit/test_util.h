// Helpers shared by the unit tests: temporary folders, files, fixtures and subprocesses.
#pragma once

#include "memgate/fixture.h"
#include "memgate/suite.h"

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>

namespace memgate::testing {

/// A fresh folder under the system's temporary folder, removed with the object.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / ("memgate-test-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
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

/// A fixture from YAML text, loaded through a temporary file named `<name>.yaml`.
inline Fixture fixture_from(const std::string& yaml, const std::string& name = "probe_fixture") {
  TempDir dir;
  const auto path = dir / (name + ".yaml");
  write_file(path, yaml);
  return load_fixture(path);
}

/// A tiny ViT fixture, with extra YAML lines appended to its training section.
inline std::string tiny_vit_yaml(const std::string& training = "", const std::string& model_extra = "") {
  return "model:\n  arch: vit\n  img_size: 32\n  patch_size: 8\n  embed_dim: 64\n  depth: 4\n  num_heads: 4\n"
         "  num_classes: 5\n" + model_extra + "training:\n  optimizer: adamw\n" + training +
         "batch_sizes: [1, 2, 4, 8]\n";
}

/// Runs a shell command; returns its exit status and fills `output` with stdout and stderr.
inline int run(const std::string& command, std::string* output = nullptr) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen((command + " 2>&1").c_str(), "r"), ::pclose);
  std::string out;
  std::array<char, 4096> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe.get()) != nullptr) out += buffer.data();
  const int status = ::pclose(pipe.release());
  if (output != nullptr) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace memgate::testing
