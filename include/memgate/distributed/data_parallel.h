// DistributedDataParallel in C++: what torch.nn.parallel.DistributedDataParallel does to a module's memory, with the
// same c10d calls (LibTorch's c10d::Reducer and its buckets).
#pragma once

#include "memgate/distributed/process_group.h"
#include "memgate/distributed/spec.h"

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace c10d {
class Reducer;
}  // namespace c10d

namespace memgate {

/// torch.nn.parallel.DistributedDataParallel over a module, in C++: what its constructor and forward do, with the
/// same c10d calls. The constructor checks the parameters' shapes across ranks and broadcasts parameters and buffers
/// from rank 0 (each in place, where DDP coalesces them into 250 MiB buffers: see broadcast_in_place in
/// distributed.cpp), then builds LibTorch's c10d::Reducer over the
/// parameters that train with the bucket assignment DDP passes it (compute_bucket_assignment_by_size: one bucket for
/// the first iteration, since no unused parameters are searched for; reversed), `bucket_cap_mb` and its first-bucket
/// cap, and `gradient_as_bucket_view`. The Reducer hooks each parameter's gradient accumulator, copies gradients
/// into its buckets, all-reduces each full bucket over the group and averages; after the first backward it rebuilds
/// its buckets in the order gradients arrived, at the next forward.
class DataParallel {
 public:
  DataParallel(torch::nn::Module& module, std::vector<torch::Tensor> trainable, const DistributedSpec& spec,
               RankGroup group);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  /// DistributedDataParallel._pre_forward: with gradients enabled and `sync` (not inside no_sync()),
  /// prepare_for_forward; with gradients enabled, rebuild the buckets once (before the forward's peak, as DDP
  /// does); broadcast the module's buffers from rank 0 while parameters are in sync.
  void pre_forward(bool sync);
  /// DistributedDataParallel._post_forward: with gradients enabled and `sync`, prepare_for_backward (no unused
  /// parameters are searched for).
  void post_forward(bool sync);
  /// Bytes of the Reducer's buckets (each bucket's flat gradient tensor) and how many there are.
  [[nodiscard]] std::int64_t bucket_bytes() const;
  [[nodiscard]] std::int64_t bucket_count() const;

 private:
  void rebuild_buckets_on_meta();

  torch::nn::Module& module_;
  RankGroup group_;
  std::vector<torch::Tensor> params_;
  DistributedSpec spec_;
  std::unique_ptr<c10d::Reducer> reducer_;
  bool require_forward_param_sync_ = true;
  /// On the Meta device: the order in which the first backward's gradients arrived (parameter indices), recorded
  /// by hooks on the parameters until the buckets are rebuilt from it.
  struct ArrivalLog {
    bool recording = true;
    std::vector<std::int64_t> order;
  };
  std::shared_ptr<ArrivalLog> arrival_;
};

}  // namespace memgate
