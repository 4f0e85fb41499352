// FSDP2's collectives per optimizer step, counted from the parameters as fully_shard shards them (plan/communication.h;
// the units and shards as src/distributed/fully_shard.cpp makes them, from torch 2.11's _fully_shard).
#include "memgate/plan/communication.h"

#include "memgate/models/autocast.h"
#include "memgate/models/zoo.h"

#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

namespace memgate {

namespace {

// The model's parameters (built on the Meta device, trainable as the fixture says) grouped as fully_shard makes its
// units: each block's parameters (units: blocks), then the root with the rest; each parameter by its index in the
// model's order. `first_trainable`: the first trainable parameter's index (a block's output needs a gradient from there
// on); the number of parameters where none trains.
struct FsdpUnits {
  torch::OrderedDict<std::string, torch::Tensor> named;
  std::vector<std::vector<std::size_t>> units;
  std::size_t first_trainable = 0;
  /// Whether unit `u`'s output needs a gradient (the unit, or one before it in the model's order, trains).
  [[nodiscard]] bool needs_gradient(std::size_t u) const {
    const auto& unit = units[u];
    return first_trainable < named.size() &&
           (u + 1 == units.size() || first_trainable <= *std::max_element(unit.begin(), unit.end()));
  }
};

FsdpUnits fsdp_units(const Workload& workload) {
  const auto& d = workload.training.distributed;
  const auto model = build_model(workload.model, c10::Device(c10::DeviceType::Meta));
  (void)select_trainable(*model, workload.training.trainable, workload.source);
  FsdpUnits out;
  out.named = model->module().named_parameters(/*recurse=*/true);
  const auto& named = out.named;
  auto& units = out.units;
  std::vector<bool> taken(named.size(), false);
  if (d.units == "blocks") {
    for (const auto& prefix : model->unit_prefixes()) {
      auto& unit = units.emplace_back();
      for (std::size_t i = 0; i < named.size(); ++i) {
        if (!taken[i] && named[i].key().starts_with(prefix)) {
          unit.push_back(i);
          taken[i] = true;
        }
      }
    }
  }
  auto& root = units.emplace_back();
  for (std::size_t i = 0; i < named.size(); ++i) {
    if (!taken[i]) root.push_back(i);
  }
  out.first_trainable = named.size();
  for (std::size_t i = 0; i < named.size(); ++i) {
    if (named[i].value().requires_grad()) {
      out.first_trainable = i;
      break;
    }
  }
  return out;
}

// A parameter's dim-0 shard padded to torch.chunk's first chunk (ceil(rows / N) rows), in elements: every rank's.
std::int64_t padded_shard_numel(const torch::Tensor& p, std::int64_t world) {
  const auto rows = p.size(0);
  return (rows + world - 1) / world * (p.numel() / rows);
}

}  // namespace

std::optional<FsdpCommunication> fsdp_communication(const Workload& workload) {
  const auto& t = workload.training;
  const auto& d = t.distributed;
  if (d.strategy != DistributedStrategy::kFsdp) return std::nullopt;
  if (workload.model.arch == Arch::kPython || workload.model.arch == Arch::kTorchScript) return std::nullopt;
  const auto counted = fsdp_units(workload);
  const auto& named = counted.named;
  const auto& units = counted.units;
  const auto world = d.world_size;
  // MixedPrecisionPolicy's param_dtype: training.precision under FSDP.
  const bool mixed = t.precision != Precision::kFp32;
  const auto param_dtype = mixed ? dtype_of(t.precision) : torch::kFloat;
  const auto unsharded_dtype = [&](const torch::Tensor& p) {
    return mixed && p.is_floating_point() ? param_dtype : p.scalar_type();
  };
  FsdpCommunication out;
  for (std::size_t u = 0; u < units.size(); ++u) {
    const auto& unit = units[u];
    if (unit.empty()) continue;
    const bool is_root = u + 1 == units.size();
    // Each parameter's shard: torch.chunk's first chunk of dim 0 (ceil(rows / N) rows), on every rank.
    std::int64_t shard = 0, trainable_shard = 0;
    auto grad_dtype = torch::kFloat;  // the first trainable parameter's unsharded dtype
    bool first_trainable_here = true;
    for (const auto i : unit) {
      const auto& p = named[i].value();
      const auto numel = padded_shard_numel(p, world);
      shard += numel;
      if (p.requires_grad()) {
        trainable_shard += numel;
        if (first_trainable_here) grad_dtype = unsharded_dtype(p);
        first_trainable_here = false;
      }
    }
    // One all-gather buffer per unit, in its first parameter's unsharded dtype.
    const auto gather_bytes = c10::elementSize(unsharded_dtype(named[unit.front()].value()));
    out.all_gather_forward += (world - 1) * shard * static_cast<std::int64_t>(gather_bytes);
    const bool needs_gradient = counted.needs_gradient(u);
    const auto group = d.reshard_group(is_root);
    if (needs_gradient && group > 0) {
      // From the group it resharded to: each of its `group` ranks holds 1/group of the padded unsharded unit.
      out.all_gather_backward += (group - 1) * (world * shard / group) * static_cast<std::int64_t>(gather_bytes);
    }
    if (trainable_shard > 0) {
      const auto reduce = d.reduce_dtype ? dtype_of(*d.reduce_dtype) : grad_dtype;
      out.reduce_scatter += (world - 1) * trainable_shard * static_cast<std::int64_t>(c10::elementSize(reduce));
    }
  }
  const auto steps = t.accumulation_steps;
  out.all_gather_forward *= steps;
  out.all_gather_backward *= steps;
  out.reduce_scatter *= steps;
  return out;
}

std::optional<FsdpHostTransfer> fsdp_host_transfer(const Workload& workload) {
  const auto& t = workload.training;
  const auto& d = t.distributed;
  if (d.strategy != DistributedStrategy::kFsdp) return std::nullopt;
  if (workload.model.arch == Arch::kPython || workload.model.arch == Arch::kTorchScript) return std::nullopt;
  const auto counted = fsdp_units(workload);
  const auto world = d.world_size;
  FsdpHostTransfer out;
  for (std::size_t u = 0; u < counted.units.size(); ++u) {
    const auto& unit = counted.units[u];
    if (unit.empty()) continue;
    // Rank 0 owns each parameter's first chunk whole: its gradient's rows are its padded shard's.
    std::int64_t shard = 0, trainable = 0;
    for (const auto i : unit) {
      const auto& p = counted.named[i].value();
      const auto bytes = padded_shard_numel(p, world) * static_cast<std::int64_t>(p.element_size());
      shard += bytes;
      if (p.requires_grad()) trainable += bytes;
    }
    out.to_device_forward += shard;
    // Gathered again for backward from the shards where the unit resharded to them (a partial reshard gathers from
    // the post-forward parts on the device instead).
    if (counted.needs_gradient(u) && d.reshard_group(u + 1 == counted.units.size()) == world) {
      out.to_device_backward += shard;
    }
    out.to_host_gradients += trainable;
  }
  out.to_device_forward *= t.accumulation_steps;
  out.to_device_backward *= t.accumulation_steps;
  out.to_host_gradients *= t.accumulation_steps;
  return out;
}

}  // namespace memgate
