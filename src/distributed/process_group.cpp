// Process groups a rank joins: LibTorch's ProcessGroupGloo for the CPU, the Meta device's group of no other process
// for estimates, and groups of consecutive ranks (FSDP2's post-forward mesh). NCCL's are in nccl_group.cpp.
#include "memgate/distributed/process_group.h"

#include "memgate/base/error.h"
#include "memgate/base/heartbeat.h"
#include "memgate/estimate/estimate_context.h"
#include "memgate/estimate/meta_kernels.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

namespace memgate {

namespace {

// ProcessGroupGloo's options with one worker thread (PyTorch's default is two). A collective's Work holds its
// tensors until its last reference goes, and the worker's goes when the worker gets to it after the collective ran,
// which on a loaded machine can be well into the next forward: a tensor the program has dropped (DDP's first
// buckets, the indices its rebuild broadcasts) then lives on at the scheduler's whim. With one worker, works run and
// are let go in order, so a barrier behind them (let_gloo_go) returns only once every earlier one is dropped.
c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> gloo_options(std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create_default(timeout);
  options->threads = 1;
  return options;
}

// A process group of `size` ranks over `store`, LibTorch's ProcessGroupGloo its CPU backend and its default.
c10::intrusive_ptr<c10d::ProcessGroup> gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                  std::chrono::milliseconds timeout) {
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  add_gloo_backend(*group, store, rank, size, timeout);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  return group;
}

}  // namespace

void add_gloo_backend(c10d::ProcessGroup& group, const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                      std::chrono::milliseconds timeout) {
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, gloo_options(timeout));
  group.setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
}

void let_gloo_go(const RankGroup& group) {
  if (!group.store) return;  // the Meta device's collectives are done as issued and hold nothing
  // The backend's own barrier: the process group's would allocate a tensor for it.
  const ProgressSection section("in a collective: barrier");
  group.group->getBackend(c10::DeviceType::CPU)->barrier()->wait();
}

RankGroup join_gloo_group(const std::string& store_path, int rank, int world_size, std::chrono::seconds timeout) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw Error(fmt::format("rank {} of {}: expected 0 <= rank < world size", rank, world_size));
  }
  auto store = c10::make_intrusive<c10d::FileStore>(store_path, world_size);
  store->setTimeout(timeout);
  auto group = gloo_group(store, rank, world_size, timeout);
  return {rank, world_size, std::move(group), std::move(store), timeout};
}

RankGroup consecutive_subgroup(const RankGroup& group, int size) {
  if (size < 1 || group.world_size % size != 0) {
    throw Error(fmt::format("a group of {} consecutive ranks out of {}: expected a divisor of the world size", size,
                            group.world_size));
  }
  const int first = group.rank / size * size;
  const int rank = group.rank - first;
  if (!group.store) return meta_process_group(rank, size);
  if (group.device.is_cuda()) return nccl_subgroup(group, first, size);
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::PrefixStore>(
      fmt::format("ranks_{}_to_{}", first, first + size - 1), group.store);
  auto sub = gloo_group(store, rank, size, group.timeout);
  return {rank, size, std::move(sub), std::move(store), group.timeout};
}

namespace {

// A collective of the Meta device's process group: done as soon as it is issued, its outputs (the tensors it was
// given, in place) in its future, as Gloo's and NCCL's works hold them for the Reducer.
class DoneWork final : public c10d::Work {
 public:
  explicit DoneWork(std::vector<at::Tensor> tensors) : tensors_(std::move(tensors)) {}
  bool isCompleted() override { return true; }
  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    future->markCompleted(c10::IValue(tensors_));
    return future;
  }

 private:
  std::vector<at::Tensor> tensors_;
};

using CollectiveResult = std::tuple<std::vector<at::Tensor>, c10::intrusive_ptr<c10d::Work>>;
using CollectiveResult1 = std::tuple<at::Tensor, c10::intrusive_ptr<c10d::Work>>;

// For the CPU, Gloo's average as it runs: the sum divided by N in place (tensor.div_(size)), whose int64 0-dim N and
// its copy in the tensor's dtype live together for the division.
CollectiveResult meta_allreduce(at::TensorList tensors, const c10::intrusive_ptr<c10d::ProcessGroup>& /*group*/,
                                const c10::intrusive_ptr<c10d::ReduceOp>& op,
                                const std::optional<at::Tensor>& /*sparse_indices*/, bool /*async_op*/,
                                std::int64_t /*timeout*/) {
  if (estimate_context().target == EstimateTarget::kCpu && op->op_ == c10d::ReduceOp::AVG) {
    for (const auto& t : tensors) {
      const auto size = at::empty({}, t.options().dtype(at::kLong));
      const auto cast = at::empty({}, t.options());
    }
  }
  std::vector<at::Tensor> out(tensors.begin(), tensors.end());
  return {out, c10::make_intrusive<DoneWork>(out)};
}

CollectiveResult meta_broadcast(at::TensorList tensors, const c10::intrusive_ptr<c10d::ProcessGroup>& /*group*/,
                                std::int64_t /*root_rank*/, std::int64_t /*root_tensor*/, bool /*async_op*/,
                                std::int64_t /*timeout*/) {
  std::vector<at::Tensor> out(tensors.begin(), tensors.end());
  return {out, c10::make_intrusive<DoneWork>(out)};
}

// For the CPU, Gloo's all-gather as it runs: into a flat output of its own (AsyncAllgatherWork's flatOutputTensor,
// the size of the output), copied out into the output, and freed before the work completes. NCCL gathers in place.
CollectiveResult1 meta_allgather_base(at::Tensor& output, at::Tensor& /*input*/,
                                      const c10::intrusive_ptr<c10d::ProcessGroup>& /*group*/, bool /*async_op*/,
                                      std::int64_t /*timeout*/) {
  if (estimate_context().target == EstimateTarget::kCpu) (void)at::empty_like(output);
  return {output, c10::make_intrusive<DoneWork>(std::vector<at::Tensor>{output})};
}

CollectiveResult1 meta_reduce_scatter_base(at::Tensor& output, at::Tensor& /*input*/,
                                           const c10::intrusive_ptr<c10d::ProcessGroup>& /*group*/,
                                           const c10::intrusive_ptr<c10d::ReduceOp>& /*op*/, bool /*async_op*/,
                                           std::int64_t /*timeout*/) {
  return {output, c10::make_intrusive<DoneWork>(std::vector<at::Tensor>{output})};
}

}  // namespace

// In-place collectives on Meta tensors: their outputs are their inputs, shapes and all (PyTorch registers these in
// Python, torch/distributed/_meta_registrations.py; LibTorch alone has none).
// (The boxing LibTorch's headers inline here reads IValue vectors GCC 12 cannot prove non-null.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
TORCH_LIBRARY_IMPL(c10d, Meta, m) {
  m.impl("allreduce_", meta_allreduce);
  m.impl("broadcast_", meta_broadcast);
  m.impl("_allgather_base_", meta_allgather_base);
  m.impl("_reduce_scatter_base_", meta_reduce_scatter_base);
}
#pragma GCC diagnostic pop

RankGroup meta_process_group(int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw Error(fmt::format("rank {} of {}: expected 0 <= rank < world size", rank, world_size));
  }
  return {rank, world_size, c10::make_intrusive<c10d::ProcessGroup>(rank, world_size), /*store=*/{}, /*timeout=*/{}};
}

}  // namespace memgate
