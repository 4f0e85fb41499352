// memgate runs no shell: a baseline update in a project folder whose name a shell would read as code (a quote,
// `$(touch PWNED)`, a space, a newline) records that folder's commit and runs nothing else. And a baselines folder
// that cannot be used says which path, why, and what was expected.
#include "memgate/base/process.h"
#include "fixture_util.h"
#include "spawn_util.h"
#include "test_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

namespace memgate {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

// git, with an identity of its own, never reading the user's configuration.
memgate::CommandResult git(const fs::path& repo, std::vector<std::string> args) {
  std::vector<std::string> argv{"git", "-c", "user.name=memgate test", "-c", "user.email=test@memgate.invalid",
                                "-c", "commit.gpgsign=false", "-C", repo.string()};
  argv.insert(argv.end(), args.begin(), args.end());
  return memgate::run_program(argv);
}

// Every PWNED under `root`, and in the test's own folder.
std::vector<std::string> pwned_files(const fs::path& root) {
  std::vector<std::string> found;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename() == "PWNED") found.push_back(it->path().string());
  }
  if (fs::exists(fs::current_path() / "PWNED")) found.push_back((fs::current_path() / "PWNED").string());
  return found;
}

class ProjectFolderNameTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ProjectFolderNameTest, UpdateRecordsTheFoldersCommitAndRunsNoShell) {
  testing::TempDir root;
  const auto project = root.path() / GetParam();
  fs::create_directories(project);
  testing::write_file((project / "tiny.yaml").string(), testing::tiny_vit_yaml());
  ASSERT_EQ(git(project, {"init", "-q"}).exit_code, 0);
  ASSERT_EQ(git(project, {"add", "tiny.yaml"}).exit_code, 0);
  ASSERT_EQ(git(project, {"commit", "-q", "-m", "the fixture"}).exit_code, 0);
  const auto head = git(project, {"rev-parse", "HEAD"}).output;
  const auto short_head = git(project, {"rev-parse", "--short=12", "HEAD"}).output;
  ASSERT_GE(head.size(), 40U);
  ASSERT_EQ(short_head.size(), 13U) << short_head;  // 12 digits and a line end

  const auto baselines = project / "baselines";
  const auto run = testing::spawn(
      {MEMGATE_CLI, "check", "--update-baselines", "--config", (project / "tiny.yaml").string(), "--batch-sizes", "1",
       "--device", "cpu", "--baselines", baselines.string()},
      project.string(), {{"MEMGATE_PROJECT_DIR", project.string()}, {"MEMGATE_COMMIT", std::nullopt}});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto file = baselines / "cpu" / "tiny.json";
  ASSERT_TRUE(fs::exists(file)) << run.output;
  const auto json = nlohmann::json::parse(testing::read_file(file.string()));
  const auto commit = json.at("probes").at(0).at("provenance").at("commit").get<std::string>();
  EXPECT_EQ(commit, short_head.substr(0, 12));
  EXPECT_EQ(head.substr(0, 12), commit);
  EXPECT_THAT(pwned_files(root.path()), ::testing::IsEmpty());
}

const char* const kCaseNames[] = {"substitution", "quote", "space", "newline", "backquote"};
std::string case_name(const ::testing::TestParamInfo<std::string>& p) { return kCaseNames[p.index]; }

INSTANTIATE_TEST_SUITE_P(Names, ProjectFolderNameTest,
                         ::testing::Values("q'$(touch PWNED)'q", "Bob's models", "two words", "a\nnewline",
                                           "`touch PWNED`; touch PWNED"),
                         case_name);

TEST(RunProgram, PassesArgumentsAsTheyAreAndGivesTheExitCode) {
  testing::TempDir dir;
  const auto odd = "$(touch " + (dir / "PWNED") + ") 'a' \"b\" \n;";
  const auto echoed = run_program({"printf", "%s", odd});
  EXPECT_EQ(echoed.exit_code, 0);
  EXPECT_EQ(echoed.output, odd);
  EXPECT_FALSE(fs::exists(dir / "PWNED"));
  EXPECT_EQ(run_program({"false"}).exit_code, 1);
  EXPECT_EQ(run_program({"memgate-no-such-program-anywhere"}).exit_code, -1);
  EXPECT_EQ(run_program({}).exit_code, -1);
}

// --- a baselines folder that cannot be used --------------------------------------------------------------------

