// memgate plan: every plan estimated for the target's GPU, the cheapest that fit first (plan/plan.h).
#include "memgate/plan/plan.h"

#include "memgate/base/error.h"
#include "memgate/base/units.h"
#include "memgate/estimate/cuda_reduce.h"
#include "memgate/estimate/estimate_context.h"
#include "memgate/launch/estimate.h"
#include "memgate/launch/ranks.h"
#include "memgate/models/zoo.h"
#include "memgate/plan/communication.h"
#include "memgate/plan/flops.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>
#include <tuple>
#include <utility>

namespace memgate {
namespace {

constexpr std::int64_t kCannotRun = std::numeric_limits<std::int64_t>::max() / 4;
constexpr const char* kExpandable = "expandable_segments:True";
// The offload levers in words (count_host_transfer adds what each holds and moves).
constexpr const char* kOffloadLever = "offload activations to pinned host memory";
constexpr const char* kFsdpOffloadLever = "parameters and optimizer state offloaded to pinned host memory";
// The most plans an exhaustive search estimates when asked for (a few seconds of a small model's estimates).
constexpr std::int64_t kMaxExhaustive = 4096;

// One point of the space: a micro-batch and its accumulation, the allocator's settings, the checkpointed blocks (a
// bit each), a lever that changes the training (-1: none), whether FSDP shards it over --world-size's ranks (and
// offloads its shards and optimizer state to pinned host memory: CPUOffloadPolicy), and where the forward's saved
// tensors are kept (training.activation_offload; unset: the fixture's own).
struct Point {
  std::int64_t micro = 0;
  std::int64_t steps = 1;
  std::string allocator;
  std::uint64_t mask = 0;
  int variant = -1;
  bool fsdp = false;
  std::optional<ActivationOffload> offload;
  /// FSDP (the lever's or the fixture's own) with offload_policy: cpu_pinned.
  bool fsdp_offload = false;
  /// The checkpointed blocks in PyTorch's selective checkpointing, saving their attention's output (a Python
  /// fixture's; with no block checkpointed, the same plan as without).
  bool selective = false;
  /// Whether the plan's blocks run selectively: some are checkpointed (none is the plan without).
  [[nodiscard]] bool saves_selectively() const { return selective && mask != 0; }
  [[nodiscard]] std::string key() const {
    return fmt::format("{}x{}|{}|{}|{}|{}|{}|{}|{}", micro, steps, allocator, mask, variant, fsdp,
                       offload ? static_cast<int>(*offload) : -1, saves_selectively(), fsdp_offload);
  }
};

// A lever that changes the training, as --allow-changes lists them.
struct Variant {
  std::string lever;
  nlohmann::json change;
  std::function<void(Workload&)> apply;
};

std::vector<Variant> training_changes(const Workload& w) {
  std::vector<Variant> out;
  const auto& t = w.training;
  if (t.precision == Precision::kFp32) {
    out.push_back({"bf16 autocast (changes the numerics)", {{"training", {{"precision", "bf16"}}}},
                   [](Workload& v) { v.training.precision = Precision::kBf16; }});
  }
  if (t.trainable.kind != TrainableSpec::Kind::kHead && w.model.arch != Arch::kPython &&
      w.model.arch != Arch::kTorchScript) {
    out.push_back({"frozen backbone, the head trains (changes what trains)", {{"training", {{"trainable", "head"}}}},
                   [](Workload& v) {
                     v.training.trainable = TrainableSpec{};
                     v.training.trainable.kind = TrainableSpec::Kind::kHead;
                   }});
  }
  if (t.optimizer == Optimizer::kAdamW && !t.own_optimizer) {
    out.push_back({"SGD with momentum 0.9 instead of AdamW (changes the optimizer)",
                   {{"training", {{"optimizer", "sgd"}, {"momentum", 0.9}, {"weight_decay", 0.0}}}},
                   [](Workload& v) {
                     v.training.optimizer = Optimizer::kSgd;
                     v.training.momentum = 0.9;
                     v.training.weight_decay = 0.0;
                   }});
  }
  return out;
}

class Planner {
 public:
  Planner(const Fixture& fixture, const AdviceTarget& target, const PlanOptions& options)
      : fixture_(fixture), target_(target), options_(options) {
    variants_ = options.allow_changes ? training_changes(fixture) : std::vector<Variant>{};
    own_world_ = fixture.training.distributed.enabled() ? fixture.training.distributed.world_size : 1;
    // Activation offload as a lever: pinned host memory, for CUDA, where the fixture keeps its activations on the
    // device and may offload (not a Python fixture, not over ranks: the fixture's key refuses both). On the CPU,
    // save_on_cpu's `cpu` keeps the saved tensor itself (nothing moves, no byte saved) and `cpu_pinned` copies it
    // into the same memory (more bytes): no lever there.
    if (options.target == EstimateTarget::kCuda && fixture.training.activation_offload == ActivationOffload::kNone &&
        fixture.model.arch != Arch::kPython && !fixture.training.distributed.enabled()) {
      offload_lever_ = ActivationOffload::kCpuPinned;
    }
    // --world-size: a distributed fixture over those ranks; from 2 ranks, sharding as a lever (but for FSDP already).
    if (!options.world_size) return;
    const auto world = *options.world_size;
    auto& d = fixture_.training.distributed;
    if (d.enabled()) d.world_size = world;
    if (world < 2) return;
    // FSDP2's CPUOffloadPolicy(pin_memory=True) as a lever, for CUDA (on the CPU the device is the host: nothing
    // moves): with the sharding lever, or on a fixture under FSDP that keeps its shards on the device.
    const bool cuda = options.target == EstimateTarget::kCuda;
    if (d.strategy == DistributedStrategy::kFsdp) {
      fsdp_offload_lever_ = cuda && d.offload_policy == FsdpOffload::kNone && fixture.model.arch != Arch::kPython &&
                            fixture.model.arch != Arch::kTorchScript;
      return;
    }
    if (const auto why = why_not_sharded(); !why.empty()) {
      not_sharded_ = why;
      return;
    }
    fsdp_world_ = world;
    fsdp_offload_lever_ = cuda;
    // FSDP's units: blocks where the model has units (its blocks' forwards run one by one), else the whole model one.
    const auto model = build_model(fixture.model, c10::Device(c10::DeviceType::Meta));
    fsdp_units_ = model->unit_prefixes().empty() ? "root" : "blocks";
  }

