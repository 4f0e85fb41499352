// The points where memgate's tests of the launcher inject faults into a probe's processes: a rank at the start of
// a phase, a child as it is started. The library's own definitions do nothing (launch/children.cpp, weak); the
// test-only program memgate-measure-faults (tests/launch/fault_injection.cpp, built beside memgate-measure and never
// installed) links its own, which read the variables that say which fault to inject. No shipped program reads them.
#pragma once

#include <cstddef>
#include <string_view>

namespace memgate::fault_points {

/// Rank `rank` of a probe starts `phase` (rank_main's phases: "joining", "measured step: forward", ...).
void at_phase(int rank, std::string_view phase);

/// Whether starting the child at `index` (0 for the first of a probe's children) is to fail.
bool fails_to_start(std::size_t index);

}  // namespace memgate::fault_points
