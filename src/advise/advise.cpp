// The batch-size advice: predict from the affine model of the step's peak, confirm under an allocator cap.
#include "memgate/advise/advise.h"

#include "memgate/launch/estimate.h"

#include "memgate/base/error.h"
#include "memgate/base/units.h"
#include "memgate/gate/report.h"
#include "memgate/launch/estimate.h"
#include "memgate/estimate/estimate_context.h"
#include "memgate/launch/ranks.h"
#include "memgate/models/vit.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <set>

namespace memgate {
namespace {

constexpr std::int64_t kUnbounded = std::numeric_limits<std::int64_t>::max();
constexpr int kMaxProbesPerSearch = 40;

// The peak a target must hold: the measured step's or the eval forward's, whichever is higher (the first
// optimizer step is held to the cap by the capped probes themselves), with what the step needs beside its
// components, as a budget counts it (evaluate_budget): the library workspaces, which the caching allocator holds
// from before the step (cuBLAS's, 65 MiB on an H200), and a GPU rank's NCCL communicators. A capped probe's
// allocator holds the workspaces under the same cap: without them, a batch whose step alone fits runs out under it.
std::int64_t peak_of(const ProbeResult& r) {
  return std::max(r.components.step_peak_reserved, r.components.eval_peak) + r.bytes_beside_components();
}

AffineFit fit_points(const std::map<std::int64_t, std::int64_t>& points) {
  AffineFit f;
  if (points.size() < 2) return f;
  auto it = points.rbegin();
  const auto [b2, p2] = *it;
  ++it;
  const auto [b1, p1] = *it;
  f.per_sample_bytes = static_cast<double>(p2 - p1) / static_cast<double>(b2 - b1);
  f.fixed_bytes = static_cast<double>(p2) - f.per_sample_bytes * static_cast<double>(b2);
  if (points.size() >= 3) {
    double worst = 0.0;
    for (const auto& [b, p] : points) {
      worst = std::max(worst, std::abs(static_cast<double>(p) - f.at(b)) / static_cast<double>(p) * 100.0);
    }
    f.max_deviation_pct = worst;
  }
  return f;
}

std::int64_t predict(const AffineFit& f, std::int64_t usable, std::int64_t max_batch) {
  if (f.per_sample_bytes <= 0.0) return max_batch;
  const double b = std::floor((static_cast<double>(usable) - f.fixed_bytes) / f.per_sample_bytes);
  if (b < 0.0) return 0;
  return b >= static_cast<double>(max_batch) ? max_batch : static_cast<std::int64_t>(b);
}

// The options of the advise() running on this thread: its probes' progress and options.
thread_local const AdviseOptions* t_options = nullptr;

ProbeResult probe(const Workload& w, std::int64_t batch, c10::Device device, std::optional<std::int64_t> cap,
                  std::string_view why) {
  static const AdviseOptions kNone;
  const auto& o = t_options != nullptr ? *t_options : kNone;
  const auto what = fmt::format("{} batch {} {}", w.name, batch, why);
  if (o.on_probe) o.on_probe(what);
  auto result = o.run ? o.run(w, batch, device, cap, o.probe)
                      : cap ? run_probe_capped(w, batch, device, *cap, o.probe) : run_probe(w, batch, device, o.probe);
  if (o.on_probe_done) o.on_probe_done(what, result);
  return result;
}

// The peaks estimates give a workload, batch by batch, computed when first asked for (tens of milliseconds each).
class EstimatedPeaks {
 public:
  EstimatedPeaks(const Workload& workload, c10::Device device)
      : workload_(workload), target_(device.is_cuda() ? EstimateTarget::kCuda : EstimateTarget::kCpu) {}
  std::int64_t at(std::int64_t batch) {
    if (const auto it = peaks_.find(batch); it != peaks_.end()) return it->second;
    return peaks_[batch] = std::max<std::int64_t>(peak_of(estimate_probe(workload_, batch, target_)), 1);
  }

