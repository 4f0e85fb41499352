// libFuzzer targets for memgate's readers of user files. Each target writes the input to a file (the readers take
// paths, as memgate does) and reads it; memgate::Error is the expected answer to bad input, anything else escaping
// (another exception type, a crash, a sanitizer report, a hang) is a finding.
#pragma once

#include "memgate/base/error.h"

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace memgate::fuzz {

/// A file of this process's own holding `data`, named `name` (the readers derive names from file stems), in a
/// folder of its own under /dev/shm (or /tmp).
inline std::string write_input(const std::uint8_t* data, std::size_t size, const std::string& name) {
  static const std::string dir = [] {
    const std::string base = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string d = base + "/memgate-fuzz-" + std::to_string(::getpid());
    std::error_code ec;
    for (const char* sub : {"/models", "/suites", "/gpus", "/cpu"}) std::filesystem::create_directories(d + sub, ec);
    return d;
  }();
  const auto path = dir + "/" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data),
                                                                static_cast<std::streamsize>(size));
  return path;
}

/// Runs `read`; memgate::Error (a clear error about the input) is fine, everything else propagates.
template <typename F>
int expect_clean(F&& read) {
  try {
    read();
  } catch (const memgate::Error&) {
  }
  return 0;
}

}  // namespace memgate::fuzz
