// Sizing the machine for a distributed probe's CPU ranks: how many processes this machine can hold.
#pragma once

#include "memgate/measure/train_step.h"

namespace memgate::detail {

/// A world of CPU ranks this machine cannot hold (more than 8 per core this process may use, or more rank processes
/// than MemAvailable holds before their model) is refused before any starts: the limit named, and the way out.
void require_cpu_room(const Workload& workload, int world);

}  // namespace memgate::detail
