// A rank's process group on GPUs: LibTorch's ProcessGroupNCCL for CUDA tensors (and Gloo for CPU ones), as
// torch.distributed.init_process_group("cpu:gloo,cuda:nccl", device_id=...) builds it, with the memory its NCCL
// communicators take outside the caching allocator measured as they connect.
#include "memgate/base/error.h"
#include "memgate/distributed/process_group.h"

#include <fmt/format.h>

#if MEMGATE_HAVE_NCCL
#include "memgate/backend/memory_backend.h"

#include <c10/cuda/CUDAGuard.h>
#include <nccl.h>
#include <torch/csrc/cuda/nccl.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <atomic>
#endif

namespace memgate {

#if MEMGATE_HAVE_NCCL

namespace {

std::atomic<std::int64_t> g_communicator_bytes{0};

void require_matching_nccl() {
  if (auto problem = nccl_layout_problem(); !problem.empty()) throw Error(problem);
}

// A process group of `size` ranks over `store` whose CUDA backend is ProcessGroupNCCL on `device` (bound to it, as
// init_process_group(device_id=) binds it) and whose CPU backend is Gloo; NCCL is the default. The communicator is
// connected now (eagerConnectSingleDevice, what a bound device_id does in init_process_group), not at the first
// collective, and what it took on the device outside the caching allocator is added to communicator_bytes().
c10::intrusive_ptr<c10d::ProcessGroup> nccl_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                  c10::Device device, std::chrono::milliseconds timeout) {
  const c10::cuda::CUDAGuard guard(device);
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  group->setBoundDeviceId(device);
  add_gloo_backend(*group, store, rank, size, timeout);
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
  group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
  // What the device holds outside the caching allocator, as the probe reads it (its backend sets CUDA up first).
  const auto backend = make_memory_backend(device);
  const auto before = backend->outside_allocator_bytes();
  nccl->eagerConnectSingleDevice(device);
  g_communicator_bytes += backend->outside_allocator_bytes() - before;
  return group;
}

}  // namespace

bool nccl_available() { return true; }

// ProcessGroupNCCL's layout (its Options, the object itself) follows the NCCL version of the nccl.h it is compiled
// with (NCCLUtils.hpp's NCCL_HAS_* macros): LibTorch's NCCL must be the one memgate was compiled against, major and
// minor. And LibTorch's own constructor of the Options must fill the fields where this compilation reads them: its
// ncclConfig_t (NCCL_CONFIG_INITIALIZER: size, magic, version) and the split colour after it.
std::string nccl_layout_problem() {
  const auto linked = torch::cuda::nccl::version();
  const auto major = static_cast<int>(linked >> 32), minor = static_cast<int>((linked >> 16) & 0xffff);
  if (major != NCCL_MAJOR || minor != NCCL_MINOR) {
    return fmt::format("LibTorch runs NCCL {}.{}, and memgate was compiled against NCCL {}.{}'s nccl.h: build memgate "
                       "against the nccl.h of the wheel's nvidia-nccl package (its CMake finds it beside torch)", major,
                       minor, NCCL_MAJOR, NCCL_MINOR);
  }
  const auto options = c10d::ProcessGroupNCCL::Options::create(/*is_high_priority_stream=*/true);
  const ncclConfig_t expected = NCCL_CONFIG_INITIALIZER;
  if (!options->is_high_priority_stream || options->config.size != expected.size ||
      options->config.magic != expected.magic || options->config.version != expected.version ||
      options->split_color != NCCL_SPLIT_NOCOLOR - 1 || options->backend != "nccl") {
    return fmt::format("ProcessGroupNCCL::Options as LibTorch builds them do not read back as memgate's headers lay "
                       "them out (config size {} magic {:#x} version {}, expected {} {:#x} {}; split colour {}): the "
                       "nccl.h or torch headers memgate was compiled with are not LibTorch's",
                       options->config.size, options->config.magic, options->config.version, expected.size,
                       expected.magic, expected.version, options->split_color);
  }
  return {};
}

std::int64_t communicator_bytes() { return g_communicator_bytes.load(); }

RankGroup join_nccl_group(const std::string& store_path, int rank, int world_size, c10::Device device,
                          std::chrono::seconds timeout) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw Error(fmt::format("rank {} of {}: expected 0 <= rank < world size", rank, world_size));
  }
  if (!device.is_cuda() || !device.has_index()) {
    throw Error(fmt::format("rank {}: NCCL ranks run on a GPU of their own (cuda:N), not on {}", rank, device.str()));
  }
  require_matching_nccl();
  // The rank's GPU is current before anything touches CUDA: nothing of this process lands on another GPU (a context
  // on GPU 0 from every rank is PyTorch issue 49481's extra memory on rank 0).
  c10::cuda::set_device(device.index());
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);  // the caching allocator, read below
  auto store = c10::make_intrusive<c10d::FileStore>(store_path, world_size);
  store->setTimeout(timeout);
  auto group = nccl_group(store, rank, world_size, device, timeout);
  return {rank, world_size, std::move(group), std::move(store), timeout, device};
}

RankGroup nccl_subgroup(const RankGroup& group, int first, int size) {
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::PrefixStore>(
      fmt::format("ranks_{}_to_{}", first, first + size - 1), group.store);
  auto sub = nccl_group(store, group.rank - first, size, group.device, group.timeout);
  return {group.rank - first, size, std::move(sub), std::move(store), group.timeout, group.device};
}

void shut_down_nccl(const RankGroup& group) {
  if (!group.device.is_cuda() || !group.group) return;
  group.group->getBackend(c10::DeviceType::CUDA)->shutdown();
}

#else

bool nccl_available() { return false; }

std::string nccl_layout_problem() { return "this memgate was built without NCCL"; }

std::int64_t communicator_bytes() { return 0; }

namespace {
[[noreturn]] void no_nccl(int rank) {
  throw Error(fmt::format("rank {}: this memgate was built without NCCL (no CUDA LibTorch or no nccl.h when it was "
                          "configured), so its ranks cannot train on GPUs", rank));
}
}  // namespace

RankGroup join_nccl_group(const std::string&, int rank, int, c10::Device, std::chrono::seconds) { no_nccl(rank); }

RankGroup nccl_subgroup(const RankGroup& group, int, int) { no_nccl(group.rank); }

void shut_down_nccl(const RankGroup&) {}

#endif

}  // namespace memgate
