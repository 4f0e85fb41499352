// A dispatch-level FLOP counter for a step on the Meta device (plan/flops.h): an at::RecordFunction callback that
// sees every op the dispatcher runs, forward and backward, with its tensors' shapes.
#include "memgate/plan/flops.h"

#include "memgate/base/error.h"
#include "memgate/launch/estimate.h"
#include "memgate/launch/ranks.h"
#include "memgate/models/checkpoint.h"
#include "memgate/models/zoo.h"

#include <ATen/record_function.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

namespace memgate {
namespace {

// What the callback adds to while a count runs; one count at a time (count_step_flops holds the lock).
std::mutex g_count_mutex;
std::atomic<bool> g_counting{false};
std::atomic<std::int64_t> g_flops{0};
std::atomic<std::int64_t> g_attention_flops{0};  // of g_flops, the attention forwards
thread_local int t_counted_depth = 0;

std::optional<std::vector<std::int64_t>> sizes_of(const c10::IValue& v) {
  if (!v.isTensor()) return std::nullopt;
  const auto& t = v.toTensor();
  if (!t.defined()) return std::nullopt;
  return t.sizes().vec();
}

std::int64_t product(const std::vector<std::int64_t>& v, std::size_t from = 0) {
  std::int64_t p = 1;
  for (std::size_t i = from; i < v.size(); ++i) p *= v[i];
  return p;
}

// 2 x output elements x the MACs per element: torch.utils.flop_counter's conv_flop_count (batch x spatial output x
// kernel x c_out x c_in/groups x 2; for a transposed convolution, the input's spatial size).
std::int64_t conv_flops(const std::vector<std::int64_t>& x, const std::vector<std::int64_t>& w,
                        const std::vector<std::int64_t>& out, bool transposed) {
  if (x.size() < 3 || w.size() < 3 || out.size() < 3) return 0;
  const auto spatial = transposed ? product(x, 2) : product(out, 2);
  return 2 * x[0] * spatial * product(w, 2) * w[0] * w[1];
}

// SDPA's forward, its two matmuls: q [B, H, L, E], k [B, H, S, E], v [B, H, S, Ev] (transposed: [B, L, H, E]).
std::int64_t sdpa_flops(const std::vector<std::int64_t>& q, const std::vector<std::int64_t>& k,
                        const std::vector<std::int64_t>& v, bool heads_second) {
  if (q.size() != 4 || k.size() != 4 || v.size() != 4) return 0;
  const auto L = heads_second ? q[2] : q[1], S = heads_second ? k[2] : k[1];
  const auto bh = q[0] * (heads_second ? q[1] : q[2]);
  return 2 * bh * L * S * q[3] + 2 * bh * L * S * v[3];
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// The FLOPs of one op, or nullopt for an op the counter does not count (its inner ops may be).
std::optional<std::int64_t> op_flops(const at::RecordFunction& fn) {
  const std::string_view name = fn.name();
  if (!starts_with(name, "aten::")) return std::nullopt;
  const auto op = name.substr(6);
  const auto in = fn.inputs();
  const auto arg = [&](std::size_t i) { return i < in.size() ? sizes_of(in[i]) : std::nullopt; };
  if (op == "mm" || op == "addmm") {
    const auto a = arg(op == "mm" ? 0 : 1), b = arg(op == "mm" ? 1 : 2);
    if (!a || !b || a->size() != 2 || b->size() != 2) return 0;
    return 2 * (*a)[0] * (*a)[1] * (*b)[1];
  }
  if (op == "bmm" || op == "baddbmm") {
    const auto a = arg(op == "bmm" ? 0 : 1), b = arg(op == "bmm" ? 1 : 2);
    if (!a || !b || a->size() != 3 || b->size() != 3) return 0;
    return 2 * (*a)[0] * (*a)[1] * (*a)[2] * (*b)[2];
  }
  if (op == "convolution") {
    // (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups): the output's spatial
    // size from the input's, as the convolution computes it (a transposed one counts the input's).
    const auto x = arg(0), w = arg(1);
    if (!x || !w || in.size() < 7 || x->size() < 3) return 0;
    const bool transposed = in[6].isBool() && in[6].toBool();
    const auto ints = [&](std::size_t i) {
      return in[i].isIntList() ? in[i].toIntVector() : std::vector<std::int64_t>{};
    };
    const auto stride = ints(3), padding = ints(4), dilation = ints(5);
    auto out = *x;
    if (!transposed) {
      for (std::size_t d = 2; d < x->size(); ++d) {
        const auto at = [&](const std::vector<std::int64_t>& v, std::int64_t fallback) {
          return v.empty() ? fallback : v[std::min(d - 2, v.size() - 1)];
        };
        out[d] = ((*x)[d] + 2 * at(padding, 0) - at(dilation, 1) * ((*w)[d] - 1) - 1) / at(stride, 1) + 1;
      }
    }
    return conv_flops(*x, *w, out, transposed);
  }
  if (op == "convolution_backward") {
    // (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
    // output_mask): the forward's FLOPs once for the input's gradient and once for the weight's.
    const auto g = arg(0), x = arg(1), w = arg(2);
    if (!g || !x || !w || in.size() < 11) return 0;
    const bool transposed = in[7].isBool() && in[7].toBool();
    std::int64_t grads = 0;
    if (in[10].isBoolList()) {
      const auto mask = in[10].toBoolList();
      for (std::size_t i = 0; i < 2 && i < mask.size(); ++i) grads += mask.get(i) ? 1 : 0;
    }
    return grads * conv_flops(*x, *w, *g, transposed);
  }
  if (op == "scaled_dot_product_attention") {
    const auto q = arg(0), k = arg(1), v = arg(2);
    return q && k && v ? sdpa_flops(*q, *k, *v, true) : 0;
  }
  if (op.find("attention") != std::string_view::npos && op.find("backward") != std::string_view::npos) {
    // (grad_out, query, key, value, ...): five matmuls, 2.5 x the forward's two (torch's sdpa_backward_flop_count).
    // _efficient_attention_backward and _flash_attention_backward take [B, L, H, E]; the others [B, H, L, E].
    const bool heads_second = !(op == "_efficient_attention_backward" || op == "_flash_attention_backward");
    const auto q = arg(1), k = arg(2), v = arg(3);
    return q && k && v ? sdpa_flops(*q, *k, *v, heads_second) * 5 / 2 : 0;
  }
  if (starts_with(op, "_scaled_dot_product") || op == "_efficient_attention_forward" ||
      op == "_flash_attention_forward") {
    // SDPA's kernels, when the public op did not run around them.
    const bool heads_second = !(op == "_efficient_attention_forward" || op == "_flash_attention_forward");
    const auto q = arg(0), k = arg(1), v = arg(2);
    return q && k && v ? sdpa_flops(*q, *k, *v, heads_second) : 0;
  }
  return std::nullopt;
}

struct Counted : at::ObserverContext {};

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (!g_counting.load(std::memory_order_relaxed)) return nullptr;
  const auto flops = op_flops(fn);
  if (!flops) return nullptr;
  // An op inside a counted one (the math attention's bmm, a composite's mm) is the outer op's.
  if (t_counted_depth++ == 0) {
    g_flops += *flops;
    const std::string_view name = fn.name();
    if (name.find("attention") != std::string_view::npos && name.find("backward") == std::string_view::npos) {
      g_attention_flops += *flops;
    }
  }
  return std::make_unique<Counted>();
}

void on_end(const at::RecordFunction&, at::ObserverContext* ctx) {
  if (ctx != nullptr) --t_counted_depth;
}

// Each block's forward FLOPs, in the order the blocks run, while `active`.
class BlockFlops final : public BlockHook {
 public:
  bool active = false;
  std::vector<std::int64_t> per_block;
  std::vector<std::int64_t> per_block_attention;
  torch::Tensor run(const torch::nn::Module&, const torch::Tensor& x, const BlockFn& forward) override {
    if (!active) return forward(x);
    const auto before = g_flops.load(), attention_before = g_attention_flops.load();
    auto out = forward(x);
    per_block.push_back(g_flops.load() - before);
    per_block_attention.push_back(g_attention_flops.load() - attention_before);
    return out;
  }
};

}  // namespace

StepFlops count_step_flops(const Workload& workload, std::int64_t batch_size, EstimateTarget target,
                           const PythonRuntime* python) {
  auto w = workload;
  w.training.gradient_checkpointing = false;
  w.training.checkpoint_blocks.clear();
  w.training.accumulation_steps = 1;
  const std::lock_guard lock(g_count_mutex);
  const bool blocks_here = !runs_in_python(w, python) && !w.training.distributed.enabled();
  BlockFlops blocks;
  const BlockHookScope hook(blocks_here ? &blocks : nullptr);
  StepFlops out;
  std::int64_t forward_end = -1;
  ProbeOptions options;
  options.python = python;
  options.on_phase = [&](std::string_view phase) {
    const bool forward = phase == "measured step: forward";
    const bool counting = forward || phase == "measured step: backward";
    blocks.active = forward;
    if (!forward && forward_end < 0 && g_counting) forward_end = g_flops.load();
    g_counting = counting;
  };
  g_flops = 0;
  g_attention_flops = 0;
  const auto handle = at::addGlobalCallback(
      at::RecordFunctionCallback(on_start, on_end).needsInputs(true).scopes(
          {at::RecordScope::FUNCTION}));
  try {
    (void)estimate_probe(w, batch_size, target, options);
  } catch (...) {
    g_counting = false;
    at::removeCallback(handle);
    throw;
  }
  g_counting = false;
  at::removeCallback(handle);
  out.step = g_flops.load();
  out.forward = forward_end < 0 ? out.step : forward_end;
  if (blocks_here) {
    out.per_block = std::move(blocks.per_block);
    out.per_block_attention = std::move(blocks.per_block_attention);
  }
  return out;
}

CheckpointFlops count_checkpoint_flops(const Workload& workload, std::span<const std::int64_t> batch_sizes,
                                       EstimateTarget target, const PythonRuntime* python) {
  CheckpointFlops out;
  if (runs_in_python(workload, python)) {
    nlohmann::json request = {{"batch_sizes", std::vector<std::int64_t>(batch_sizes.begin(), batch_sizes.end())},
                              {"target", target == EstimateTarget::kCpu ? "cpu" : "cuda"}};
    const auto answer = nlohmann::json::parse(run_python_flops(workload, request.dump()));
    out.blocks = answer.at("blocks").get<std::vector<std::string>>();
    for (const auto& f : answer.at("flops")) {
      out.flops.push_back({.step = f.at("step").get<std::int64_t>(), .forward = f.at("forward").get<std::int64_t>(),
                           .per_block = f.at("per_block").get<std::vector<std::int64_t>>(),
                           .per_block_attention = f.at("per_block_attention").get<std::vector<std::int64_t>>()});
    }
    if (out.flops.size() != batch_sizes.size()) {
      throw Error(fmt::format("{}: the Python process counted the FLOPs of {} batch sizes of {}", workload.source,
                              out.flops.size(), batch_sizes.size()));
    }
    return out;
  }
  if (workload.model.arch != Arch::kTorchScript) {
    out.blocks = build_model(workload.model, c10::Device(c10::DeviceType::Meta), 0, python)->checkpoint_prefixes();
    for (auto& b : out.blocks) b.pop_back();  // "blocks.3." -> "blocks.3", as the fixture names it
  }
  for (const auto b : batch_sizes) out.flops.push_back(count_step_flops(workload, b, target, python));
  return out;
}

std::string count_checkpoint_flops_here(const Workload& workload, const std::string& request,
                                        const PythonRuntime* python) {
  const auto j = nlohmann::json::parse(request);
  const auto sizes = j.at("batch_sizes").get<std::vector<std::int64_t>>();
  const auto target = j.at("target").get<std::string>() == "cpu" ? EstimateTarget::kCpu : EstimateTarget::kCuda;
  const auto counted = count_checkpoint_flops(workload, sizes, target, python);
  nlohmann::json answer = {{"memgate_version", MEMGATE_VERSION}, {"blocks", counted.blocks},
                           {"flops", nlohmann::json::array()}};
  for (const auto& f : counted.flops) {
    answer["flops"].push_back({{"step", f.step}, {"forward", f.forward}, {"per_block", f.per_block},
                               {"per_block_attention", f.per_block_attention}});
  }
  return answer.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace memgate
