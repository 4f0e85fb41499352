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

std::optional<FsdpCommunication> fsdp_communication(const Workload& workload) {
  const auto& t = workload.training;
  const auto& d = t.distributed;
  if (d.strategy != DistributedStrategy::kFsdp) return std::nullopt;
  if (workload.model.arch == Arch::kPython || workload.model.arch == Arch::kTorchScript) return std::nullopt;
  const auto model = build_model(workload.model, c10::Device(c10::DeviceType::Meta));
  (void)select_trainable(*model, t.trainable, workload.source);
  const auto named = model->module().named_parameters(/*recurse=*/true);
  // The units as fully_shard makes them: each block's parameters (units: blocks), then the root with the rest; each
  // parameter by its index in the model's order.
  std::vector<std::vector<std::size_t>> units;
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
  // The first trainable parameter in the model's order: a block's output needs a gradient from there on.
  std::size_t first_trainable = named.size();
  for (std::size_t i = 0; i < named.size(); ++i) {
    if (named[i].value().requires_grad()) {
      first_trainable = i;
      break;
    }
  }
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
      const auto rows = p.size(0);
      const auto numel = (rows + world - 1) / world * (p.numel() / rows);
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
    const bool needs_gradient =
        first_trainable < named.size() && (is_root || first_trainable <= *std::max_element(unit.begin(), unit.end()));
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

}  // namespace memgate
