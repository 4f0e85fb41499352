// Whole-or-nothing file writes.
#include "memgate/base/files.h"

#include "memgate/base/error.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <system_error>

namespace memgate {

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::filesystem::path file(path);
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
  const auto tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error(tmp + ": cannot write");
    out << text;
    out.flush();
    if (!out) throw Error(tmp + ": write failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, file, ec);
  if (ec) {
    const auto why = ec.message();
    std::filesystem::remove(tmp, ec);
    throw Error(path + ": cannot replace: " + why);
  }
}

}  // namespace memgate
