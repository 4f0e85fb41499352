// Sizing the machine for a distributed probe's CPU ranks: its cores and its available memory.
#include "machine.h"

#include "memgate/base/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>

#include <sched.h>

namespace memgate {

namespace {

// CPU ranks: processes of one intra-op thread each, which may share cores (Gloo's collectives wait without spinning),
// up to this many per core; beyond it the probe is refused rather than started.
constexpr int kRanksPerCore = 8;

// What one rank process holds before its model: LibTorch loaded and a process group joined (measured: a zoo rank
// about 180 MiB of its own (private, beyond the shared library pages), a Python one with torch imported about 350 MiB; README "Distributed probes").
constexpr std::int64_t kRankFootprintBytes = std::int64_t{180} << 20;
constexpr std::int64_t kPythonRankFootprintBytes = std::int64_t{350} << 20;

int cores_for_this_process() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1U, std::thread::hardware_concurrency());
}

// MemAvailable of /proc/meminfo in bytes; -1 where it cannot be read.
std::int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

}  // namespace

namespace detail {

void require_cpu_room(const Workload& workload, int world) {
  const int cores = cores_for_this_process();
  if (world > kRanksPerCore * cores) {
    throw Error(fmt::format("{}: a world size of {} needs {} rank processes, and this process may use {} core{}: "
                            "memgate runs at most {} CPU ranks per core ({} here). Estimate that many ranks without "
                            "processes (memgate estimate --world-size {}), or probe on a machine with more cores",
                            workload.source, world, world, cores, cores == 1 ? "" : "s", kRanksPerCore,
                            kRanksPerCore * cores, world));
  }
  const auto each = workload.model.arch == Arch::kPython ? kPythonRankFootprintBytes : kRankFootprintBytes;
  if (const auto available = available_memory_bytes(); available >= 0 && world * each > available) {
    throw Error(fmt::format("{}: a world size of {} needs {} rank processes of about {} MiB each before their model "
                            "({} MiB), and this machine has {} MiB available (MemAvailable). Estimate that many ranks "
                            "without processes (memgate estimate --world-size {})", workload.source, world, world,
                            each >> 20, (world * each) >> 20, available >> 20, world));
  }
}

}  // namespace detail

}  // namespace memgate
