// Whole-or-nothing writes: the file is replaced, or left as it was with an error that names it.
#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "test_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <thread>

namespace memgate {
namespace {

using ::testing::HasSubstr;

TEST(FilesTest, RemovesATreeWithoutFollowingItsLinks) {
  namespace fs = std::filesystem;
  testing::TempDir tmp;
  const fs::path tree = tmp.path() / "tree", outside = tmp.path() / "outside";
  fs::create_directories(tree / "a" / "b");
  fs::create_directories(outside);
  std::ofstream(tree / "a" / "b" / "file") << "x";
  std::ofstream(tree / "top") << "y";
  std::ofstream(outside / "kept") << "z";
  fs::create_directory_symlink(outside, tree / "a" / "link");
  EXPECT_TRUE(remove_tree(tree.string()));
  EXPECT_FALSE(fs::exists(tree));
  EXPECT_TRUE(fs::exists(outside / "kept")) << "the link was followed";
  EXPECT_TRUE(remove_tree(tree.string())) << "a missing path is no error";
  EXPECT_TRUE(remove_tree((outside / "kept").string())) << "a file";
  EXPECT_FALSE(fs::exists(outside / "kept"));
}

TEST(FilesTest, WritesReplacesAndLeavesNoTemporaryFile) {
  testing::TempDir dir;
  const auto path = dir / "deep/er/out.json";
  write_file_atomically(path, "first\n");
  EXPECT_EQ(testing::read_file(path), "first\n");
  write_file_atomically(path, "second\n");
  EXPECT_EQ(testing::read_file(path), "second\n");
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir / "deep/er")) ++entries;
  EXPECT_EQ(entries, 1) << "no temporary file is left behind";
}

TEST(FilesTest, AFailedWriteNamesTheFileAndKeepsWhatWasThere) {
  testing::TempDir dir;
  const auto path = dir / "out.json";
  write_file_atomically(path, "kept\n");
  // A folder where the file should go cannot be replaced by a file.
  const auto folder = dir / "folder";
  std::filesystem::create_directories(folder + "/inside");
  try {
    write_file_atomically(folder, "text\n");
    ADD_FAILURE() << "replacing a folder must fail";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(folder));
  }
  EXPECT_TRUE(std::filesystem::is_directory(folder + "/inside"));
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++entries;
  EXPECT_EQ(entries, 2) << "out.json and the folder, no temporary file";
  EXPECT_EQ(testing::read_file(path), "kept\n");
}

// Only regular files (and new paths) are replaced through a temporary file: a FIFO or a device is written to, a
// symlink keeps pointing at its file, a directory is refused.
TEST(FilesTest, WritesIntoWhatIsNotARegularFileWithoutReplacingIt) {
  testing::TempDir dir;
  const auto fifo = dir / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string received;
  std::thread reader([&] { received = testing::read_file(fifo); });
  write_file_atomically(fifo, "through the pipe\n");
  reader.join();
  EXPECT_EQ(received, "through the pipe\n");
  EXPECT_TRUE(std::filesystem::is_fifo(fifo)) << "the FIFO must stay a FIFO";

  const auto target = dir / "target.json";
  const auto link = dir / "link.json";
  write_file_atomically(target, "old\n");
  std::filesystem::create_symlink(target, link);
  write_file_atomically(link, "new\n");
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  EXPECT_EQ(testing::read_file(target), "new\n");

  std::filesystem::create_directories(dir / "folder");
  try {
    write_file_atomically(dir / "folder", "x");
    FAIL() << "a directory was written";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("folder: is a directory"));
  }
  EXPECT_TRUE(std::filesystem::is_directory(dir / "folder"));
}

}  // namespace
}  // namespace memgate

namespace memgate {
namespace {

// Ctrl-C (or a CI runner's SIGTERM) while a baseline or an output is being written leaves no temporary file
// behind, and the process still ends by that signal.
TEST(FilesTest, ASignalDuringAWriteLeavesNoTemporaryFile) {
  for (const int signal_number : {SIGINT, SIGTERM}) {
    testing::TempDir dir;
    const auto tmp = dir / "out.json.tmp.1";
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      TemporaryFileGuard guard(tmp);
      std::ofstream(tmp) << "half of a file";
      ::raise(signal_number);
      ::_exit(0);  // not reached
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == signal_number) << "status " << status;
    EXPECT_FALSE(std::filesystem::exists(tmp)) << "the temporary file outlived the signal";
  }
}

TEST(FilesTest, AGuardRemovesItsFileUnlessReleased) {
  testing::TempDir dir;
  {
    TemporaryFileGuard guard(dir / "a");
    testing::write_file(dir / "a", "x");
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "a"));
  {
    TemporaryFileGuard guard(dir / "b");
    testing::write_file(dir / "b", "x");
    guard.release();
  }
  EXPECT_TRUE(std::filesystem::exists(dir / "b"));
}

}  // namespace
}  // namespace memgate
