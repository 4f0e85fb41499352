// A training setup (optimizer, what trains, precision, checkpointing, accumulation) and its optimizer.
#pragma once

#include "memgate/base/enum_names.h"
#include "memgate/models/autocast.h"
#include "memgate/models/model.h"

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace memgate {

/// The optimizers a training setup can name.
enum class Optimizer {
  kAdamW,  ///< torch.optim.AdamW: two state tensors per trainable parameter
  kSgd,    ///< torch.optim.SGD: one momentum buffer per trainable parameter when momentum > 0
};

/// The words of Optimizer.
inline constexpr EnumNames<Optimizer, 2> kOptimizerNames{{{Optimizer::kAdamW, "adamw"}, {Optimizer::kSgd, "sgd"}}};

/// How a model trains.
struct TrainingSpec {
  Optimizer optimizer = Optimizer::kAdamW;  ///< adamw | sgd
  double lr = 1e-4;                 ///< learning rate
  double weight_decay = 0.0;        ///< decoupled (AdamW) or L2 (SGD)
  double momentum = 0.0;            ///< SGD momentum; > 0 keeps one buffer per parameter
  TrainableSpec trainable;          ///< all | lora | head | last_blocks:N
  Precision precision = Precision::kFp32;  ///< autocast dtype
  bool gradient_checkpointing = false;     ///< recompute each block in backward
  std::int64_t accumulation_steps = 1;     ///< micro-batches per optimizer step
  bool deterministic = false;              ///< deterministic algorithms (torch.use_deterministic_algorithms)
  std::string allocator;            ///< CUDA allocator settings, e.g. expandable_segments:True
};

/// The training setup's optimizer (adamw | sgd with optional momentum) over `params`.
[[nodiscard]] std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainingSpec& training,
                                                                      std::vector<torch::Tensor> params);

}  // namespace memgate
