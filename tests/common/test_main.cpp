// The test programs' main: GoogleTest's, ended without the destructors of static objects (base/process.h). A test
// program that loads LibTorch spends a third of an empty run (0.13 s of 0.44 s) unregistering LibTorch's operators
// as it exits, once per CTest test (a suite or a shard of one). It unsets CI (see below).
#include "memgate/base/process.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

int main(int argc, char** argv) {
  ::testing::InitGoogleMock(&argc, argv);
  // memgate's own tests behave the same on a desk and under CI: CI=true makes a missing baseline fail (a gate that
  // compared nothing is not a pass), which the tests that mean it set themselves, for the processes they start.
  ::unsetenv("CI");
  memgate::exit_fast(RUN_ALL_TESTS());
}
