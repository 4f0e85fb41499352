// Real collectives between processes on the CPU, through LibTorch's c10d: N ranks of memgate_c10d_rank meet through
// a FileStore and run Gloo's allreduce, broadcast, all-gather and reduce-scatter, each rank checking the values
// (the base of per-rank DDP and FSDP probes: the wheel's ProcessGroupGloo, compiled against Debian's gloo headers).
#include "test_util.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <unistd.h>

namespace memgate {
namespace {

using ::testing::HasSubstr;

class C10dGlooTest : public ::testing::TestWithParam<int> {};

TEST_P(C10dGlooTest, CollectivesBetweenProcessesGiveTheRightValues) {
  const int world = GetParam();
  const auto store = std::filesystem::temp_directory_path() /
                     fmt::format("memgate-c10d-{}-{}", ::getpid(), world);
  std::filesystem::remove(store);
  // Every rank in the background, then each one's exit status: the test fails on the first rank that fails.
  std::string command = "pids=''; ";
  for (int r = 0; r < world; ++r) {
    command += fmt::format("'{}' {} {} '{}' 2>&1 & pids=\"$pids $!\"; ", MEMGATE_C10D_RANK, r, world, store.string());
  }
  command += "status=0; for p in $pids; do wait $p || status=1; done; exit $status";
  const auto result = memgate::testing::run_test_shell(command);
  std::filesystem::remove(store);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  for (int r = 0; r < world; ++r) {
    for (const auto* what : {"allreduce", "broadcast", "all-gather into one buffer", "reduce-scatter from one buffer",
                             "barrier"}) {
      EXPECT_THAT(result.output, HasSubstr(fmt::format("rank {} {} ok", r, what))) << result.output;
    }
  }
  EXPECT_THAT(result.output, ::testing::Not(HasSubstr("WRONG")));
}

INSTANTIATE_TEST_SUITE_P(Ranks, C10dGlooTest, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& p) { return "world" + std::to_string(p.param); });

}  // namespace
}  // namespace memgate
