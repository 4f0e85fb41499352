// The CPU's mm and addmm outside oneDNN (addmm_impl_cpu_) clone an operand BLAS cannot read as it lies: the estimate's
// Meta kernels allocate what the CPU allocates, operand layout by operand layout.
#include "memgate/backend/cpu_allocator.h"
#include "memgate/backend/meta_allocator.h"
#include "memgate/estimate/meta_kernels.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace memgate {
namespace {

// An operand of `sizes` laid out as `layout` says, on `device`: contiguous, transposed (a column-major view), expanded
// from one element (strides 0, as the gradient of a sum), expanded from one row, or every second column of a wider one.
torch::Tensor operand(const std::string& layout, std::int64_t rows, std::int64_t cols, torch::Device device) {
  const auto opts = torch::TensorOptions().device(device);
  if (layout == "contiguous") return torch::ones({rows, cols}, opts);
  if (layout == "transposed") return torch::ones({cols, rows}, opts).t();
  if (layout == "expanded") return torch::ones({1, 1}, opts).expand({rows, cols});
  if (layout == "row_expanded") return torch::ones({1, cols}, opts).expand({rows, cols});
  return torch::ones({rows, 2 * cols}, opts).slice(1, 0, 2 * cols, 2);  // every second column
}

struct Bytes {
  std::int64_t above = 0;   ///< the op's peak above the level before it, output included
  std::int64_t kept = 0;    ///< what stays: the output
};

Bytes cpu_bytes(const std::function<torch::Tensor()>& op) {
  auto& cpu = CountingCpuAllocator::install();
  const auto before = cpu.current_bytes();
  cpu.reset_peak();
  const auto out = op();
  return {cpu.peak_bytes() - before, cpu.current_bytes() - before};
}

Bytes meta_bytes(const std::function<torch::Tensor()>& op) {
  auto& meta = CountingMetaAllocator::install();
  meta.set_granularity(0);
  const auto before = meta.current_bytes();
  meta.reset_peak();
  const auto out = op();
  return {meta.peak_bytes() - before, meta.current_bytes() - before};
}

// mm and addmm over every pair of operand layouts, with shapes whose output has one column or one row too (which
// decides which operand BLAS reads as which): the estimate's peak and what it keeps equal the CPU's. Before, the
// estimate took the output alone: an expanded operand (the output gradient of a loss that is a sum, in the last
// layer's backward) was a clone short, a TorchScript LM under DDP with bucket views 2,048 B low in step_peak.
TEST(MetaMatmulTest, ClonesTheOperandsTheCpusGemmCannotReadAsTheyLie) {
  register_meta_kernels();  // for the CPU: no estimate context is set
  const std::vector<std::string> layouts{"contiguous", "transposed", "expanded", "row_expanded", "strided"};
  struct Shape {
    std::int64_t m, k, n;
  };
  at::globalContext().setUserEnabledMkldnn(false);  // the portable kernels, as memgate's probes run
  for (const auto& [m, k, n] : {Shape{6, 5, 7}, Shape{6, 5, 1}, Shape{1, 5, 7}, Shape{16, 32, 64}}) {
    for (const auto& l1 : layouts) {
      for (const auto& l2 : layouts) {
        for (const bool with_bias : {false, true}) {
          const auto run = [&, m = m, k = k, n = n](torch::Device device) {
            return [&, m, k, n, device] {
              const auto a = operand(l1, m, k, device);
              const auto b = operand(l2, k, n, device);
              if (!with_bias) return torch::mm(a, b);
              return torch::addmm(torch::ones({n}, torch::TensorOptions().device(device)), a, b);
            };
          };
          const auto at = fmt::format("{} [{}x{}] x {} [{}x{}]{}", l1, m, k, l2, k, n, with_bias ? " + bias" : "");
          const auto c = cpu_bytes(run(torch::kCPU));
          const auto e = meta_bytes(run(torch::kMeta));
          EXPECT_EQ(e.above, c.above) << at;
          EXPECT_EQ(e.kept, c.kept) << at;
        }
      }
    }
  }
  // And the case of the LM's backward: an expanded [16 x 64] gradient times a weight is cloned whole (4,096 B) while
  // the product is made: above the operands (4 B and 8 KiB), the output (4 KiB) and the clone.
  const auto c = cpu_bytes([] { return torch::mm(operand("expanded", 16, 64, torch::kCPU), torch::ones({64, 32})); });
  EXPECT_EQ(c.above, 4 + 64 * 32 * 4 + 16 * 32 * 4 + 16 * 64 * 4);
}

}  // namespace
}  // namespace memgate
