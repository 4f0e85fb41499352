// torch.nn.parallel.DistributedDataParallel in C++: the parameters synced from rank 0, LibTorch's c10d::Reducer over
// the trainable ones with DDP's bucket assignment, and its bucket rebuild.
#include "memgate/distributed/data_parallel.h"

#include "memgate/base/error.h"
#include "memgate/base/heartbeat.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <torch/torch.h>

#include <algorithm>

namespace memgate {

namespace {

// Rank 0's tensors to every rank, each in place. DistributedDataParallel broadcasts them coalesced
// (c10d::broadcast_coalesced: flat 250 MiB buffers); the flat buffer is freed when Gloo's worker thread lets go of
// the broadcast, which is sometimes after the first forward has begun: PyTorch's own DDP read 0.86 MB more in one
// rank's eval_peak in one probe of twelve (tools/ddp_reference.py), and so did this code when it broadcast coalesced.
// In place, a collective holds only the tensors it syncs, which live on: no byte depends on the worker's timing.
void broadcast_in_place(const c10::intrusive_ptr<c10d::ProcessGroup>& group, const std::vector<torch::Tensor>& tensors) {
  const ProgressSection section("in a collective: broadcast");
  for (const auto& t : tensors) {
    std::vector<torch::Tensor> one{t};
    group->broadcast(one)->wait();
    note_progress();
  }
}

std::vector<torch::Tensor> detached(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) out.push_back(t.detach());
  return out;
}

}  // namespace

DataParallel::DataParallel(torch::nn::Module& module, std::vector<torch::Tensor> trainable, const DistributedSpec& spec,
                           RankGroup group)
    : module_(module), group_(std::move(group)), params_(trainable), spec_(spec) {
  // _verify_param_shape_across_processes, then _sync_module_states: every parameter, then every buffer.
  // (The shape check all-gathers and reads the shapes back on the CPU: not on the Meta device, where every rank is
  // this one.)
  if (trainable.empty() || !trainable.front().is_meta()) {
    c10d::verify_params_across_processes(group_.group, trainable, std::nullopt);
  }
  auto states = detached(module_.parameters());
  for (const auto& b : module_.buffers()) states.push_back(b.detach());
  broadcast_in_place(group_.group, states);
  // _ddp_init_helper: without unused-parameter search the first iteration has one bucket (sys.maxsize); the
  // Reducer takes the buckets reversed.
  const std::vector<bool> expect_sparse(trainable.size(), false);
  auto [buckets, limits] = c10d::compute_bucket_assignment_by_size(
      trainable, {static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max())}, expect_sparse);
  (void)limits;
  std::reverse(buckets.begin(), buckets.end());
  if (!params_.empty() && params_.front().is_meta()) {
    // The Reducer's rebuild reads the rebuilt bucket indices back from the device after broadcasting them, which a
    // Meta tensor cannot do: on Meta the rebuild is done here, from the same arrival order, by the same functions.
    arrival_ = std::make_shared<ArrivalLog>();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      params_[i].register_hook([arrival = arrival_, i](const torch::Tensor&) {
        if (arrival->recording) arrival->order.push_back(static_cast<std::int64_t>(i));
        return torch::Tensor();
      });
    }
  }
  reducer_ = std::make_unique<c10d::Reducer>(
      std::move(trainable), std::move(buckets), group_.group, expect_sparse, spec.bucket_bytes_cap(),
      /*find_unused_parameters=*/false, spec.gradient_as_bucket_view,
      /*param_names=*/std::unordered_map<std::size_t, std::string>{}, spec.first_bucket_bytes_cap(),
      /*skip_all_reduce_unused_params=*/false, /*use_python_reducer=*/false,
      /*bucket_bytes_cap_list=*/std::vector<std::int64_t>{});
  let_gloo_go(group_);  // the shape check's all-gather buffers freed before the first forward
}

DataParallel::~DataParallel() = default;

void DataParallel::pre_forward(bool sync) {
  const bool grad = torch::GradMode::is_enabled();
  if (grad && sync) reducer_->prepare_for_forward();
  if (grad) {
    if (arrival_) {
      rebuild_buckets_on_meta();
    } else if (reducer_->rebuild_buckets()) {
      // The first iteration's buckets and the broadcast bucket indices freed now, not when Gloo's worker gets to
      // them: a 2-rank probe capped just above its peak ran out of memory in one run of a few dozen without this.
      let_gloo_go(group_);
    }
  }
  const auto buffers = module_.buffers();
  if (require_forward_param_sync_ && !buffers.empty()) {
    torch::NoGradGuard no_grad;
    broadcast_in_place(group_.group, detached(buffers));
  }
}

// Reducer::rebuild_buckets without its broadcast of the indices: the parameters in the order their gradients
// arrived in the first backward, assigned to buckets of the first-bucket cap, then the cap.
void DataParallel::rebuild_buckets_on_meta() {
  if (!arrival_->recording || arrival_->order.empty()) return;
  std::vector<torch::Tensor> ordered;
  std::vector<std::int64_t> indices;
  std::vector<bool> seen(params_.size(), false);
  for (const auto i : arrival_->order) {
    if (seen[static_cast<std::size_t>(i)]) continue;
    seen[static_cast<std::size_t>(i)] = true;
    ordered.push_back(params_[static_cast<std::size_t>(i)]);
    indices.push_back(i);
  }
  const std::vector<bool> expect_sparse(ordered.size(), false);
  auto [buckets, limits] = c10d::compute_bucket_assignment_by_size(
      ordered,
      {static_cast<std::size_t>(spec_.first_bucket_bytes_cap()), static_cast<std::size_t>(spec_.bucket_bytes_cap())},
      expect_sparse, indices);
  (void)limits;
  reducer_->initialize_buckets(std::move(buckets));
  arrival_->recording = false;
  arrival_->order.clear();
}

void DataParallel::post_forward(bool sync) {
  if (torch::GradMode::is_enabled() && sync) {
    require_forward_param_sync_ = true;
    reducer_->prepare_for_backward({});
  } else {
    require_forward_param_sync_ = false;
  }
}

std::int64_t DataParallel::bucket_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& bucket : reducer_->get_grad_buckets(/*return_zero_tensors=*/false)) {
    bytes += static_cast<std::int64_t>(bucket.getBuffer().nbytes());
  }
  return bytes;
}

std::int64_t DataParallel::bucket_count() const {
  return static_cast<std::int64_t>(reducer_->get_grad_buckets(/*return_zero_tensors=*/false).size());
}

}  // namespace memgate
