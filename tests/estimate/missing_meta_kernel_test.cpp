// An op that nothing runs on the Meta device (issue 59) is an estimate's error naming the op: LibTorch's dispatcher
// says so in C++ (a zoo or TorchScript fixture's estimate, where torch's Python Meta kernels are not there), torch's
// Python fallback in a Python fixture's process, and torch.library.custom_op without a fake kernel.
#include "memgate/estimate/meta_kernels.h"

#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <optional>
#include <string>

namespace memgate {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// unique_consecutive has a CPU kernel and no Meta kernel in LibTorch's C++ or memgate's (its output's size is its data's):
// the estimate meets the dispatcher's error, which names the op.
TEST(MissingMetaKernelTest, LibTorchsErrorForAnOpWithoutAMetaKernelNamesTheOp) {
  register_meta_kernels();  // for the CPU: no estimate context is set
  const auto x = torch::empty({2, 3}, torch::TensorOptions().device(torch::kMeta));
  std::string message;
  try {
    (void)torch::unique_consecutive(x);
  } catch (const c10::Error& e) {
    message = e.what_without_backtrace();
  }
  ASSERT_FALSE(message.empty()) << "unique_consecutive ran on Meta in LibTorch's C++: pick another op without a Meta "
                                   "kernel";
  EXPECT_EQ(op_without_meta_kernel(message), std::optional<std::string>("aten::unique_consecutive")) << message;
  const auto described = describe_missing_meta_kernel(message, /*in_python=*/false);
  ASSERT_TRUE(described.has_value());
  EXPECT_THAT(*described,
              HasSubstr("the op aten::unique_consecutive has no Meta kernel (not LibTorch's or memgate's"));
  EXPECT_THAT(*described, HasSubstr("measure the fixture instead"));
  EXPECT_THAT(*described, Not(HasSubstr("called in")));
}

// torch's Python messages, as a Python fixture's probe reads them (the first line of the Python error).
TEST(MissingMetaKernelTest, TorchsPythonErrorsNameTheOpAndTheModuleIsAdded) {
  EXPECT_EQ(op_without_meta_kernel("NotImplementedError: memgate_test::twice: attempted to run this operator with "
                                   "Meta tensors, but there was no fake impl or Meta kernel registered. You may have "
                                   "run into this message while using an operator with PT2 compilation APIs"),
            std::optional<std::string>("memgate_test::twice"));
  EXPECT_EQ(op_without_meta_kernel("RuntimeError: There was no fake impl registered for <CustomOpDef(mylib::fused)>. "
                                   "This is necessary for torch.compile/export/fx tracing to work."),
            std::optional<std::string>("mylib::fused"));
  const auto described = describe_missing_meta_kernel(
      "memgate_test::twice: attempted to run this operator with Meta tensors, but there was no fake impl",
      /*in_python=*/true, "'block.1' (Inner)");
  ASSERT_TRUE(described.has_value());
  EXPECT_THAT(*described, HasSubstr("the op memgate_test::twice has no Meta kernel (not LibTorch's, memgate's or "
                                    "torch's Python one), called in the forward of 'block.1' (Inner)"));
}

TEST(MissingMetaKernelTest, OtherErrorsAreNotAboutAMissingKernel) {
  EXPECT_EQ(op_without_meta_kernel("ValueError: no such variant: vit_huge"), std::nullopt);
  EXPECT_EQ(op_without_meta_kernel("mat1 and mat2 shapes cannot be multiplied (2x4 and 3x4)"), std::nullopt);
  EXPECT_EQ(describe_missing_meta_kernel("CUDA out of memory", false), std::nullopt);
}

}  // namespace
}  // namespace memgate
