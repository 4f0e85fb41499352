// Block checkpointing: a custom autograd Function that keeps the block's input and recomputes it in backward.
#include "memgate/models/checkpoint.h"

#include "memgate/models/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/autograd.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

namespace memgate {
namespace {

// Keeps the block's forward alive in the autograd context until backward has run.
struct BlockHolder : torch::CustomClassHolder {
  explicit BlockHolder(BlockFn f) : fn(std::move(f)) {}
  BlockFn fn;
};

// Forward runs the block with grad off (nothing is kept but the input); backward recomputes it with grad on,
// in the autocast state of the forward, and back-propagates into the block's parameters and the input.
struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                                                torch::Tensor /*anchor*/, c10::intrusive_ptr<BlockHolder> holder) {
    for (auto type : {torch::kCPU, torch::kCUDA}) {
      const bool on = at::autocast::is_autocast_enabled(type);
      ctx->saved_data[type == torch::kCPU ? "cpu_autocast" : "cuda_autocast"] = on;
      ctx->saved_data[type == torch::kCPU ? "cpu_dtype" : "cuda_dtype"] =
          static_cast<int64_t>(at::autocast::get_autocast_dtype(type));
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
      for (auto type : {torch::kCPU, torch::kCUDA}) {
        const char* on = type == torch::kCPU ? "cpu_autocast" : "cuda_autocast";
        const char* dt = type == torch::kCPU ? "cpu_dtype" : "cuda_dtype";
        if (ctx->saved_data[on].toBool()) {
          const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data[dt].toInt());
          scopes.push_back(std::make_unique<AutocastScope>(
              type, dtype == torch::kHalf ? Precision::kFp16 : Precision::kBf16));
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

namespace {
thread_local BlockHook* t_block_hook = nullptr;
}  // namespace

BlockHook* block_hook() { return t_block_hook; }

BlockHookScope::BlockHookScope(BlockHook* hook) : previous_(t_block_hook) { t_block_hook = hook; }

BlockHookScope::~BlockHookScope() { t_block_hook = previous_; }

}  // namespace memgate
