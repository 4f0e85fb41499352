// Block checkpointing: a custom autograd Function that keeps the block's input and recomputes it in backward.
#include "memgate/models/checkpoint.h"

#include "memgate/models/autocast.h"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>
#include <torch/torch.h>

#include <array>
#include <memory>
#include <vector>

namespace memgate {
namespace {

// Keeps the block's forward alive in the autograd context until backward has run.
struct BlockHolder : torch::CustomClassHolder {
  explicit BlockHolder(BlockFn f) : fn(std::move(f)) {}
  BlockFn fn;
};

// The autocast states a recompute restores: the CPU's, CUDA's, and an estimate's on the Meta device (PrivateUse1's);
// without the last, an estimate recomputed a checkpointed bf16 block uncast and failed ("expected m1 and m2 to have
// the same dtype").
constexpr std::array<torch::DeviceType, 3> kAutocastTypes{torch::kCPU, torch::kCUDA, torch::kPrivateUse1};

const char* autocast_key(torch::DeviceType type) {
  return type == torch::kCPU ? "cpu_autocast" : type == torch::kCUDA ? "cuda_autocast" : "meta_autocast";
}

const char* dtype_key(torch::DeviceType type) {
  return type == torch::kCPU ? "cpu_dtype" : type == torch::kCUDA ? "cuda_dtype" : "meta_dtype";
}

// Forward runs the block with grad off (nothing is kept but the input); backward recomputes it with grad on,
// in the autocast state of the forward, and back-propagates into the block's parameters and the input.
struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                                                torch::Tensor /*anchor*/, c10::intrusive_ptr<BlockHolder> holder) {
    for (auto type : kAutocastTypes) {
      // An estimate's autocast on the Meta device is PrivateUse1's, with its key included on this thread
      // (AutocastScope): a real PrivateUse1 backend's autocast is not one memgate runs.
      const bool on = at::autocast::is_autocast_enabled(type) &&
                      (type != torch::kPrivateUse1 ||
                       c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::AutocastPrivateUse1));
      ctx->saved_data[autocast_key(type)] = on;
      ctx->saved_data[dtype_key(type)] = static_cast<int64_t>(at::autocast::get_autocast_dtype(type));
    }
    ctx->saved_data["fn"] = c10::IValue::make_capsule(holder);
    ctx->save_for_backward({x});
    torch::NoGradGuard no_grad;
    return {holder->fn(x)};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    auto holder = c10::static_intrusive_pointer_cast<BlockHolder>(ctx->saved_data["fn"].toCapsule());
    auto input = saved[0].detach().requires_grad_(saved[0].requires_grad());
    torch::Tensor output;
    {
      torch::AutoGradMode grad_on(true);
      std::vector<std::unique_ptr<AutocastScope>> scopes;
      for (auto type : kAutocastTypes) {
        if (ctx->saved_data[autocast_key(type)].toBool()) {
          const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data[dtype_key(type)].toInt());
          // The Meta device's scope is PrivateUse1's with the key included (AutocastScope maps it).
          scopes.push_back(std::make_unique<AutocastScope>(type == torch::kPrivateUse1 ? torch::kMeta : type,
                                                           dtype == torch::kHalf ? Precision::kFp16 : Precision::kBf16));
        }
      }
      output = holder->fn(input);
    }
    if (output.requires_grad()) {
      torch::autograd::backward({output}, {grad_outputs[0]});
    }
    torch::Tensor grad_input = input.requires_grad() ? input.grad() : torch::Tensor();
    return {grad_input, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor checkpoint(BlockFn fn, const torch::Tensor& x) {
  if (!torch::GradMode::is_enabled()) return fn(x);
  auto holder = c10::make_intrusive<BlockHolder>(std::move(fn));
  // An empty tensor that requires grad makes the output require grad even when `x` does not (a frozen stem
  // before trainable blocks), so backward still reaches the blocks' parameters. It allocates nothing.
  auto anchor = torch::empty({0}, torch::TensorOptions().device(x.device()).requires_grad(true));
  return CheckpointFunction::apply(x, anchor, holder)[0];
}

bool CheckpointSelection::covers(const std::string& prefix) const {
  if (all_) return true;
  for (const auto& p : prefixes_) {
    if (p == prefix) return true;
  }
  return false;
}

CheckpointSelection CheckpointSelection::within(const std::string& prefix) const {
  if (all_ || prefixes_.empty()) return CheckpointSelection(all_);
  std::vector<std::string> inner;
  for (const auto& p : prefixes_) {
    if (p.size() > prefix.size() && p.compare(0, prefix.size(), prefix) == 0) inner.push_back(p.substr(prefix.size()));
  }
  return CheckpointSelection(std::move(inner));
}

namespace {
thread_local BlockHook* t_block_hook = nullptr;
}  // namespace

BlockHook* block_hook() { return t_block_hook; }

BlockHookScope::BlockHookScope(BlockHook* hook) : previous_(t_block_hook) { t_block_hook = hook; }

BlockHookScope::~BlockHookScope() { t_block_hook = previous_; }

}  // namespace memgate
