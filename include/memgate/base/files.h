// Writing files so that a reader never sees half of one.
#pragma once

#include <string>

namespace memgate {

/// Writes `text` to `path` through a temporary file beside it and a rename: the file is replaced whole or not at
/// all (an output that is also an input loses nothing when the write fails). Creates missing parent folders.
/// Throws memgate::Error naming the file it could not write.
void write_file_atomically(const std::string& path, const std::string& text);

/// A temporary file that must not outlive the process: removed when the guard ends (unless released, e.g. after
/// it was renamed into place) and also when SIGINT, SIGTERM or SIGHUP end the process while it exists (the signal
/// then ends the process as it would have). write_file_atomically uses it for its temporary file. Signal handlers
/// are installed on first use, only where the signal's disposition is still the default.
class TemporaryFileGuard {
 public:
  explicit TemporaryFileGuard(const std::string& path);
  ~TemporaryFileGuard();
  TemporaryFileGuard(const TemporaryFileGuard&) = delete;
  TemporaryFileGuard& operator=(const TemporaryFileGuard&) = delete;
  /// The file was moved into place: nothing to remove.
  void release();

 private:
  int slot_ = -1;
  std::string path_;
};

/// The whole content of the file at `path`. Throws memgate::Error naming the file and why it cannot be read: it is
/// not there, it is a directory (`what` says what was expected instead, e.g. "a baseline JSON file"), or the system
/// refused (permission denied, ...).
[[nodiscard]] std::string read_text_file(const std::string& path, const std::string& what);

/// Removes `path` and, for a folder, everything under it, without following links; a missing path is no error.
/// Returns false if something could not be removed. std::filesystem::remove_all does the same, but the torch wheel's
/// libtorch.so exports a broken copy of it (pytorch/pytorch#133437) that a program linked to LibTorch can bind to:
/// on a GPU runner's Ubuntu toolchain every call crashed (a jump to address 0). memgate calls this instead.
bool remove_tree(const std::string& path) noexcept;

}  // namespace memgate