  // Why sharding is not searched for this fixture ("" where it is): what memgate's FSDP refuses, and a Python
  // fixture, whose parameters (and so its communication) are counted in its own process.
  [[nodiscard]] std::string why_not_sharded() const {
    const auto& t = fixture_.training;
    if (fixture_.model.arch == Arch::kTorchScript) return "a TorchScript model's parameters cannot be sharded";
    if (fixture_.model.arch == Arch::kPython) return "not searched for a Python fixture yet";
    if (t.ema_decay > 0.0) return "no EMA copy under FSDP (training.ema)";
    if (t.max_grad_norm > 0.0) return "no clipping under FSDP (training.max_grad_norm)";
    if (t.activation_offload != ActivationOffload::kNone) {
      return "no activation offload over ranks (training.activation_offload)";
    }
    return "";
  }

  PlanResult run() {
    const auto start = std::chrono::steady_clock::now();
    PlanResult out;
    out.model = fixture_.name;
    out.target = target_;
    out.estimated_for = options_.target == EstimateTarget::kCpu ? "cpu" : "cuda";
    // The micro-batches and their accumulation steps.
    std::vector<std::pair<std::int64_t, std::int64_t>> micro;
    if (options_.effective_batch) {
      const auto n = *options_.effective_batch;
      out.batch = n;
      for (std::int64_t m = n; m >= 1; --m) {
        if (n % m == 0) micro.emplace_back(m, n / m);
      }
    } else {
      const auto b = options_.batch ? *options_.batch : fixture_.batch_sizes.back();
      out.batch = b * fixture_.training.accumulation_steps;
      micro.emplace_back(b, fixture_.training.accumulation_steps);
    }
    std::vector<std::string> allocators{fixture_.training.allocator};
    // The CPU's allocator has no segments: the setting changes nothing there.
    if (options_.target == EstimateTarget::kCuda &&
        fixture_.training.allocator.find("expandable_segments") == std::string::npos) {
      allocators.push_back(fixture_.training.allocator.empty() ? kExpandable
                                                               : fixture_.training.allocator + "," + kExpandable);
    }
    // The blocks, and the FLOPs each micro-batch's step and blocks cost (a Python fixture's counted in its Python
    // process, where its blocks run); a fixture whose blocks were not counted has no checkpointing lever (a
    // TorchScript model's, a distributed one's).
    std::vector<std::int64_t> sizes;
    for (const auto& [m, steps] : micro) sizes.push_back(m);
    // A distributed fixture's blocks are counted on one device (its ranks' FLOPs are those of one device at their
    // batch) where --world-size plans it, so that checkpointing combines with its ranks and with sharding.
    auto counted_on = static_cast<const Workload&>(fixture_);
    if (options_.world_size) counted_on.training.distributed = DistributedSpec{};
    auto counted = count_checkpoint_flops(counted_on, sizes, options_.target);
    blocks_ = std::move(counted.blocks);
    if (blocks_.size() > 62) blocks_.clear();  // a mask of 64 bits; no zoo model has so many
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      flops_[sizes[i]] = std::move(counted.flops[i]);
      ++estimates_;
      if (flops_[sizes[i]].per_block.size() != blocks_.size()) blocks_.clear();
    }
    // Selective checkpointing as a lever, for a Python fixture (where PyTorch's torch.utils.checkpoint runs) on one
    // device whose every block runs an attention: its checkpointed blocks save the attention's output (the kernel the
    // target dispatches to) and recompute the rest.
    const auto& t0 = fixture_.training;
    bool attention = fixture_.model.arch == Arch::kPython && !blocks_.empty() && !t0.distributed.enabled() &&
                     t0.activation_offload == ActivationOffload::kNone && !t0.compile &&
                     t0.precision == Precision::kFp32;  // a selective policy under autocast is not estimated yet
    for (const auto& [m, f] : flops_) {
      attention = attention && f.per_block_attention.size() == blocks_.size() &&
                  std::all_of(f.per_block_attention.begin(), f.per_block_attention.end(),
                              [](std::int64_t a) { return a > 0; });
    }
    if (attention) {
      selective_save_ = options_.target == EstimateTarget::kCpu
                            ? std::vector<std::string>{"aten._scaled_dot_product_flash_attention_for_cpu"}
                            : std::vector<std::string>{"aten._scaled_dot_product_flash_attention",
                                                       "aten._scaled_dot_product_efficient_attention",
                                                       "aten._scaled_dot_product_cudnn_attention"};
    }
    const auto n = blocks_.size();
    const std::int64_t subsets = std::int64_t{1} << n;
    std::vector<bool> shardings{false};
    if (fsdp_world_ > 0) shardings.push_back(true);
    out.sharding = fsdp_world_ > 0 ? fmt::format("FSDP over {} ranks", fsdp_world_) : not_sharded_;
    // Activation offload is not combined with sharding (the fixture's key refuses it over ranks); FSDP's offload of
    // its shards is sharding's.
    const std::size_t layouts = shardings.size() + (offload_lever_ ? 1 : 0) + (selective_save_.empty() ? 0 : 1) +
                                (fsdp_offload_lever_ ? 1 : 0);
    out.space = static_cast<std::int64_t>(micro.size() * allocators.size() * layouts) * subsets +
                static_cast<std::int64_t>(variants_.size());
    const bool exhaustive = options_.search == PlanOptions::Search::kExhaustive ||
                            (options_.search == PlanOptions::Search::kAuto && out.space <= options_.exhaustive_limit);
    out.search = exhaustive ? "exhaustive" : "greedy";
    if (exhaustive && out.space > kMaxExhaustive) {
      throw Error(fmt::format("{}: --search exhaustive: {} plans ({} blocks), expected at most {} to estimate each; "
                              "greedy (or auto) searches it", fixture_.source, out.space, n, kMaxExhaustive));
    }
    // The fixture as it is, the whole batch in the first micro-batch setting.
    Point as_is{micro.front().first, micro.front().second, fixture_.training.allocator, current_mask(), -1};
    out.as_is = estimate(as_is);
    std::vector<Plan> found;
    std::vector<std::tuple<bool, std::optional<ActivationOffload>, bool, bool>> layout_points;
    for (const bool fsdp : shardings) layout_points.emplace_back(fsdp, std::nullopt, false, false);
    if (offload_lever_) layout_points.emplace_back(false, offload_lever_, false, false);
    if (!selective_save_.empty()) layout_points.emplace_back(false, std::nullopt, true, false);
    // FSDP with its shards offloaded: the sharding lever's, or the FSDP fixture's own.
    if (fsdp_offload_lever_) layout_points.emplace_back(fsdp_world_ > 0, std::nullopt, false, true);
    for (const auto& [m, steps] : micro) {
      for (const auto& [fsdp, offload, selective, fsdp_offload] : layout_points) {
        std::optional<Plan> default_allocator;
        for (const auto& allocator : allocators) {
          Point base{m, steps, allocator, 0, -1, fsdp, offload, fsdp_offload, selective};
          auto best = exhaustive ? cheapest_subset(base) : greedy(base);
          if (!best) continue;
          // Expandable segments only where they save reserved bytes or recomputation over the default's plan.
          if (default_allocator && allocator != allocators.front() &&
              !(best->recompute_flops < default_allocator->recompute_flops ||
                best->required_bytes < default_allocator->required_bytes)) {
            continue;
          }
          if (allocator == allocators.front()) default_allocator = best;
          found.push_back(std::move(*best));
        }
      }
    }
    for (std::size_t v = 0; v < variants_.size(); ++v) {
      auto p = estimate({micro.front().first, micro.front().second, fixture_.training.allocator, current_mask(),
                         static_cast<int>(v)});
      if (p.fits) found.push_back(std::move(p));
    }
    count_host_transfer(*out.as_is);
    for (auto& p : found) count_host_transfer(p);
    out.plans = pareto_sorted(std::move(found));
    out.estimates = estimates_;
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (out.plans.empty()) throw Error(nothing_fits(out));
    return out;
  }