 private:
  Workload workload_;
  EstimateTarget target_;
  std::map<std::int64_t, std::int64_t> peaks_;
};

// The largest batch in [1, max_batch] whose estimated peak, scaled by the measured/estimated ratio of the nearest
// measured batch, fits `usable` (0: not even batch 1): doubling, then bisection.
std::int64_t predict_from_estimates(EstimatedPeaks& estimated, const std::map<std::int64_t, std::int64_t>& measured,
                                    std::int64_t usable, std::int64_t max_batch) {
  auto fits = [&](std::int64_t b) {
    double ratio = 1.0;
    if (!measured.empty()) {
      auto it = measured.upper_bound(b);
      const auto& [bm, pm] = it == measured.begin() ? *it : *std::prev(it);
      ratio = static_cast<double>(pm) / static_cast<double>(estimated.at(bm));
    }
    return static_cast<double>(estimated.at(b)) * ratio <= static_cast<double>(usable);
  };
  if (!fits(1)) return 0;
  std::int64_t good = 1, bad = 0;
  for (std::int64_t b = 2; bad == 0; b *= 2) {
    const auto at = std::min(b, max_batch);
    if (fits(at)) {
      good = at;
      if (at == max_batch) return max_batch;
    } else {
      bad = at;
    }
  }
  while (bad - good > 1) {
    const auto mid = good + (bad - good) / 2;
    (fits(mid) ? good : bad) = mid;
  }
  return good;
}

// The free probes all targets share: batch 1 and batch 2, measured without a cap.
struct Shared {
  std::map<std::int64_t, std::int64_t> peaks;  // batch -> peak; a batch that ran out of memory is absent
  std::vector<std::int64_t> batches;           // the batches probed
  double step_seconds = 0.0;                   // the measured step of the largest of them that ran
};

Shared shared_probes(const Workload& workload, c10::Device device, std::int64_t accumulation_steps) {
  Shared s;
  auto w = workload;
  w.training.accumulation_steps = accumulation_steps;
  for (const std::int64_t b : {1, 2}) {
    s.batches.push_back(b);
    const auto r = probe(w, b, device, std::nullopt, "(no cap)");
    if (r.oom) break;
    s.peaks[b] = peak_of(r);
    s.step_seconds = r.step_seconds;
  }
  return s;
}

// The search on one target. The peak is affine in the batch only piecewise (a full fine-tune's optimizer step
// holds the peak at small batches, activations take over later), so the model is refitted after every probe:
// the line through the two largest batches that fit extrapolates; once a batch that does not fit has a
// measured peak, the secant between it and the largest that fits interpolates. A batch expected to fit runs
// under an allocator cap of the target's usable bytes (that is the confirmation); a batch expected not to fit,
// or one after a capped probe ran out, runs under a safety cap of four times that, so that its peak is measured.
TargetAdvice search(const Workload& workload, const AdviceTarget& target, c10::Device device, const Shared& shared,
                    std::int64_t accumulation_steps, std::int64_t max_batch, EstimatedPeaks* estimated) {
  TargetAdvice t;
  t.target = target;
  const auto usable = target.usable_bytes;
  auto w = workload;
  w.training.accumulation_steps = accumulation_steps;
  std::map<std::int64_t, std::int64_t> points;  // measured peaks
  std::set<std::int64_t> confirmed;               // ran under the cap of `usable`
  std::int64_t hi = kUnbounded;                   // the smallest batch that did not fit
  for (const auto b : shared.batches) {
    ++t.probes;
    AdviceTrial trial{b, false, false, std::nullopt, accumulation_steps};
    if (const auto it = shared.peaks.find(b); it != shared.peaks.end()) {
      trial.peak = it->second;
      trial.fits = it->second <= usable;
      points[b] = it->second;
    }
    if (!trial.fits) hi = std::min(hi, b);
    t.trials.push_back(trial);
  }
  auto largest_fit = [&] {
    std::int64_t lo = 0;
    for (const auto& [b, p] : points) {
      if (p <= usable) lo = std::max(lo, b);
    }
    return lo;
  };
  auto prediction = [&]() -> std::int64_t {
    std::map<std::int64_t, std::int64_t> fitting;
    for (const auto& [b, p] : points) {
      if (p <= usable) fitting[b] = p;
    }
    if (!fitting.empty()) {
      const auto [bl, pl] = *fitting.rbegin();
      for (const auto& [b, p] : points) {
        if (b > bl && p > usable) {  // the first measured miss above: interpolate
          const double x = static_cast<double>(bl) + static_cast<double>(usable - pl) / static_cast<double>(p - pl) *
                                                         static_cast<double>(b - bl);
          return std::min(max_batch, static_cast<std::int64_t>(std::floor(x)));
        }
      }
    }
    t.fit = fit_points(fitting.size() >= 2 ? fitting : points);
    if (estimated != nullptr) return predict_from_estimates(*estimated, points, usable, max_batch);
    return predict(t.fit, usable, max_batch);
  };
  if (largest_fit() == 0) {
    t.fit = fit_points(points);
    return t;  // batch 1 needs more than the target has
  }
  auto b = prediction();
  t.predicted = b;
  bool capped_ran_out = false;
  for (int n = 0; n < kMaxProbesPerSearch; ++n) {
    const auto lo = largest_fit();
    if (hi - lo <= 1 || lo >= max_batch) {
      if (lo >= 1 && !confirmed.contains(lo)) {  // the answer always runs under the target's cap
        const auto r = probe(w, lo, device, usable, fmt::format("under {}'s cap", target.name));
        ++t.probes;
        t.trials.push_back({lo, true, !r.oom, r.oom ? std::nullopt : std::optional(peak_of(r)), accumulation_steps});
        if (r.oom) {  // it needed the cache headroom a free run had: one lower
          points.erase(lo);
          hi = lo;
          continue;
        }
        confirmed.insert(lo);
      }
      break;
    }
    const auto candidate = std::clamp(b, lo + 1, hi == kUnbounded ? max_batch : hi - 1);
    const bool capped = candidate <= b && !capped_ran_out;
    const auto r = capped ? probe(w, candidate, device, usable, fmt::format("under {}'s cap", target.name))
                          : probe(w, candidate, device, 4 * usable, fmt::format("above {}'s cap", target.name));
    ++t.probes;
    AdviceTrial trial{candidate, capped, false, std::nullopt, accumulation_steps};
    if (!r.oom) {
      trial.peak = peak_of(r);
      points[candidate] = *trial.peak;
    }
    trial.fits = !r.oom && *trial.peak <= usable;
    if (trial.fits && capped) confirmed.insert(candidate);
    if (!trial.fits) hi = std::min(hi, candidate);
    capped_ran_out = capped && r.oom;
    t.trials.push_back(trial);
    b = prediction();
    if (r.oom && !capped) {
      // Not even a peak within four times the target: the model is far off; bisect, geometrically.
      const auto low = std::max<std::int64_t>(largest_fit(), 1);
      b = std::max(low, static_cast<std::int64_t>(std::sqrt(static_cast<double>(low) * static_cast<double>(hi))));
    }
  }
  const auto lo = largest_fit();
  if (lo >= 1 && confirmed.contains(lo)) t.batch_size = lo;
  if (!t.fit.max_deviation_pct && points.size() >= 3) {
    // How affine the step was over every batch measured (the line through the two largest).
    t.fit = fit_points(points);
  }
  t.corrected = t.predicted != t.batch_size.value_or(0);
  return t;
}

}  // namespace

std::vector<std::pair<VariantAdvice, Workload>> fit_variants(const Workload& workload) {
  std::vector<std::pair<VariantAdvice, Workload>> out;
  auto add = [&](std::string name, std::string change, auto&& edit) {
    auto w = workload;
    edit(w);
    VariantAdvice v;
    v.name = std::move(name);
    v.change = std::move(change);
    out.emplace_back(std::move(v), std::move(w));
  };
  const auto& t = workload.training;
  if (t.precision == Precision::kFp32) {
    add("bf16 autocast", "training.precision: bf16", [](Workload& w) { w.training.precision = Precision::kBf16; });
  }
  if (!t.gradient_checkpointing) {
    add("gradient checkpointing", "training.gradient_checkpointing: true",
        [](Workload& w) { w.training.gradient_checkpointing = true; });
  }
  if (t.trainable.kind != TrainableSpec::Kind::kHead) {
    add("frozen backbone (train the head)", "training.trainable: head",
        [](Workload& w) { w.training.trainable.kind = TrainableSpec::Kind::kHead; });
  }
  if (const auto* vit = std::get_if<VitOptions>(&workload.model.options)) {
    if (!vit->lora.enabled()) {
      add("LoRA rank 8 on qkv", "model.lora: {rank: 8, targets: [qkv]}; training.trainable: lora", [](Workload& w) {
        auto& o = std::get<VitOptions>(w.model.options);
        o.lora.rank = 8;
        o.lora.alpha = 16;
        o.lora.targets = {"qkv"};
        w.training.trainable.kind = TrainableSpec::Kind::kLora;
      });
    } else if (vit->lora.rank > 1) {
      const auto rank = vit->lora.rank / 2;
      add(fmt::format("LoRA rank {}", rank), fmt::format("model.lora.rank: {}", rank),
          [rank](Workload& w) { std::get<VitOptions>(w.model.options).lora.rank = rank; });
    }
  }
  if (t.optimizer == Optimizer::kAdamW) {
    add("SGD (momentum 0.9) instead of AdamW", "training.optimizer: sgd, momentum: 0.9", [](Workload& w) {
      w.training.optimizer = Optimizer::kSgd;
      w.training.momentum = 0.9;
      w.training.weight_decay = 0.0;
    });
  }
  return out;
}

AdviceTarget target_of(const GpuSpec& gpu) {
  return {.id = gpu.id,
          .name = gpu.name,
          .usable_bytes = gpu.usable_bytes(),
          .library_workspace_bytes = gpu.library_workspace_bytes(),
          .measured = gpu.measured,
          .multiprocessors = gpu.multiprocessors,
          .max_threads_per_multiprocessor = gpu.max_threads_per_multiprocessor};
}

Advice advise(const Workload& workload, const std::vector<AdviceTarget>& targets, c10::Device device,
              const AdviseOptions& options) {
  if (targets.empty()) throw Error(workload.source + ": advise needs a target (a GPU fixture or a capacity)");
  for (const auto& t : targets) {
    if (t.usable_bytes <= 0) throw Error(fmt::format("target {}: no usable bytes ({})", t.id, t.usable_bytes));
  }
  if (options.effective_batch && *options.effective_batch < 1) {
    throw Error(workload.source + ": --effective-batch: expected an integer >= 1");
  }
  struct Scope {  // this call's options for the probes it runs (restored for a nested call)
    const AdviseOptions* previous = t_options;
    explicit Scope(const AdviseOptions& o) { t_options = &o; }
    ~Scope() { t_options = previous; }
  } scope(options);
  Advice advice;
  advice.device = describe_probe_device(device, workload);
  advice.fixture = workload.name;
  if (workload.training.distributed.enabled()) advice.world_size = workload.training.distributed.world_size;
  advice.from_estimates = options.from_estimates;
  const auto shared = shared_probes(workload, device, workload.training.accumulation_steps);
  // Estimates of the workload as it is and with accumulation, when asked for (each computed on first use).
  auto estimates_of = [&](std::int64_t steps) -> std::unique_ptr<EstimatedPeaks> {
    if (!options.from_estimates) return nullptr;
    auto w = workload;
    w.training.accumulation_steps = steps;
    return std::make_unique<EstimatedPeaks>(w, device);
  };
  const auto estimated = estimates_of(workload.training.accumulation_steps);
  advice.total_probes = static_cast<int>(shared.batches.size());
  // With accumulation the gradients stay between micro-batches: the search for the micro-batch runs with it.
  const auto accumulated_steps = std::max<std::int64_t>(2, workload.training.accumulation_steps);
  std::optional<Shared> shared_accumulated;
  const auto estimated_accumulated = estimates_of(accumulated_steps);
  for (const auto& target : targets) {
    auto t = search(workload, target, device, shared, workload.training.accumulation_steps, options.max_batch,
                    estimated.get());
    advice.total_probes += t.probes - static_cast<int>(shared.batches.size());
    if (options.effective_batch) {
      const auto n = *options.effective_batch;
      AccumulationAdvice acc;
      acc.effective_batch = n;
      std::int64_t largest_micro = 0;
      if (t.batch_size && *t.batch_size >= n) {
        acc.micro_batch = n;
        acc.steps = 1;
      } else {
        if (!shared_accumulated) {
          shared_accumulated = shared_probes(workload, device, accumulated_steps);
          advice.total_probes += static_cast<int>(shared_accumulated->batches.size());
        }
        const auto micro = search(workload, target, device, *shared_accumulated, accumulated_steps, options.max_batch,
                                  estimated_accumulated.get());
        advice.total_probes += micro.probes - static_cast<int>(shared_accumulated->batches.size());
        t.probes += micro.probes;
        largest_micro = micro.batch_size.value_or(0);
        for (std::int64_t k = 2; largest_micro > 0 && k <= n; ++k) {
          if (n % k == 0 && n / k <= largest_micro) {
            acc.micro_batch = n / k;
            acc.steps = k;
            break;
          }
        }
      }
      if (acc.micro_batch > 0) {
        auto w = workload;
        w.training.accumulation_steps = acc.steps;
        const auto r = probe(w, acc.micro_batch, device, target.usable_bytes,
                             fmt::format("x {} steps under {}'s cap", acc.steps, target.name));
        ++advice.total_probes;
        ++t.probes;
        acc.fits = !r.oom;
        if (!r.oom) acc.step_peak_reserved = r.components.step_peak_reserved;
      }
      t.accumulation = acc;
    }
    advice.targets.push_back(std::move(t));
  }
  if (options.variants) {
    // What would make the wanted batch fit: each variant measured as a real fixture, on the targets that miss it.
    const auto wanted = options.effective_batch.value_or(options.wanted_batch.value_or(0));
    std::vector<std::size_t> missing;
    for (std::size_t i = 0; i < advice.targets.size(); ++i) {
      advice.targets[i].wanted_batch = wanted;
      if (wanted > 0 && advice.targets[i].batch_size.value_or(0) < wanted) missing.push_back(i);
    }
    if (!missing.empty()) {
      for (auto& [variant, w] : fit_variants(workload)) {
        Shared variant_shared;
        try {
          variant_shared = shared_probes(w, device, w.training.accumulation_steps);
        } catch (const std::exception&) {
          continue;  // a variant this model cannot take (no head, no blocks): not offered
        }
        advice.total_probes += static_cast<int>(variant_shared.batches.size());
        variant.step_seconds = variant_shared.step_seconds;
        variant.step_time_change_pct =
            shared.step_seconds > 0.0 ? (variant.step_seconds / shared.step_seconds - 1.0) * 100.0 : 0.0;
        const auto variant_estimated = options.from_estimates ? std::make_unique<EstimatedPeaks>(w, device) : nullptr;
        for (const auto i : missing) {
          auto v = variant;
          const auto r = search(w, advice.targets[i].target, device, variant_shared, w.training.accumulation_steps,
                                options.max_batch, variant_estimated.get());
          v.batch_size = r.batch_size;
          v.probes = r.probes;
          advice.total_probes += r.probes - static_cast<int>(variant_shared.batches.size());
          advice.targets[i].variants.push_back(std::move(v));
        }
      }
      for (const auto i : missing) {
        std::stable_sort(advice.targets[i].variants.begin(), advice.targets[i].variants.end(),
                         [](const VariantAdvice& a, const VariantAdvice& b) {
                           if (a.batch_size.value_or(0) != b.batch_size.value_or(0)) {
                             return a.batch_size.value_or(0) > b.batch_size.value_or(0);
                           }
                           return a.step_seconds < b.step_seconds;
                         });
      }
    }
  }
  return advice;
}

nlohmann::json advice_to_json(const Advice& advice) {
  nlohmann::json targets = nlohmann::json::array();
  for (const auto& t : advice.targets) {
    nlohmann::json trials = nlohmann::json::array();
    for (const auto& trial : t.trials) {
      nlohmann::json j = {{"batch_size", trial.batch_size}, {"capped", trial.capped}, {"fits", trial.fits},
                          {"accumulation_steps", trial.accumulation_steps}};
      j["peak_bytes"] = trial.peak ? nlohmann::json(*trial.peak) : nlohmann::json(nullptr);
      trials.push_back(j);
    }
    nlohmann::json fit = {{"fixed_bytes", std::llround(t.fit.fixed_bytes)},
                          {"per_sample_bytes", std::llround(t.fit.per_sample_bytes)}};
    fit["max_deviation_pct"] = t.fit.max_deviation_pct ? nlohmann::json(*t.fit.max_deviation_pct) : nlohmann::json(nullptr);
    nlohmann::json j = {{"id", t.target.id},
                        {"name", t.target.name},
                        {"usable_bytes", t.target.usable_bytes},
                        {"batch_size", t.batch_size ? nlohmann::json(*t.batch_size) : nlohmann::json(nullptr)},
                        {"predicted_batch_size", t.predicted ? nlohmann::json(*t.predicted) : nlohmann::json(nullptr)},
                        {"corrected", t.corrected},
                        {"probes", t.probes},
                        {"fit", fit},
                        {"trials", trials}};
    if (t.accumulation) {
      const auto& a = *t.accumulation;
      j["accumulation"] = {{"effective_batch", a.effective_batch}, {"micro_batch", a.micro_batch},
                           {"steps", a.steps},                     {"step_peak_reserved", a.step_peak_reserved},
                           {"fits", a.fits}};
    }
    j["wanted_batch"] = t.wanted_batch;
    nlohmann::json variants = nlohmann::json::array();
    for (const auto& v : t.variants) {
      variants.push_back({{"name", v.name},
                          {"change", v.change},
                          {"batch_size", v.batch_size ? nlohmann::json(*v.batch_size) : nlohmann::json(nullptr)},
                          {"step_seconds", v.step_seconds},
                          {"step_time_change_pct", v.step_time_change_pct},
                          {"probes", v.probes}});
    }
    j["variants"] = variants;
    targets.push_back(j);
  }
  return {{"device", device_to_json(advice.device)},
          {"model", {{"name", advice.fixture}}},
          {"total_probes", advice.total_probes},
          {"from_estimates", advice.from_estimates},
          {"world_size", advice.world_size},
          {"targets", targets}};
}

std::string format_advice(const Advice& advice) {
  std::string out = fmt::format("memgate advise: {} on {} ({})\n", advice.fixture, advice.device.name,
                                advice.device.device.str());
  if (advice.world_size > 0) {
    out += fmt::format("{} ranks: each batch is one rank's micro-batch, each rank on a target of its own\n",
                       advice.world_size);
  }
  out += "\n";
  out += fmt::format("{:<34} {:>12} {:>8} {:>10} {:>7}  {}\n", "target", "usable", "batch", "predicted", "probes",
                     "peak = fixed + per sample x batch");
  for (const auto& t : advice.targets) {
    out += fmt::format("{:<34} {:>12} {:>8} {:>10} {:>7}  {} + {} x b{}\n", t.target.name.substr(0, 34),
                       format_usable(t.target.usable_bytes),
                       t.batch_size ? std::to_string(*t.batch_size) : std::string("none"),
                       t.predicted ? std::to_string(*t.predicted) : std::string("-"), t.probes,
                       format_bytes(std::llround(t.fit.fixed_bytes)),
                       format_bytes(std::llround(t.fit.per_sample_bytes)),
                       t.fit.max_deviation_pct ? fmt::format(" (off by at most {:.2f}%)", *t.fit.max_deviation_pct)
                                               : std::string());
    if (t.corrected && t.batch_size) {
      out += fmt::format("  the prediction ({}) was corrected by the probes to {}\n", t.predicted.value_or(0),
                         *t.batch_size);
    }
    if (!t.batch_size) out += "  not even batch 1 fits\n";
    if (!t.variants.empty()) {
      out += fmt::format("  batch {} does not fit; measured variants, best first:\n", t.wanted_batch);
      out += fmt::format("    {:<38} {:>8} {:>12}  {}\n", "variant", "batch", "step time", "change");
      for (const auto& v : t.variants) {
        out += fmt::format("    {:<38} {:>8} {:>+11.0f}%  {}\n", v.name,
                           v.batch_size ? std::to_string(*v.batch_size) : std::string("none"), v.step_time_change_pct,
                           v.change);
      }
    }
    if (t.accumulation) {
      const auto& a = *t.accumulation;
      if (a.micro_batch > 0) {
        out += fmt::format("  effective batch {}: micro-batch {} x {} accumulation steps, step peak {}{}\n",
                           a.effective_batch, a.micro_batch, a.steps, format_bytes(a.step_peak_reserved),
                           a.fits ? "" : " (DOES NOT FIT)");
      } else {
        out += fmt::format("  effective batch {}: no micro-batch fits\n", a.effective_batch);
      }
    }
  }
  out += fmt::format("\n{} probes in all; each advised batch ran under an allocator cap of the target's usable "
                     "bytes, and the next batch up did not fit.\n",
                     advice.total_probes);
  if (advice.from_estimates) {
    out += "Predictions came from estimates (the step on the Meta device), scaled by the nearest measured peak.\n";
  }
  if (advice.device.device.is_cpu()) {
    out += "(measured on the CPU: CUDA kernels and workspaces differ; advise on a GPU for a GPU you can trust)\n";
  }
  return out;
}

namespace {

// The search for the largest batch that fits (batch 1, 2, 4, ... until one does not fit or max_batch is passed, then a
// binary search between the last two), a step at a time: power_of_two_then_binary_search_trials runs it to the end,
// and largest_batches_by_estimate runs every target's in step, so that each round's batch sizes are estimated
// together.
class StepwiseSearch {
 public:
  explicit StepwiseSearch(std::int64_t max_batch) : max_batch_(max_batch) { settle(); }
  [[nodiscard]] bool done() const { return done_; }
  [[nodiscard]] std::int64_t largest() const { return lo_; }
  /// The batch size whose answer the search needs next (while not done).
  [[nodiscard]] std::int64_t next() const { return doubling_ ? b_ : lo_ + (hi_ - lo_) / 2; }
  void answer(bool fits) {
    if (doubling_) {
      if (fits) {
        lo_ = b_;
        b_ *= 2;
      } else {
        doubling_ = false;
      }
    } else if (fits) {
      lo_ = next();
    } else {
      hi_ = next();
    }
    settle();
  }

