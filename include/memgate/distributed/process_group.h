// The c10d process group a rank of a distributed run joins: Gloo on the CPU, NCCL on GPUs, the Meta device's for
// estimates, and subgroups of consecutive ranks.
#pragma once

#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>
#include <cstdint>
#include <string>

namespace memgate {

/// This process's place among the ranks of a distributed run.
struct RankGroup {
  int rank = 0;
  int world_size = 1;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  c10::intrusive_ptr<c10d::Store> store;  ///< where the ranks met (none on the Meta device)
  std::chrono::milliseconds timeout{0};
  /// Where its collectives run: the CPU (Gloo), or this rank's GPU (NCCL, join_nccl_group).
  c10::Device device{c10::DeviceType::CPU};
};

/// Joins the `world_size` ranks that meet through the c10d::FileStore at `store_path`, over LibTorch's own
/// ProcessGroupGloo (the backend PyTorch uses on CPUs) as the group's CPU backend. Blocks until every rank has
/// joined; a rank missing after `timeout` is an error, and so is a collective that waits longer.
[[nodiscard]] RankGroup join_gloo_group(const std::string& store_path, int rank, int world_size,
                                        std::chrono::seconds timeout);

/// Gives `group` LibTorch's ProcessGroupGloo as its CPU backend, with one worker thread (let_gloo_go).
void add_gloo_backend(c10d::ProcessGroup& group, const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                      std::chrono::milliseconds timeout);

/// Joins the `world_size` ranks that meet through the c10d::FileStore at `store_path` on this rank's GPU `device`
/// (cuda:N, made the current device first, so that nothing of this process lands on another GPU), as
/// torch.distributed.init_process_group("cpu:gloo,cuda:nccl", device_id=device) does: LibTorch's ProcessGroupNCCL
/// for CUDA tensors, bound to the device and connected now (its NCCL communicator created before anything is
/// measured), Gloo for CPU ones. What the communicator takes on the device outside the caching allocator (NCCL's
/// buffers, its stream, its kernels) is added to communicator_bytes(). Throws memgate::Error where memgate was built
/// without NCCL, or where LibTorch's NCCL is of another version than the nccl.h memgate was compiled against.
[[nodiscard]] RankGroup join_nccl_group(const std::string& store_path, int rank, int world_size, c10::Device device,
                                        std::chrono::seconds timeout);

/// Whether this memgate was built with NCCL (a CUDA LibTorch and NCCL's headers), so that ranks can train on GPUs.
[[nodiscard]] bool nccl_available();

/// Empty where LibTorch's ProcessGroupNCCL is laid out as memgate's headers say (the NCCL version LibTorch runs is
/// the one memgate was compiled against, and ProcessGroupNCCL::Options built by LibTorch read back as expected);
/// else what differs. join_nccl_group refuses to start a rank otherwise. Needs no GPU.
[[nodiscard]] std::string nccl_layout_problem();

/// The bytes this process's NCCL communicators took on its GPU outside the caching allocator, measured as each
/// connected (cudaMemGetInfo's used bytes across the connection, less what the caching allocator reserved
/// meanwhile); 0 without NCCL groups.
[[nodiscard]] std::int64_t communicator_bytes();

/// Shuts the NCCL backend of a GPU rank's group down (its communicators destroyed), as destroy_process_group does;
/// nothing for a CPU or Meta group.
void shut_down_nccl(const RankGroup& group);

/// Rank `rank` of `world_size` on the Meta device (an estimate): a process group of no other process, whose
/// collectives (all-reduce, broadcast) are done as they are issued, their outputs in place with their shapes.
[[nodiscard]] RankGroup meta_process_group(int rank, int world_size);

/// Returns once the group's backend has let go of every collective issued before (and so of the tensors they
/// held): a barrier behind them on Gloo's one worker thread. Nothing to wait for on the Meta device.
void let_gloo_go(const RankGroup& group);

/// The group of the `size` consecutive ranks of `group` that hold this rank (ranks [k*size, (k+1)*size)): a
/// ProcessGroupGloo of their own over a prefix of the store (each rank builds only its own), or on the Meta device
/// another Meta group. `size` divides the world size.
[[nodiscard]] RankGroup consecutive_subgroup(const RankGroup& group, int size);

/// consecutive_subgroup on GPUs: the ranks [first, first + size) of a GPU rank's `group`, over a ProcessGroupNCCL of
/// their own (a communicator of its own, connected now and counted in communicator_bytes()).
[[nodiscard]] RankGroup nccl_subgroup(const RankGroup& group, int first, int size);

}  // namespace memgate