 private:
  [[nodiscard]] std::uint64_t current_mask() const {
    const auto& t = fixture_.training;
    if (!t.gradient_checkpointing) return 0;
    if (t.checkpoint_blocks.empty()) return blocks_.empty() ? 0 : (std::uint64_t{1} << blocks_.size()) - 1;
    std::uint64_t mask = 0;
    for (std::size_t i = 0; i < blocks_.size(); ++i) {
      if (std::find(t.checkpoint_blocks.begin(), t.checkpoint_blocks.end(), blocks_[i]) != t.checkpoint_blocks.end()) {
        mask |= std::uint64_t{1} << i;
      }
    }
    return mask;
  }

  // The checkpointed blocks' forward FLOPs, recomputed in backward; under selective checkpointing less their
  // attention's, whose output is saved.
  [[nodiscard]] std::int64_t recompute(std::int64_t micro, std::uint64_t mask, bool selective) const {
    std::int64_t sum = 0;
    const auto& f = flops_.at(micro);
    for (std::size_t i = 0; i < blocks_.size() && i < f.per_block.size(); ++i) {
      if (mask & (std::uint64_t{1} << i)) {
        sum += f.per_block[i] - (selective && i < f.per_block_attention.size() ? f.per_block_attention[i] : 0);
      }
    }
    return sum;
  }

