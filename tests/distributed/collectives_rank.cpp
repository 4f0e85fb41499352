// One rank of a c10d process group on the CPU: memgate_c10d_rank <rank> <world_size> <file store path>.
// The ranks meet through a c10d::FileStore, build LibTorch's own ProcessGroupGloo (from the torch wheel, compiled
// against Debian's gloo headers: every gloo type it holds is behind a pointer, so only the wheel's layout counts)
// and run the collectives DDP and FSDP are made of, each checked against the value it must give. Prints one line per
// collective and exits 0 only when all are right (tests/distributed/c10d_test.cpp starts the ranks).
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>

namespace {

int g_failures = 0;

void check(int rank, const char* what, bool ok) {
  std::cout << "rank " << rank << " " << what << (ok ? " ok" : " WRONG") << "\n";
  if (!ok) ++g_failures;
}

torch::Tensor filled(std::int64_t n, double value) { return torch::full({n}, value); }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: memgate_c10d_rank <rank> <world_size> <file store path>\n";
    return 2;
  }
  const int rank = std::atoi(argv[1]);
  const int world = std::atoi(argv[2]);
  try {
    auto store = c10::make_intrusive<c10d::FileStore>(argv[3], world);
    store->setTimeout(std::chrono::seconds(60));
    auto options = c10d::ProcessGroupGloo::Options::create_default(std::chrono::seconds(60));
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, options);
    check(rank, "backend is gloo", pg->getBackendName() == "gloo");

    // allreduce (DDP's bucket reduction): the sum over ranks of rank + 1.
    std::vector<torch::Tensor> sum{filled(1000, rank + 1.0)};
    pg->allreduce(sum)->wait();
    check(rank, "allreduce", torch::equal(sum[0], filled(1000, world * (world + 1) / 2.0)));

    // broadcast (DDP's initial parameter sync) from rank 0.
    std::vector<torch::Tensor> params{rank == 0 ? torch::arange(64).to(torch::kFloat) : torch::zeros({64})};
    pg->broadcast(params)->wait();
    check(rank, "broadcast", torch::equal(params[0], torch::arange(64).to(torch::kFloat)));

    // all-gather into one flat buffer (FSDP2's unshard): rank r's shard at offset r.
    auto shard = filled(8, rank * 10.0);
    auto gathered = torch::empty({8 * world});
    pg->_allgather_base(gathered, shard)->wait();
    bool all_gather_ok = true;
    for (int r = 0; r < world; ++r) all_gather_ok &= torch::equal(gathered.narrow(0, 8 * r, 8), filled(8, r * 10.0));
    check(rank, "all-gather into one buffer", all_gather_ok);

    // reduce-scatter from one flat buffer (FSDP2's gradient reduction): rank r keeps the sum of chunk r.
    auto unsharded = torch::arange(8 * world).to(torch::kFloat);
    auto reduced = torch::empty({8});
    pg->_reduce_scatter_base(reduced, unsharded)->wait();
    check(rank, "reduce-scatter from one buffer",
          torch::equal(reduced, torch::arange(8 * rank, 8 * rank + 8).to(torch::kFloat) * world));

    pg->barrier()->wait();
    check(rank, "barrier", true);
  } catch (const std::exception& e) {
    std::cout << "rank " << rank << " FAILED: " << e.what() << "\n";
    return 1;
  }
  std::cout.flush();
  return g_failures == 0 ? 0 : 1;
}
