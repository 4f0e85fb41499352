// The fault points of the test-only program memgate-measure-faults (launch/fault_points.h): memgate-measure's own
// objects linked with these definitions, which replace the library's empty ones. tests/launch/faults_test.cpp and
// watchdog_test.cpp run it; it is never installed, and no shipped program reads the variables below.
#include "memgate/launch/fault_points.h"

#include <c10/util/Exception.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <string>
#include <string_view>
#include <thread>

namespace memgate {

// MEMGATE_TEST_RANK_FAULT=<rank>:<fault>:<phase> makes rank <rank> fail when a phase containing <phase> starts:
// `error` (a LibTorch error, with its C++ stack), `exit` (status 7 at once), `stop` (SIGSTOP to itself, once its
// heartbeat has said where: a stopped process), `hang` (sleeps for ever, heartbeat going: a wedged call, which makes
// no progress), `crash` (SIGSEGV), `slow` (a minute's sleep, heartbeat going: a long step).
void fault_points::at_phase(int rank, std::string_view phase) {
  const char* spec = std::getenv("MEMGATE_TEST_RANK_FAULT");
  if (spec == nullptr) return;
  const std::string_view text(spec);
  const auto first = text.find(':'), second = text.find(':', first + 1);
  if (first == std::string_view::npos || second == std::string_view::npos) return;
  if (text.substr(0, first) != std::to_string(rank) || phase.find(text.substr(second + 1)) == std::string_view::npos) {
    return;
  }
  const auto fault = text.substr(first + 1, second - first - 1);
  if (fault == "error") TORCH_CHECK(false, "a fault injected by MEMGATE_TEST_RANK_FAULT at ", phase);
  if (fault == "exit") std::_Exit(7);
  if (fault == "stop") {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::raise(SIGSTOP);
  }
  if (fault == "slow") std::this_thread::sleep_for(std::chrono::minutes(1));
  if (fault == "hang") {
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }
  if (fault == "crash") std::raise(SIGSEGV);
}

// MEMGATE_TEST_FAIL_START=<index>: the child at <index> cannot start (the ones before it start and must be ended).
bool fault_points::fails_to_start(std::size_t index) {
  const char* fault = std::getenv("MEMGATE_TEST_FAIL_START");
  return fault != nullptr && std::to_string(index) == fault;
}

}  // namespace memgate