  // The plan at `p`, estimated once (a cache: the searches revisit points).
  Plan estimate(const Point& p) {
    const auto key = p.key();
    if (const auto it = cache_.find(key); it != cache_.end()) return it->second;
    Plan plan;
    plan.micro_batch = p.micro;
    plan.accumulation_steps = p.steps;
    plan.allocator = p.allocator;
    plan.blocks = static_cast<std::int64_t>(blocks_.size());
    auto w = static_cast<const Workload&>(fixture_);
    auto& t = w.training;
    if (p.fsdp) {
      t.distributed = DistributedSpec{};
      t.distributed.strategy = DistributedStrategy::kFsdp;
      t.distributed.world_size = fsdp_world_;
      t.distributed.units = fsdp_units_;
    }
    if (p.fsdp_offload) t.distributed.offload_policy = FsdpOffload::kCpuPinned;
    plan.world_size = t.distributed.enabled() ? t.distributed.world_size : 1;
    plan.strategy = std::string(name_of(kDistributedStrategyNames, t.distributed.strategy));
    plan.global_batch = p.micro * p.steps * plan.world_size;
    t.accumulation_steps = p.steps;
    t.allocator = p.allocator;
    if (p.offload) t.activation_offload = *p.offload;
    const auto all = blocks_.empty() ? 0 : (std::uint64_t{1} << blocks_.size()) - 1;
    if (!blocks_.empty()) {
      t.gradient_checkpointing = p.mask != 0;
      t.checkpoint_blocks.clear();
      if (p.mask != 0 && p.mask != all) {
        for (std::size_t i = 0; i < blocks_.size(); ++i) {
          if (p.mask & (std::uint64_t{1} << i)) t.checkpoint_blocks.push_back(blocks_[i]);
        }
      }
      plan.checkpointed = p.mask == all ? blocks_ : t.checkpoint_blocks;
    }
    const bool selective = p.saves_selectively();  // only where the lever exists, which needs blocks
    if (selective) {
      std::get<PythonOptions>(w.model.options).checkpoint_save = selective_save_;
      plan.checkpoint_save = selective_save_;
    }
    if (p.variant >= 0) {
      variants_[static_cast<std::size_t>(p.variant)].apply(w);
      plan.changes_training = true;
    }
    // The change, as the fixture's keys, against the fixture as it is.
    auto& change = plan.change;
    if (selective) {
      // A map merged into the fixture's: its `blocks` replaced, or removed (null) where every block is checkpointed.
      auto& c = change["training"]["gradient_checkpointing"];
      c = {{"save", selective_save_}};
      if (p.mask != all) c["blocks"] = t.checkpoint_blocks;
      else if (!fixture_.training.checkpoint_blocks.empty()) c["blocks"] = nullptr;
    } else if (!blocks_.empty() && p.mask != current_mask()) {
      change["training"]["gradient_checkpointing"] =
          p.mask == 0 ? nlohmann::json(false)
          : p.mask == all ? nlohmann::json(true)
                          : nlohmann::json{{"blocks", t.checkpoint_blocks}};
    }
    if (p.steps != fixture_.training.accumulation_steps) change["training"]["accumulation_steps"] = p.steps;
    if (p.allocator != fixture_.training.allocator) change["training"]["allocator"] = p.allocator;
    if (p.variant >= 0) change.merge_patch(variants_[static_cast<std::size_t>(p.variant)].change);
    if (fixture_.batch_sizes != std::vector<std::int64_t>{p.micro}) change["batch_sizes"] = {p.micro};
    if (p.fsdp) {
      // A DDP fixture's own keys removed (null: as a JSON merge patch, and as a fixture reads a null key: unset).
      auto& d = change["training"]["distributed"];
      d = {{"strategy", "fsdp"}, {"world_size", fsdp_world_}};
      if (fsdp_units_ != "blocks") d["units"] = fsdp_units_;
      if (p.fsdp_offload) d["offload_policy"] = "cpu_pinned";
      if (fixture_.training.distributed.strategy == DistributedStrategy::kDdp) {
        d["bucket_cap_mb"] = nullptr;
        d["gradient_as_bucket_view"] = nullptr;
      }
    } else {
      if (t.distributed.enabled() && t.distributed.world_size != own_world_) {
        change["training"]["distributed"]["world_size"] = t.distributed.world_size;
      }
      if (p.fsdp_offload) change["training"]["distributed"]["offload_policy"] = "cpu_pinned";
    }
    if (t.activation_offload != fixture_.training.activation_offload) {
      change["training"]["activation_offload"] = std::string(name_of(kActivationOffloadNames, t.activation_offload));
    }
    plan.communication_bytes = communication(w, p);
    // In words.
    if (p.fsdp) {
      plan.levers.push_back(fmt::format("FSDP over {} ranks ({} sent per rank per step)", fsdp_world_,
                                        plan.communication_bytes ? format_bytes(*plan.communication_bytes)
                                                                 : std::string("not counted")));
    }
    if (p.fsdp_offload) plan.levers.push_back(kFsdpOffloadLever);
    if (!plan.checkpointed.empty()) {
      plan.levers.push_back(fmt::format("checkpoint {} of {} blocks{}", plan.checkpointed.size(), blocks_.size(),
                                        selective ? " selectively, their attention's output saved" : ""));
    }
    if (p.steps > 1) plan.levers.push_back(fmt::format("accumulate {} micro-batches of {}", p.steps, p.micro));
    if (p.allocator != fixture_.training.allocator) plan.levers.push_back("expandable segments");
    if (t.activation_offload != fixture_.training.activation_offload) plan.levers.push_back(kOffloadLever);
    if (p.variant >= 0) plan.levers.push_back(variants_[static_cast<std::size_t>(p.variant)].lever);
    // The same estimate as `memgate estimate --gpu`: for CUDA, staged for this GPU's SMs; or `--for cpu`'s. Taken
    // from options_.memo where a plan() that shares it estimated this workload already.
    const auto memo_key =
        options_.memo ? fmt::format("{}|{}|{}|{}|{}|{}|{}|{}", fixture_.path, fixture_.hash,
                                    options_.world_size.value_or(0), static_cast<int>(options_.target),
                                    target_.multiprocessors, target_.max_threads_per_multiprocessor, key, change.dump())
                      : std::string();
    const PlanEstimateMemo::Bytes* memoized = nullptr;
    if (options_.memo) {
      if (const auto it = options_.memo->estimated.find(memo_key); it != options_.memo->estimated.end()) {
        memoized = &it->second;
      }
    }
    if (memoized != nullptr) {
      const auto& b = *memoized;
      plan.step_peak = b.step_peak;
      plan.step_peak_reserved = b.step_peak_reserved;
      plan.host_bytes = b.host_bytes;
      plan.required_bytes = b.cannot_run ? kCannotRun : plan.step_peak_reserved + target_.library_workspace_bytes;
    } else if (options_.target == EstimateTarget::kCpu) {
      const auto r = estimate_probe(w, p.micro, EstimateTarget::kCpu);
      plan.step_peak = r.components.step_peak;
      plan.step_peak_reserved = r.components.step_peak_reserved;
      plan.host_bytes = r.components.host_activations + r.components.host_state;
      plan.required_bytes = plan.step_peak_reserved + target_.library_workspace_bytes;
    } else {
      const EstimateContextGuard for_gpu(
          estimate_context_for_gpu({target_.multiprocessors, target_.max_threads_per_multiprocessor}));
      try {
        const auto r = estimate_probe(w, p.micro, EstimateTarget::kCuda);
        plan.step_peak = r.components.step_peak;
        plan.step_peak_reserved = r.components.step_peak_reserved;
        plan.host_bytes = r.components.host_activations + r.components.host_state;
        plan.required_bytes = plan.step_peak_reserved + target_.library_workspace_bytes;
      } catch (const std::exception& e) {
        if (!cannot_run_on_cuda(e)) throw;
        plan.required_bytes = kCannotRun;
      }
    }
    if (options_.memo && memoized == nullptr) {
      options_.memo->estimated.emplace(memo_key, PlanEstimateMemo::Bytes{plan.step_peak, plan.step_peak_reserved,
                                                                         plan.host_bytes,
                                                                         plan.required_bytes == kCannotRun});
    }
    ++estimates_;
    plan.headroom_bytes = target_.usable_bytes - plan.required_bytes;
    plan.fits = plan.required_bytes <= target_.usable_bytes;
    const auto& f = flops_.at(p.micro);
    plan.step_flops = f.step;
    plan.recompute_flops = recompute(p.micro, blocks_.empty() ? 0 : p.mask, selective);
    plan.recompute_flops_fraction =
        f.step > 0 ? static_cast<double>(plan.recompute_flops) / static_cast<double>(f.step) : 0.0;
    plan.workload = std::move(w);
    if (least_ == nullptr || plan.required_bytes < least_->required_bytes) least_ = std::make_unique<Plan>(plan);
    cache_.emplace(key, plan);
    return plan;
  }

