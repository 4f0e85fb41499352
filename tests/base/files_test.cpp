// Whole-or-nothing writes: the file is replaced, or left as it was with an error that names it.
#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "test_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

namespace memgate {
namespace {

using ::testing::HasSubstr;

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

}  // namespace
}  // namespace memgate
