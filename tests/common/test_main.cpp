// The test programs' main: GoogleTest's, ended without the destructors of static objects (base/process.h). A test
// program that loads LibTorch spends a third of an empty run (0.13 s of 0.44 s) unregistering LibTorch's operators
// as it exits, once per CTest test (a suite or a shard of one). It unsets CI (see below).
#include "memgate/base/process.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace {

// With MEMGATE_TEST_MARKERS set, each test's start and end is a failed access() of /memgate-test-start/<Suite.Test>
// and /memgate-test-end/<Suite.Test>, so that a trace of the program's system calls (tools/count_process_tests.py,
// under strace) can tell which test started which process.
class Markers : public ::testing::EmptyTestEventListener {
  static void mark(const char* what, const ::testing::TestInfo& test) {
    const auto path = std::string("/memgate-test-") + what + "/" + test.test_suite_name() + "." + test.name();
    (void)::access(path.c_str(), F_OK);
  }
  void OnTestStart(const ::testing::TestInfo& test) override { mark("start", test); }
  void OnTestEnd(const ::testing::TestInfo& test) override { mark("end", test); }
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleMock(&argc, argv);
  if (std::getenv("MEMGATE_TEST_MARKERS") != nullptr) {
    ::testing::UnitTest::GetInstance()->listeners().Append(new Markers);  // GoogleTest owns it
  }
  // memgate's own tests behave the same on a desk and under CI: CI=true makes a missing baseline fail (a gate that
  // compared nothing is not a pass), which the tests that mean it set themselves, for the processes they start.
  ::unsetenv("CI");
  memgate::exit_fast(RUN_ALL_TESTS());
}