  // What the plan's collectives send per rank per optimizer step: FSDP's, counted from its parameters (once per
  // accumulation, sharding and lever: the blocks checkpointed and the micro-batch change none of it); 0 otherwise.
  std::optional<std::int64_t> communication(const Workload& w, const Point& p) {
    if (w.training.distributed.strategy != DistributedStrategy::kFsdp) return 0;
    const auto key = fmt::format("{}|{}|{}", p.steps, p.fsdp, p.variant);
    if (const auto it = communication_.find(key); it != communication_.end()) return it->second;
    const auto counted = fsdp_communication(w);
    const auto bytes = counted ? std::optional<std::int64_t>(counted->total()) : std::nullopt;
    communication_.emplace(key, bytes);
    return bytes;
  }

  // The bytes an offloading plan moves over the host link per optimizer step: each micro-batch's copies go to the host
  // in forward and back in backward, 2 x their bytes x the accumulation steps. Their bytes are the tensors' own, not
  // the pinned blocks' (rounded up to a power of two): the host bytes of the same step offloaded to pageable memory
  // (`cpu`: a copy of each saved tensor with its strides, all alive until backward, so their peak is their sum). It
  // also says, in words, what the plan holds and moves. 0 for a plan that does not offload.
  void count_host_transfer(Plan& plan) {
    const auto policy = plan.workload.training.distributed.offload_policy;
    if (policy != FsdpOffload::kNone && plan.workload.training.distributed.strategy == DistributedStrategy::kFsdp &&
        plan.required_bytes < kCannotRun) {
      // FSDP's CPUOffloadPolicy: each shard to the device before each all-gather, each gradient back, counted from
      // the shards (plan/communication.h); its host bytes the estimate's host_state.
      const auto key = fmt::format("{}|{}", plan.accumulation_steps, plan.change.dump());
      auto it = host_transfer_.find(key);
      if (it == host_transfer_.end()) {
        const auto moved = fsdp_host_transfer(plan.workload);
        it = host_transfer_.emplace(key, moved ? moved->total() : 0).first;
      }
      plan.host_transfer_bytes = it->second;
      if (policy != fixture_.training.distributed.offload_policy) {
        const auto lever = std::find(plan.levers.begin(), plan.levers.end(), std::string(kFsdpOffloadLever));
        if (lever != plan.levers.end()) {
          *lever = fmt::format("{} ({} held, {} moved per step)", kFsdpOffloadLever, format_bytes(plan.host_bytes),
                               format_bytes(plan.host_transfer_bytes));
        }
      }
      return;
    }
    const auto mode = plan.workload.training.activation_offload;
    if (mode == ActivationOffload::kNone || plan.required_bytes >= kCannotRun) return;
    std::int64_t copies = plan.host_bytes;
    if (mode == ActivationOffload::kCpuPinned && options_.target == EstimateTarget::kCuda) {
      auto w = plan.workload;
      w.training.activation_offload = ActivationOffload::kCpu;
      const EstimateContextGuard for_gpu(
          estimate_context_for_gpu({target_.multiprocessors, target_.max_threads_per_multiprocessor}));
      copies = estimate_probe(w, plan.micro_batch, EstimateTarget::kCuda).components.host_activations;
      ++estimates_;
    }
    plan.host_transfer_bytes = 2 * copies * plan.accumulation_steps;
    if (plan.workload.training.activation_offload != fixture_.training.activation_offload) {
      const auto it = std::find(plan.levers.begin(), plan.levers.end(), std::string(kOffloadLever));
      if (it != plan.levers.end()) {
        *it = fmt::format("{} ({} held, {} moved per step)", kOffloadLever, format_bytes(plan.host_bytes),
                          format_bytes(plan.host_transfer_bytes));
      }
    }
  }