 private:
  void settle() {
    if (doubling_ && b_ > max_batch_) doubling_ = false;
    if (!doubling_ && !bisecting_) {
      bisecting_ = true;
      hi_ = std::min(b_, max_batch_ + 1);
    }
    if (bisecting_ && hi_ - lo_ <= 1) done_ = true;
  }
  std::int64_t max_batch_;
  std::int64_t b_ = 1;
  std::int64_t lo_ = 0;  ///< the last batch that fits (0: none yet)
  std::int64_t hi_ = 0;
  bool doubling_ = true;
  bool bisecting_ = false;
  bool done_ = false;
};

}  // namespace

int power_of_two_then_binary_search_trials(const std::function<bool(std::int64_t)>& fits, std::int64_t max_batch,
                                           std::int64_t* found) {
  int trials = 0;
  StepwiseSearch search(max_batch);
  for (; !search.done(); ++trials) search.answer(fits(search.next()));
  if (found != nullptr) *found = search.largest();
  return trials;
}


namespace {

nlohmann::json target_to_json(const AdviceTarget& t) {
  return {{"id", t.id}, {"name", t.name}, {"usable_bytes", t.usable_bytes},
          {"library_workspace_bytes", t.library_workspace_bytes}, {"measured", t.measured},
          {"multiprocessors", t.multiprocessors}, {"max_threads_per_multiprocessor", t.max_threads_per_multiprocessor}};
}

AdviceTarget target_from_json(const nlohmann::json& j) {
  return {.id = j.at("id").get<std::string>(), .name = j.at("name").get<std::string>(),
          .usable_bytes = j.at("usable_bytes").get<std::int64_t>(),
          .library_workspace_bytes = j.at("library_workspace_bytes").get<std::int64_t>(),
          .measured = j.at("measured").get<bool>(), .multiprocessors = j.at("multiprocessors").get<int>(),
          .max_threads_per_multiprocessor = j.at("max_threads_per_multiprocessor").get<int>()};
}

}  // namespace

std::string search_largest_batches_here(const Workload& workload, const std::string& request,
                                        const PythonRuntime* python) {
  const auto j = nlohmann::json::parse(request);
  std::vector<AdviceTarget> targets;
  for (const auto& t : j.at("targets")) targets.push_back(target_from_json(t));
  std::optional<std::int64_t> effective_batch;
  if (!j.at("effective_batch").is_null()) effective_batch = j.at("effective_batch").get<std::int64_t>();
  const auto fits =
      largest_batches_by_estimate(workload, targets, effective_batch, j.at("max_batch").get<std::int64_t>(), python);
  nlohmann::json answer = {{"memgate_version", MEMGATE_VERSION}, {"estimates", fits.estimates}, {"fits", nlohmann::json::array()}};
  for (const auto& f : fits.fits) {
    answer["fits"].push_back({{"largest", f.largest}, {"required_bytes", f.required_bytes},
                              {"next_required_bytes", f.next_required_bytes}, {"micro_batch", f.micro_batch},
                              {"accumulation_steps", f.accumulation_steps}, {"capped", f.capped},
                              {"next_cannot_run", f.next_cannot_run}});
  }
  return answer.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

EstimatedFits largest_batches_by_estimate(const Workload& workload, const std::vector<AdviceTarget>& targets,
                                          std::optional<std::int64_t> effective_batch, std::int64_t max_batch,
                                          const PythonRuntime* python) {
  if (targets.empty()) throw Error(workload.source + ": the search needs a GPU (--gpu or --all-gpus)");
  if (effective_batch && *effective_batch < 1) throw Error("--effective-batch: expected a batch of 1 or more");
  const auto start = std::chrono::steady_clock::now();
  EstimatedFits out;
  out.max_batch = max_batch;
  if (workload.training.distributed.enabled()) out.world_size = workload.training.distributed.world_size;
  // A Python fixture's search runs whole in its Python process: one process and one built module for every estimate
  // (0.08 s each for a ViT-B with LoRA, where a process per round paid its start and its first build each time).
  if (runs_in_python(workload, python)) {
    nlohmann::json request = {{"targets", nlohmann::json::array()}, {"max_batch", max_batch},
                              {"effective_batch", effective_batch ? nlohmann::json(*effective_batch) : nlohmann::json()}};
    for (const auto& t : targets) request["targets"].push_back(target_to_json(t));
    const auto answer = nlohmann::json::parse(run_python_search(workload, request.dump()));
    out.estimates = answer.at("estimates").get<std::int64_t>();
    const auto& fits = answer.at("fits");
    if (fits.size() != targets.size()) {
      throw Error(fmt::format("{}: the Python search answered for {} GPUs of {}", workload.source, fits.size(),
                              targets.size()));
    }
    for (std::size_t t = 0; t < targets.size(); ++t) {
      const auto& f = fits.at(t);
      out.fits.push_back({.target = targets[t], .largest = f.at("largest").get<std::int64_t>(),
                          .required_bytes = f.at("required_bytes").get<std::int64_t>(),
                          .next_required_bytes = f.at("next_required_bytes").get<std::int64_t>(),
                          .micro_batch = f.at("micro_batch").get<std::int64_t>(),
                          .accumulation_steps = f.at("accumulation_steps").get<std::int64_t>(),
                          .capped = f.at("capped").get<bool>(),
                          .next_cannot_run = f.at("next_cannot_run").get<std::string>()});
    }
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return out;
  }
  // CUDA's reduction staging depends on the GPU's SMs and threads per SM (cuda_reduce.h), a few bytes to a few MiB
  // of a step's peak: each target's answer comes from its own GPU's estimates.
  using Gpu = std::pair<int, int>;
  const CudaReduceDevice defaults;
  const auto gpu_of = [&](const AdviceTarget& t) {
    const bool as_defaults = t.multiprocessors <= 0 || t.max_threads_per_multiprocessor <= 0 ||
                             (t.multiprocessors == defaults.multiprocessors &&
                              t.max_threads_per_multiprocessor == defaults.max_threads_per_multiprocessor);
    return as_defaults ? Gpu{0, 0} : Gpu{t.multiprocessors, t.max_threads_per_multiprocessor};
  };
  std::map<Gpu, std::map<std::int64_t, std::int64_t>> required;  // GPU -> batch -> step_peak_reserved, each once
  ProbeOptions in_this_process;  // the default probe's, with the Python extension's runtime where this process has it
  in_this_process.python = python;
  // A batch whose step CUDA cannot run at all (CannotRunOnCudaError: PyTorch's own kernel fails, whatever the memory)
  // needs more than any GPU has, and the first line of why is kept for the answer.
  constexpr std::int64_t kCannotRun = std::numeric_limits<std::int64_t>::max() / 4;
  std::map<Gpu, std::map<std::int64_t, std::string>> cannot_run;
  // The batch sizes not yet estimated among `batches`, each from the state a process of its own would start it in.
  const auto estimate = [&](const Gpu& gpu, const std::set<std::int64_t>& batches) {
    auto& known = required[gpu];
    std::vector<std::int64_t> missing;
    for (const auto b : batches) {
      if (!known.contains(b)) missing.push_back(b);
    }
    if (missing.empty()) return;
    const EstimateContextGuard for_gpu(estimate_context_for_gpu(CudaReduceDevice{gpu.first, gpu.second}));
    for (const auto b : missing) {
      try {
        known[b] = estimate_probe(workload, b, EstimateTarget::kCuda, in_this_process).components.step_peak_reserved;
      } catch (const std::exception& e) {
        if (!cannot_run_on_cuda(e)) throw;
        known[b] = kCannotRun;
        const std::string why = e.what();
        cannot_run[gpu][b] = why.substr(0, why.find('\n'));
      }
    }
    out.estimates += static_cast<std::int64_t>(missing.size());
  };
  // The step's reserved peak on `gpu` and, beside it in the allocator, the cuBLAS workspaces a target's GPU gets.
  const auto needs_on = [&](const Gpu& gpu, const AdviceTarget& target, std::int64_t b) {
    return required.at(gpu).at(b) + target.library_workspace_bytes;
  };
  // Each target's search keeps a bracket on its own GPU's estimates: `lo` fits (0: nothing yet) and `hi` does not (0:
  // none found yet). Each round guesses where the step's reserved bytes reach the usable bytes, on the line through
  // the two estimates around them (batch 1 and 2 first, the defaults'), and estimates the guess and the
  // batch after it: a step grows by about the same bytes per sample, so the guess is mostly the answer, and the
  // answer is read from estimates on both sides of it (its largest batch fits, the next does not). A round that does
  // not halve the bracket (or double `lo` before there is a `hi`) makes the next a bisection (or a doubling): the
  // search never takes more rounds than the doubling and bisection it replaces, and mostly two or three.
  struct Bracket {
    std::int64_t lo = 0, hi = 0;
    std::int64_t guess = 0;
    bool safe_next = false;  ///< bisect or double next, the guess having not moved the bracket enough
    bool done = false;
  };
  std::vector<Bracket> brackets(targets.size());
  const auto guess_for = [&](std::size_t t) {
    const auto& target = targets[t];
    auto& b = brackets[t];
    const auto top = b.hi > 0 ? b.hi - 1 : max_batch;
    if (b.safe_next) {
      return b.hi > 0 ? b.lo + (b.hi - b.lo) / 2 : std::min(top, std::max<std::int64_t>(2 * b.lo, 1));
    }
    // Its GPU's estimates, and the defaults' where its GPU has none (a guess only: the bracket is its GPU's).
    auto points = required[Gpu{0, 0}];
    for (const auto& [batch, bytes] : required[gpu_of(target)]) points[batch] = bytes;
    const double usable = static_cast<double>(target.usable_bytes - target.library_workspace_bytes);
    // The consecutive estimates whose bytes enclose the usable bytes; else (all below, or all above) the nearest one
    // and one at least twice (or half) as far from batch 0: a line through two batches next to each other is as steep
    // as one sample makes it (a new segment, or none), not as the step grows.
    std::vector<std::pair<std::int64_t, std::int64_t>> sorted(points.begin(), points.end());
    std::int64_t g = 2 * std::max<std::int64_t>(b.lo, 1);
    std::optional<std::pair<std::size_t, std::size_t>> line;
    for (std::size_t k = 0; k + 1 < sorted.size() && !line; ++k) {
      if (static_cast<double>(sorted[k].second) <= usable && static_cast<double>(sorted[k + 1].second) > usable) {
        line = {k, k + 1};
      }
    }
    if (!line && sorted.size() >= 2) {
      if (static_cast<double>(sorted.back().second) <= usable) {
        std::size_t k = 0;
        for (std::size_t j = sorted.size() - 1; j-- > 0;) {
          if (2 * sorted[j].first <= sorted.back().first) {
            k = j;
            break;
          }
        }
        line = {k, sorted.size() - 1};
      } else {
        std::size_t k = sorted.size() - 1;
        for (std::size_t j = 1; j < sorted.size(); ++j) {
          if (sorted[j].first >= 2 * sorted.front().first) {
            k = j;
            break;
          }
        }
        line = {0, k};
      }
    }
    if (line && sorted[line->second].second > sorted[line->first].second) {
      const auto [b0, v0] = sorted[line->first];
      const auto [b1, v1] = sorted[line->second];
      const double at = static_cast<double>(b0) + (usable - static_cast<double>(v0)) * static_cast<double>(b1 - b0) /
                                                      static_cast<double>(v1 - v0);
      g = at >= static_cast<double>(max_batch) ? max_batch : static_cast<std::int64_t>(std::floor(at));
    }
    return std::clamp(g, b.lo + 1, top);
  };
  estimate(Gpu{0, 0}, max_batch >= 2 ? std::set<std::int64_t>{1, 2} : std::set<std::int64_t>{1});
  for (;;) {
    std::map<Gpu, std::set<std::int64_t>> wanted;
    for (std::size_t t = 0; t < targets.size(); ++t) {
      auto& b = brackets[t];
      if (b.done) continue;
      b.guess = guess_for(t);
      auto& batches = wanted[gpu_of(targets[t])];
      batches.insert(b.guess);
      if (b.guess < max_batch && (b.hi == 0 || b.guess + 1 < b.hi)) batches.insert(b.guess + 1);
    }
    if (wanted.empty()) break;
    for (const auto& [gpu, batches] : wanted) estimate(gpu, batches);
    for (std::size_t t = 0; t < targets.size(); ++t) {
      auto& b = brackets[t];
      if (b.done) continue;
      const auto gpu = gpu_of(targets[t]);
      const auto lo = b.lo, width = b.hi - b.lo;
      for (const auto batch : {b.guess, b.guess + 1}) {
        if (batch <= b.lo || (b.hi > 0 && batch >= b.hi) || !required.at(gpu).contains(batch)) continue;
        if (needs_on(gpu, targets[t], batch) <= targets[t].usable_bytes) {
          b.lo = batch;
        } else {
          b.hi = batch;
          break;
        }
      }
      b.safe_next = b.hi > 0 ? width > 0 && 2 * (b.hi - b.lo) > width : b.lo < 2 * std::max<std::int64_t>(lo, 1);
      b.done = (b.hi > 0 && b.hi - b.lo <= 1) || b.lo >= max_batch;
    }
  }
  std::vector<std::int64_t> largest(targets.size());
  for (std::size_t t = 0; t < targets.size(); ++t) {
    largest[t] = brackets[t].lo;
    // What the answer reports: the estimates at its largest batch (at 1 when none fits) and the next.
    std::set<std::int64_t> reported{std::max<std::int64_t>(largest[t], 1)};
    if (largest[t] < max_batch) reported.insert(largest[t] + 1);
    estimate(gpu_of(targets[t]), reported);
  }
  for (std::size_t t = 0; t < targets.size(); ++t) {
    const auto& target = targets[t];
    EstimatedFit fit{.target = target};
    fit.largest = largest[t];
    const auto needs_here = [&](std::int64_t b) {
      return cannot_run[gpu_of(target)].contains(b) ? std::int64_t{0} : needs_on(gpu_of(target), target, b);
    };
    fit.required_bytes = needs_here(std::max<std::int64_t>(fit.largest, 1));
    if (fit.largest < max_batch) {
      fit.next_required_bytes = needs_here(fit.largest + 1);
      if (const auto why = cannot_run[gpu_of(target)].find(fit.largest + 1); why != cannot_run[gpu_of(target)].end()) {
        fit.next_cannot_run = why->second;
      }
    }
    fit.capped = fit.largest >= max_batch;
    if (effective_batch && fit.largest > 0) {
      for (auto d = std::min(fit.largest, *effective_batch); d >= 1; --d) {
        if (*effective_batch % d == 0) {
          fit.micro_batch = d;
          fit.accumulation_steps = *effective_batch / d;
          break;
        }
      }
    }
    out.fits.push_back(fit);
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

std::string format_estimated_fits(const EstimatedFits& fits, std::optional<std::int64_t> effective_batch) {
  std::string out =
      "\nLargest batch by estimate (the step on the Meta device through the CUDA caching allocator's model; an "
      "estimate, not a measurement: the allocator's model replays real GPU traces exactly; cuBLAS's workspaces are "
      "held against each GPU, cuDNN's convolution workspaces are in the step as cuDNN picks them for an H200):\n";
  auto o = std::back_inserter(out);
  const auto world = fits.world_size;
  if (world > 1) {
    fmt::format_to(o, "  each of the {} ranks on a GPU of its own: batches are per rank (the global batch is {} x "
                   "the per-rank batch)\n", world, world);
  }
  const auto wanted = !effective_batch ? std::string()
                      : world > 1      ? fmt::format("   for a batch of {} per rank (global {})", *effective_batch,
                                                     *effective_batch * world)
                                       : fmt::format("   for a batch of {}", *effective_batch);
  fmt::format_to(o, "  {:<16} {:>12} {:>8} {:>16} {:>16}{}\n", "gpu", "usable", "largest", "its step needs",
                 "the next needs", wanted);
  bool any_capped = false, any_unmeasured = false;
  for (const auto& f : fits.fits) {
    any_capped = any_capped || f.capped;
    any_unmeasured = any_unmeasured || !f.target.measured;
    const auto largest = f.largest == 0 ? std::string("none")
                         : f.capped     ? fmt::format(">={}", f.largest)
                                        : std::to_string(f.largest);
    fmt::format_to(o, "  {:<16} {:>12} {:>8} {:>16} {:>16}", f.target.id + (f.target.measured ? "" : "*"),
                   format_usable(f.target.usable_bytes),
                   largest, f.required_bytes > 0 ? format_mib(f.required_bytes) : std::string("-"),
                   !f.next_cannot_run.empty()  ? std::string("cannot run")
                   : f.next_required_bytes > 0 ? format_mib(f.next_required_bytes)
                                               : std::string("-"));
    if (effective_batch) {
      fmt::format_to(o, "   {}", f.micro_batch > 0 ? fmt::format("{} x {} step{}", f.micro_batch, f.accumulation_steps,
                                                                   f.accumulation_steps == 1 ? "" : "s")
                                                    : std::string("does not fit"));
    }
    fmt::format_to(o, "\n");
  }
  for (const auto& f : fits.fits) {
    if (f.next_cannot_run.empty()) continue;
    // Said once: every GPU meets the same kernel at the same batch.
    fmt::format_to(o, "  cannot run: batch {} cannot run on CUDA on any GPU, whatever its memory: {}\n",
                   f.largest + 1, f.next_cannot_run);
    break;
  }
  if (any_capped) {
    fmt::format_to(o, "  >={}: the search stops at a batch of {}, which fits; larger batches were not estimated\n",
                   fits.max_batch, fits.max_batch);
  }
  fmt::format_to(o, "  a step needs its reserved peak and the cuBLAS workspaces torch 2.11 keeps on that GPU (two "
                    "cuBLAS and one cuBLASLt: {} on compute capability 9.x, {} elsewhere)\n",
                 format_mib(GpuSpec{.compute_capability = "9.0"}.library_workspace_bytes()),
                 format_mib(GpuSpec{.compute_capability = "8.0"}.library_workspace_bytes()));
  fmt::format_to(o, "  and its CUDA reductions' staging sized for that GPU's multiprocessors (fixtures/gpus: a T4's "
                    "40 x 1,024 threads stage less than an H100's 132 x 2,048)\n");
  if (any_unmeasured) {
    fmt::format_to(o, "  * never measured by memgate: its memory is NVIDIA's figure and what lives outside the "
                      "allocator a planning allowance (fixtures/gpus)\n");
  }
  fmt::format_to(o, "  searched with {} estimates in {:.1f} s\n", fits.estimates, fits.seconds);
  return out;
}

nlohmann::json estimated_fits_to_json(const EstimatedFits& fits) {
  auto list = nlohmann::json::array();
  for (const auto& f : fits.fits) {
    const auto ws = f.target.library_workspace_bytes;
    nlohmann::json entry = {{"gpu", f.target.id}, {"usable_bytes", f.target.usable_bytes},
                            {"largest_batch", f.largest}, {"step_peak_reserved", f.required_bytes - ws},
                            {"library_workspace_bytes", ws}, {"required_bytes", f.required_bytes},
                            {"next_step_peak_reserved", f.next_required_bytes > 0 ? f.next_required_bytes - ws : 0},
                            {"estimated", true}, {"gpu_measured", f.target.measured},
                            {"search_capped", f.capped}, {"world_size", fits.world_size}};
    if (!f.next_cannot_run.empty()) entry["next_cannot_run"] = f.next_cannot_run;
    if (f.micro_batch > 0) {
      entry["micro_batch"] = f.micro_batch;
      entry["accumulation_steps"] = f.accumulation_steps;
    }
    list.push_back(std::move(entry));
  }
  return list;
}

}  // namespace memgate
