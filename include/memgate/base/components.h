// The measured components of a probe as one table: name, member, and whether its bytes are exact or move by
// allocator segments. The table drives reading and writing them, the test list, tolerances and output.
// Needs no LibTorch.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <string_view>
#include <vector>

namespace memgate {

/// Bytes of each component of one probe (DESIGN.md, "The measurement protocol").
struct Components {
  std::int64_t params = 0;              ///< parameters and buffers on the device
  std::int64_t gradients = 0;           ///< .grad of trainable parameters after backward
  std::int64_t optimizer_state = 0;     ///< kept by the optimizer between steps
  std::int64_t activations = 0;         ///< kept for backward at the end of a train-mode forward
  std::int64_t forward_peak = 0;        ///< peak of the train-mode forward above what was allocated before it
  std::int64_t eval_peak = 0;           ///< peak of an eval-mode no-grad forward, absolute
  std::int64_t step_peak = 0;           ///< peak allocated during one steady-state step, absolute
  std::int64_t step_peak_reserved = 0;  ///< peak reserved during that step, absolute
  std::int64_t ema = 0;                 ///< the EMA copy of parameters and buffers (`training.ema`)
  bool keeps_ema = false;               ///< whether the probe's fixture keeps an EMA copy, and so has `ema`
  /// Peak bytes of the host copies that activation offload (`training.activation_offload`, PyTorch's
  /// torch.autograd.graph.save_on_cpu) made of what the forward saved for backward, during the measured step.
  std::int64_t host_activations = 0;
  bool offloads_activations = false;    ///< whether the probe's fixture offloads, and so has `host_activations`
  /// FSDP2's CPUOffloadPolicy (`training.distributed.offload_policy: cpu | cpu_pinned`), estimated for CUDA: the peak
  /// over the measured step of the host bytes of the padded sharded parameters, their gradients and the optimizer's
  /// state and temporaries (torch.optim steps them on the host); pinned ones as CUDA's caching host allocator rounds
  /// them. AdamW's step counters are not in it (on the host with or without offload, as in no component for CUDA).
  std::int64_t host_state = 0;
  bool offloads_state = false;          ///< whether the probe has `host_state` (an estimate for CUDA that offloads)

  /// The component named `name` (a name of kComponentTable); throws memgate::Error for another name.
  [[nodiscard]] std::int64_t get(std::string_view name) const;
  /// Sets the component named `name` (an optional one, `ema` or `host_activations`, is then present); throws
  /// memgate::Error for another name.
  void set(std::string_view name, std::int64_t bytes);
  /// The same components with the same bytes: an optional one (`ema`, `host_activations`) counts where either has it.
  friend bool operator==(const Components& a, const Components& b);
};

/// What a component's bytes follow, and so how tightly the gate can hold them.
enum class ComponentKind {
  kAllocated,  ///< bytes in live tensors: exact on the counting CPU allocator and CUDA's caching allocator
  kReserved,   ///< bytes the allocator holds from the device: moves by whole allocator segments on CUDA
};

/// One row of the component table.
struct ComponentInfo {
  std::string_view name;           ///< as in baselines, JSON, test names and labels
  std::int64_t Components::*member;  ///< where a probe keeps it
  ComponentKind kind;
  std::string_view meaning;        ///< one line for reports
  /// Null for a component every probe has; else the flag that says whether a probe has it (`ema`: only where the
  /// fixture keeps an EMA copy; `host_activations`: only where it offloads activations). A component a probe does
  /// not have is not in its JSON, its baseline or its tests.
  bool Components::*present = nullptr;
};

/// Every component, in report order.
inline constexpr std::array<ComponentInfo, 11> kComponentTable{{
    {"params", &Components::params, ComponentKind::kAllocated, "parameters and buffers on the device"},
    {"gradients", &Components::gradients, ComponentKind::kAllocated, ".grad of the trainable parameters"},
    {"optimizer_state", &Components::optimizer_state, ComponentKind::kAllocated,
     "what the optimizer keeps between steps"},
    {"activations", &Components::activations, ComponentKind::kAllocated,
     "what a train-mode forward keeps for backward"},
    {"forward_peak", &Components::forward_peak, ComponentKind::kAllocated,
     "peak of the forward above what was allocated before it"},
    {"eval_peak", &Components::eval_peak, ComponentKind::kAllocated, "peak of an eval-mode, no-grad forward"},
    {"step_peak", &Components::step_peak, ComponentKind::kAllocated, "peak allocated during one training step"},
    {"step_peak_reserved", &Components::step_peak_reserved, ComponentKind::kReserved,
     "peak reserved during one training step"},
    {"ema", &Components::ema, ComponentKind::kAllocated, "the EMA copy of the parameters and buffers",
     &Components::keeps_ema},
    {"host_activations", &Components::host_activations, ComponentKind::kAllocated,
     "peak of the activations offloaded to host memory during one training step", &Components::offloads_activations},
    {"host_state", &Components::host_state, ComponentKind::kAllocated,
     "peak of the sharded parameters, gradients and optimizer state in host memory (FSDP's CPU offload) during one "
     "training step", &Components::offloads_state},
}};

/// Whether `components` has the component `info` (every one but `ema` where no EMA copy is kept, `host_activations`
/// where nothing is offloaded and `host_state` but in an estimate for CUDA of FSDP's CPU offload).
[[nodiscard]] constexpr bool has_component(const Components& components, const ComponentInfo& info) {
  return info.present == nullptr || components.*info.present;
}

/// The table's row for `name`, if there is one.
[[nodiscard]] constexpr const ComponentInfo* find_component(std::string_view name) {
  for (const auto& c : kComponentTable) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

/// One rank's components in a distributed probe.
struct RankComponents {
  int rank = 0;
  Components components;
  /// What the strategy's communication keeps between steps, inside the allocator: DDP's gradient buckets.
  std::int64_t comm_buffer_bytes = 0;
  /// How many buffers those are (DDP: buckets after the first iteration's rebuild).
  std::int64_t comm_buffers = 0;
  /// On a GPU (0 on the CPU): what the rank's NCCL communicators take outside the caching allocator
  /// (communicator_bytes()), and all the device holds outside it after the measured step (CUDA context, kernels,
  /// libraries, the communicators; MemoryBackend::outside_allocator_bytes), and the cuBLAS workspaces made before
  /// the probe's base (ProbeResult::library_workspace_bytes).
  std::int64_t communicator_bytes = 0;
  std::int64_t outside_allocator_bytes = 0;
  std::int64_t library_workspace_bytes = 0;
  friend bool operator==(const RankComponents&, const RankComponents&) = default;
};

/// Rank `rank` among `ranks`, or nullptr.
[[nodiscard]] const RankComponents* find_rank(const std::vector<RankComponents>& ranks, int rank);

/// The name of one rank's component in verdicts and test names: `rank1_gradients`.
[[nodiscard]] std::string rank_component_name(int rank, std::string_view component);
/// The rank and component of such a name, or nullopt for a plain component name.
[[nodiscard]] std::optional<std::pair<int, std::string>> parse_rank_component(std::string_view name);

/// The largest value of each component over `ranks`: what a distributed probe's `components` hold.
[[nodiscard]] Components max_over_ranks(const std::vector<RankComponents>& ranks);

}  // namespace memgate