  // Of two plans that fit, the cheaper: fewer recomputed FLOPs, then more headroom.
  static bool cheaper(const Plan& a, const Plan& b) {
    return std::tie(a.recompute_flops, b.headroom_bytes) < std::tie(b.recompute_flops, a.headroom_bytes);
  }

  // Every subset of the blocks at `base`: the cheapest that fits.
  std::optional<Plan> cheapest_subset(Point base) {
    std::optional<Plan> best;
    // (Under selective checkpointing from one block: none is the plan without.)
    for (std::uint64_t mask = base.selective ? 1 : 0; mask < (std::uint64_t{1} << blocks_.size()); ++mask) {
      base.mask = mask;
      auto p = estimate(base);
      if (p.fits && (!best || cheaper(p, *best))) best = std::move(p);
    }
    return best;
  }

  // From no block checkpointed, adds blocks one at a time in the order of the reserved bytes each saved per recomputed
  // FLOP when it alone was added (estimated once, at the first micro-batch and allocator that needs checkpointing),
  // each step estimated, until the step fits. Then drops each chosen block, most FLOPs first, that the plan fits
  // without (a block added early may be spared by those added after it).
  std::optional<Plan> greedy(Point base) {
    auto current = estimate(base);
    if (current.fits || blocks_.empty()) return current.fits ? std::optional<Plan>(current) : std::nullopt;
    const auto& per_block = flops_.at(base.micro).per_block;
    auto& order =
        order_[{base.fsdp, base.offload ? static_cast<int>(*base.offload) : -1, base.selective, base.fsdp_offload}];
    if (order.empty()) {
      std::vector<std::pair<double, std::size_t>> ranked;
      for (std::size_t i = 0; i < blocks_.size(); ++i) {
        auto one = base;
        one.mask = std::uint64_t{1} << i;
        const auto p = estimate(one);
        const double saved = static_cast<double>(current.required_bytes - p.required_bytes);
        ranked.emplace_back(-saved / static_cast<double>(std::max<std::int64_t>(per_block[i], 1)), i);
      }
      std::stable_sort(ranked.begin(), ranked.end());
      for (const auto& r : ranked) order.push_back(r.second);
    }
    std::uint64_t mask = 0;
    std::optional<Plan> fitting;
    for (const auto i : order) {
      auto next = base;
      next.mask = mask |= std::uint64_t{1} << i;
      auto p = estimate(next);
      if (p.fits) {
        fitting = std::move(p);
        break;
      }
    }
    if (!fitting) return std::nullopt;
    // Drop what the plan fits without, most FLOPs first.
    std::vector<std::size_t> chosen;
    for (std::size_t i = 0; i < blocks_.size(); ++i) {
      if (mask & (std::uint64_t{1} << i)) chosen.push_back(i);
    }
    std::stable_sort(chosen.begin(), chosen.end(), [&](auto a, auto b) { return per_block[a] > per_block[b]; });
    for (const auto i : chosen) {
      auto fewer = base;
      fewer.mask = mask & ~(std::uint64_t{1} << i);
      auto p = estimate(fewer);
      if (p.fits) {
        mask = fewer.mask;
        fitting = std::move(p);
      }
    }
    return fitting;
  }

  // Cheapest first; a plan that another beats or equals on every cost (bytes moved to the host and back, recomputed
  // FLOPs, accumulation steps, communication, levers, changing the training), each per optimizer step, is left out:
  // recompute_flops is per micro-batch, so 2 micro-batches of 4 recompute per step what one batch of 8 does. Plans
  // that change the training in different ways (bf16, a frozen backbone, SGD) do not compare: each is listed. Bytes
  // moved to the host come first: save_on_cpu copies each saved tensor out in forward and back in backward when
  // autograd asks for it, nothing prefetched, so they move on the step's critical path, and over PCIe they take
  // longer than the forward they would recompute (docs/plan.md): an offload plan comes after every plan that keeps
  // activations on the device.
  static std::vector<Plan> pareto_sorted(std::vector<Plan> plans) {
    const auto cost = [](const Plan& p) {
      return std::make_tuple(p.changes_training, p.host_transfer_bytes, p.recompute_flops_fraction,
                             p.accumulation_steps, p.communication_bytes.value_or(0), p.levers.size(),
                             -p.headroom_bytes);
    };
    std::stable_sort(plans.begin(), plans.end(), [&](const Plan& a, const Plan& b) { return cost(a) < cost(b); });
    std::vector<Plan> out;
    for (auto& p : plans) {
      const bool dominated = std::any_of(out.begin(), out.end(), [&](const Plan& q) {
        return q.changes_training == p.changes_training && (!p.changes_training || q.change == p.change) &&
               q.recompute_flops * q.accumulation_steps <= p.recompute_flops * p.accumulation_steps &&
               q.accumulation_steps <= p.accumulation_steps && q.host_transfer_bytes <= p.host_transfer_bytes &&
               q.communication_bytes.value_or(0) <= p.communication_bytes.value_or(0) &&
               q.levers.size() <= p.levers.size();
      });
      if (!dominated) out.push_back(std::move(p));
    }
    return out;
  }