testing::Spawned update_into(const testing::TempDir& dir, const std::string& baselines) {
  testing::write_file(dir / "tiny.yaml", testing::tiny_vit_yaml());
  return testing::spawn({MEMGATE_CLI, "check", "--update-baselines", "--config", dir / "tiny.yaml", "--batch-sizes",
                         "1", "--device", "cpu", "--baselines", baselines},
                        dir.path().string(), {{"MEMGATE_COMMIT", "test"}});
}

TEST(BaselinesFolder, AFileGivenAsTheFolderIsAUsageErrorNamingIt) {
  testing::TempDir dir;
  testing::write_file(dir / "notes.txt", "not a folder\n");
  for (const bool update : {true, false}) {
    testing::write_file(dir / "tiny.yaml", testing::tiny_vit_yaml());
    std::vector<std::string> argv{MEMGATE_CLI, "check", "--config", dir / "tiny.yaml", "--batch-sizes", "1",
                                  "--device", "cpu", "--baselines", dir / "notes.txt"};
    if (update) argv.push_back("--update-baselines");
    const auto run = testing::spawn(argv, dir.path().string());
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_THAT(run.output, HasSubstr("--baselines " + (dir / "notes.txt") + ": is a file, not a folder"));
    EXPECT_THAT(run.output, HasSubstr("expected the baselines folder"));
    EXPECT_THAT(run.output, ::testing::Not(HasSubstr("unexpected error")));
    EXPECT_EQ(testing::read_file(dir / "notes.txt"), "not a folder\n");
  }
}

TEST(BaselinesFolder, AFolderUnderAFileSaysWhichPathIsAFile) {
  testing::TempDir dir;
  testing::write_file(dir / "notes.txt", "not a folder\n");
  const auto run = update_into(dir, dir / "notes.txt" + "/baselines");
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_THAT(run.output, HasSubstr(dir / "notes.txt" + ": is a file, so the baseline folder"));
  EXPECT_THAT(run.output, HasSubstr("expected a folder this process can create and write"));
  EXPECT_THAT(run.output, ::testing::Not(HasSubstr("unexpected error")));
}

// A folder nobody may write to, root included (the tests run as root, whom mode bits do not stop): sysfs's folder of
// the CPUs exists, can be opened and locked, and refuses new files (EACCES). Its device slug `cpu` makes
// --baselines /sys/devices/system put the baseline there.
TEST(BaselinesFolder, AFolderThatRefusesWritesSaysWhyAndWhatToDo) {
  ASSERT_TRUE(fs::is_directory("/sys/devices/system/cpu")) << "a Linux sysfs is needed";
  testing::TempDir dir;
  const auto run = update_into(dir, "/sys/devices/system");
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_THAT(run.output, HasSubstr("/sys/devices/system/cpu/tiny.json.tmp."));
  EXPECT_THAT(run.output, HasSubstr("cannot write"));
  EXPECT_THAT(run.output, ::testing::AnyOf(HasSubstr("Permission denied"), HasSubstr("Read-only file system"),
                                           HasSubstr("Operation not permitted")));
  EXPECT_THAT(run.output, HasSubstr("expected a folder this process may write to"));
  EXPECT_THAT(run.output, ::testing::Not(HasSubstr("unexpected error")));
}

// --- a Python fixture's `python:` ---------------------------------------------------------------------------

TEST(PythonKey, ARelativePathThatIsNotThereNamesTheFixtureTheKeyAndThePathTried) {
  testing::TempDir dir;
  testing::write_file(dir / "sub/m.py", "def build():\n    pass\n");
  testing::write_file(dir / "sub/f.yaml",
                      "model:\n  arch: python\n  entry: m.py:build\n  python: ../nowhere/python\n  inputs:\n"
                      "    - {shape: [B, 4], dtype: float32}\n  task: sum\ntraining:\n  optimizer: sgd\n"
                      "batch_sizes: [1]\n");
  // Run from another folder: the path is the fixture's folder's, not the working folder's.
  fs::create_directories(dir.path() / "elsewhere");
  const auto run = testing::spawn({MEMGATE_CLI, "profile", "--config", dir / "sub/f.yaml", "--device", "cpu"},
                                  dir / "elsewhere", {{"MEMGATE_PYTHON", std::nullopt}});
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_THAT(run.output, HasSubstr(dir / "sub/f.yaml" + ":4: model.python: expected an executable Python"));
  EXPECT_THAT(run.output, HasSubstr("got '../nowhere/python': tried " + (dir.path() / "nowhere/python").string() +
                                    ", which is not there"));
}

}  // namespace
}  // namespace memgate
