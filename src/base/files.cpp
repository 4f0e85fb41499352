// Whole-or-nothing file writes.
#include "memgate/base/files.h"

#include "memgate/base/error.h"
#include "memgate/base/signals.h"

#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <fstream>
#include <system_error>

namespace memgate {

namespace {
// strerror of a failed call's errno; iostreams may leave it 0.
std::string reason(int error) { return error != 0 ? std::strerror(error) : std::string("the system gave no reason"); }
}  // namespace

TemporaryFileGuard::TemporaryFileGuard(const std::string& path)
    : slot_(register_temporary_file(path)), path_(path) {}

TemporaryFileGuard::~TemporaryFileGuard() {
  if (!path_.empty()) ::unlink(path_.c_str());
  release();
}

void TemporaryFileGuard::release() {
  path_.clear();
  unregister_temporary_file(slot_);
  slot_ = -1;
}

std::string read_text_file(const std::string& path, const std::string& what) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) throw Error(path + ": no such file: expected " + what);
  if (std::filesystem::is_directory(status)) throw Error(path + ": is a directory: expected " + what);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot read it: " + std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error(path + ": reading failed: " + std::strerror(errno));
  return text;
}

void write_file_atomically(const std::string& path, const std::string& text) {
  std::filesystem::path file(path);
  std::error_code ec;
  const auto status = std::filesystem::status(file, ec);  // follows a symlink to what it names
  if (!ec && std::filesystem::exists(status)) {
    if (std::filesystem::is_directory(status)) throw Error(path + ": is a directory: expected a file to write");
    if (!std::filesystem::is_regular_file(status)) {
      // A device, a FIFO or a socket: written to directly; replacing it with a file would destroy it.
      errno = 0;
      std::ofstream out(path, std::ios::binary);
      if (!out) throw Error(path + ": cannot write: " + reason(errno));
      out << text;
      out.flush();
      if (!out) throw Error(path + ": write failed");
      return;
    }
    // A symlink to a regular file: the file it names is replaced, and the link stays.
    if (std::filesystem::is_symlink(std::filesystem::symlink_status(file, ec))) file = std::filesystem::canonical(file);
  }
  if (file.has_parent_path()) {
    std::filesystem::create_directories(file.parent_path(), ec);
    if (ec) {
      throw Error(file.parent_path().string() + ": cannot make the folder (to write " + path + "): " + ec.message() +
                  "; expected a folder this process may write to");
    }
  }
  const auto tmp = file.string() + ".tmp." + std::to_string(::getpid());
  TemporaryFileGuard guard(tmp);  // gone on an error, a return or Ctrl-C before the rename
  {
    errno = 0;
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      throw Error(tmp + ": cannot write (to replace " + path + " whole): " + reason(errno) +
                  "; expected a folder this process may write to (check its permissions, and that its file system "
                  "is not read-only)");
    }
    out << text;
    out.flush();
    if (!out) throw Error(tmp + ": write failed: " + reason(errno) + " (is the disk full?)");
  }
  std::filesystem::rename(tmp, file, ec);
  if (ec) throw Error(path + ": cannot replace: " + ec.message());
  guard.release();
}

bool remove_tree(const std::string& path) noexcept {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT;
  if (!S_ISDIR(st.st_mode)) return ::unlink(path.c_str()) == 0 || errno == ENOENT;
  // Depth first (FTW_DEPTH: a folder after what it holds), links not followed (FTW_PHYS), within one file system.
  const auto remove_one = [](const char* entry, const struct stat*, int type, struct FTW*) -> int {
    const int rc = type == FTW_DP ? ::rmdir(entry) : ::unlink(entry);
    return rc == 0 || errno == ENOENT ? 0 : -1;
  };
  return ::nftw(path.c_str(), remove_one, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) == 0;
}

}  // namespace memgate