  [[nodiscard]] std::string nothing_fits(const PlanResult& r) const {
    std::string least = "nothing could be estimated";
    if (least_ != nullptr) {
      least = least_->required_bytes >= kCannotRun
                  ? std::string("every plan's step cannot run on CUDA")
                  : fmt::format("the least any plan needs is {} ({}{})", format_bytes(least_->required_bytes),
                                fmt::format("micro-batch {}", least_->micro_batch),
                                least_->levers.empty() ? "" : ", " + fmt::format("{}", fmt::join(least_->levers, ", ")));
    }
    return fmt::format("{}: no plan fits batch {} on {} ({} usable): {}, after {} estimates; a smaller batch, "
                       "--effective-batch to accumulate it{}, or a larger GPU",
                       fixture_.source, r.batch, target_.id, format_bytes(target_.usable_bytes), least, estimates_,
                       options_.allow_changes ? "" : ", --allow-changes for the levers that change the training");
  }

  Fixture fixture_;  // over --world-size's ranks where it is distributed
  const AdviceTarget& target_;
  const PlanOptions& options_;
  std::vector<std::string> blocks_;
  std::vector<Variant> variants_;
  std::map<std::int64_t, StepFlops> flops_;
  std::map<std::string, Plan> cache_;
  // The greedy search's order of the blocks, per sharding, offload, selective checkpointing and FSDP's offload.
  std::map<std::tuple<bool, int, bool, bool>, std::vector<std::size_t>> order_;
  // The ops a selective plan's checkpointed blocks save (the target's attention kernels); empty: no such lever.
  std::vector<std::string> selective_save_;
  std::map<std::string, std::optional<std::int64_t>> communication_;
  std::map<std::string, std::int64_t> host_transfer_;  // FSDP's offload: bytes over the host link, per change
  std::int64_t own_world_ = 1;      // the fixture's own ranks
  std::int64_t fsdp_world_ = 0;     // the ranks FSDP's lever shards over; 0: no sharding lever
  std::string fsdp_units_ = "blocks";
  std::string not_sharded_;         // why --world-size's sharding is not searched
  std::optional<ActivationOffload> offload_lever_;  // the offload the search tries; unset: none
  bool fsdp_offload_lever_ = false;  // FSDP with offload_policy: cpu_pinned tried (for CUDA, with --world-size)
  std::unique_ptr<Plan> least_;
  std::int64_t estimates_ = 0;
};

YAML::Node to_yaml(const nlohmann::json& j) {
  if (j.is_object()) {
    YAML::Node n(YAML::NodeType::Map);
    for (const auto& [k, v] : j.items()) n[k] = to_yaml(v);
    return n;
  }
  if (j.is_array()) {
    YAML::Node n(YAML::NodeType::Sequence);
    n.SetStyle(YAML::EmitterStyle::Flow);
    for (const auto& v : j) n.push_back(to_yaml(v));
    return n;
  }
  if (j.is_boolean()) return YAML::Node(j.get<bool>());
  if (j.is_number_integer()) return YAML::Node(j.get<std::int64_t>());
  if (j.is_number()) return YAML::Node(j.get<double>());
  return YAML::Node(j.get<std::string>());
}

// As a JSON merge patch: an object merged key by key, a null removing the key.
void merge(YAML::Node node, const nlohmann::json& change) {
  for (const auto& [k, v] : change.items()) {
    if (v.is_null()) {
      (void)node.remove(k);
    } else if (v.is_object() && node[k] && node[k].IsMap()) {
      merge(node[k], v);
    } else {
      node[k] = to_yaml(v);
    }
  }
}

nlohmann::json plan_json(const Plan& p) {
  return {{"fits", p.fits},
          {"step_peak", p.step_peak},
          {"step_peak_reserved", p.step_peak_reserved},
          {"required_bytes", p.required_bytes},
          {"headroom_bytes", p.headroom_bytes},
          {"host_bytes", p.host_bytes},
          {"host_transfer_bytes", p.host_transfer_bytes},
          {"recompute_flops", p.recompute_flops},
          {"step_flops", p.step_flops},
          {"recompute_flops_fraction", p.recompute_flops_fraction},
          {"micro_batch", p.micro_batch},
          {"accumulation_steps", p.accumulation_steps},
          {"world_size", p.world_size},
          {"global_batch", p.global_batch},
          {"strategy", p.strategy},
          {"communication_bytes", p.communication_bytes ? nlohmann::json(*p.communication_bytes) : nlohmann::json()},
          {"changes_training", p.changes_training},
          {"checkpointed_blocks", p.checkpointed},
          {"checkpoint_save", p.checkpoint_save},
          {"change", p.change},
          {"levers", p.levers}};
}

}  // namespace

PlanResult plan(const Fixture& fixture, const AdviceTarget& target, const PlanOptions& options) {
  if (options.batch && *options.batch < 1) throw Error(fixture.source + ": --batch: expected an integer >= 1");
  if (options.effective_batch && *options.effective_batch < 1) {
    throw Error(fixture.source + ": --effective-batch: expected an integer >= 1");
  }
  if (options.batch && options.effective_batch) {
    throw Error(fixture.source + ": --batch and --effective-batch: expected one of them, not both");
  }
  if (target.usable_bytes <= 0) throw Error(fmt::format("target {}: no usable bytes ({})", target.id, target.usable_bytes));
  if (options.world_size) {
    const auto world = *options.world_size;
    const auto& d = fixture.training.distributed;
    if (world < 1 || world > 4096) {
      throw Error(fmt::format("{}: --world-size {}: expected ranks between 1 and 4096", fixture.source, world));
    }
    if (!d.enabled() && world < 2) {
      throw Error(fmt::format("{}: --world-size {}: the fixture trains on one device, and FSDP over one rank shards "
                              "nothing: expected 2 or more ranks to shard over", fixture.source, world));
    }
    if (d.reshard_after_forward_group > 0 && world % d.reshard_after_forward_group != 0) {
      throw Error(fmt::format("{}: --world-size {}: the fixture reshards after forward to groups of {} ranks "
                              "(training.distributed.reshard_after_forward), which {} ranks do not divide into",
                              fixture.source, world, d.reshard_after_forward_group, world));
    }
  }
  if (const auto* py = std::get_if<PythonOptions>(&fixture.model.options); py && py->selective_checkpointing()) {
    // Its plans would checkpoint blocks under the fixture's own policy, whose recomputed FLOPs are not counted.
    throw Error(fmt::format("{}: training.gradient_checkpointing.{}: memgate plan does not plan from a fixture's own "
                            "selective policy (its recomputed FLOPs are not counted): expected a fixture without "
                            "save or policy; plan it without them (the plans try saving the attention's output "
                            "themselves), or estimate the fixture with its policy (memgate estimate)",
                            fixture.source, py->checkpoint_save.empty() ? "policy" : "save"));
  }
  Planner planner(fixture, target, options);
  return planner.run();
}

nlohmann::json plan_to_json(const PlanResult& r) {
  nlohmann::json out = {{"model", {{"name", r.model}}},
                        {"target", {{"id", r.target.id}, {"name", r.target.name},
                                    {"usable_bytes", r.target.usable_bytes},
                                    {"library_workspace_bytes", r.target.library_workspace_bytes},
                                    {"measured", r.target.measured}}},
                        {"estimated_for", r.estimated_for},
                        {"batch", r.batch},
                        {"search", r.search},
                        {"space", r.space},
                        {"estimates", r.estimates},
                        {"seconds", r.seconds},
                        {"sharding", r.sharding},
                        {"plans", nlohmann::json::array()}};
  if (r.as_is) out["as_is"] = plan_json(*r.as_is);
  for (const auto& p : r.plans) out["plans"].push_back(plan_json(p));
  return out;
}

std::string format_plan(const PlanResult& r) {
  std::string out = fmt::format(
      "memgate plan: {} at batch {} on {} ({} usable), BY ESTIMATE for {}, not measured\n", r.model, r.batch,
      r.target.name, format_bytes(r.target.usable_bytes), r.estimated_for == "cpu" ? "the CPU" : "CUDA");
  if (r.as_is) {
    out += fmt::format("  as it is: needs {} ({})\n", format_bytes(r.as_is->required_bytes),
                       r.as_is->fits ? "fits" : "DOES NOT FIT");
  }
  if (!r.sharding.empty()) {
    out += r.sharding.starts_with("FSDP")
               ? fmt::format("  sharding: {}, each rank at batch {} (its bytes are the largest rank's)\n", r.sharding,
                             r.batch)
               : fmt::format("  sharding: not searched: {}\n", r.sharding);
  }
  out += fmt::format("  {:<3} {:>12} {:>12} {:>12} {:>10} {:>6}  {}\n", "#", "peak alloc", "peak reserved", "headroom",
                     "recompute", "accum", "levers");
  for (std::size_t i = 0; i < r.plans.size(); ++i) {
    const auto& p = r.plans[i];
    out += fmt::format("  {:<3} {:>12} {:>12} {:>12} {:>9.1f}% {:>6}  {}\n", i + 1, format_bytes(p.step_peak),
                       format_bytes(p.step_peak_reserved), format_bytes(p.headroom_bytes),
                       100.0 * p.recompute_flops_fraction, p.accumulation_steps,
                       p.levers.empty() ? std::string("none: fits as it is") : fmt::format("{}", fmt::join(p.levers, ", ")));
    out += fmt::format("      change: {}\n", p.change.dump());
  }
  out += fmt::format("{} search over {} plans: {} estimates in {:.1f} s\n", r.search, r.space, r.estimates, r.seconds);
  return out;
}

std::string apply_change(const std::string& fixture_yaml, const nlohmann::json& change) {
  auto node = YAML::Load(fixture_yaml);
  merge(node, change);
  YAML::Emitter emitter;
  emitter << node;
  return std::string(emitter.c_str()) + "\n";
}

}  // namespace memgate
