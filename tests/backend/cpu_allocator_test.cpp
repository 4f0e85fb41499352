// The counting CPU allocator counts exactly what LibTorch's CPU tensors hold.
#include "memgate/backend/cpu_allocator.h"
#include "memgate/backend/module_attribution.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace memgate {
namespace {

class CpuAllocatorTest : public ::testing::Test {
 protected:
  CountingCpuAllocator& counter = CountingCpuAllocator::install();
};

TEST_F(CpuAllocatorTest, IsLibTorchsCpuAllocator) { EXPECT_EQ(c10::GetCPUAllocator(), &counter); }

TEST_F(CpuAllocatorTest, CountsCurrentBytesOfTensorsExactly) {
  const auto before = counter.current_bytes();
  {
    auto a = torch::ones({1000}, torch::kFloat32);
    EXPECT_EQ(counter.current_bytes() - before, 4000);
    auto b = torch::zeros({10, 10}, torch::kFloat64);
    EXPECT_EQ(counter.current_bytes() - before, 4800);
  }
  EXPECT_EQ(counter.current_bytes(), before);
}

TEST_F(CpuAllocatorTest, TracksThePeakUntilReset) {
  const auto before = counter.current_bytes();
  counter.reset_peak();
  {
    auto a = torch::empty({256}, torch::kFloat32);
    auto b = torch::empty({512}, torch::kFloat32);
  }
  EXPECT_EQ(counter.peak_bytes() - before, 3072);
  auto c = torch::empty({128}, torch::kFloat32);
  counter.reset_peak();
  EXPECT_EQ(counter.peak_bytes() - before, 512);
}

TEST_F(CpuAllocatorTest, CountsTheTemporariesOfAnOperation) {
  auto x = torch::ones({1024}, torch::kFloat32);
  const auto before = counter.current_bytes();
  counter.reset_peak();
  auto y = torch::exp(torch::neg(x));  // the temporary neg(x) (4096 B) lives until exp (4096 B) is made
  EXPECT_EQ(counter.peak_bytes() - before, 8192);
  EXPECT_EQ(counter.current_bytes() - before, 4096);
}

TEST_F(CpuAllocatorTest, RawAllocateKeepsPointerAndContextTogether) {
  const auto before = counter.current_bytes();
  void* p = counter.raw_allocate(100);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(counter.current_bytes() - before, 100);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0U);
  counter.raw_deallocate(p);
  EXPECT_EQ(counter.current_bytes(), before);
}

TEST_F(CpuAllocatorTest, LimitRaisesOutOfMemoryAndKeepsCounting) {
  const auto before = counter.current_bytes();
  counter.set_limit(before + 1000);
  EXPECT_THROW((void)torch::empty({1000}, torch::kFloat32), c10::OutOfMemoryError);
  counter.set_limit(0);
  EXPECT_EQ(counter.current_bytes(), before);
  auto ok = torch::empty({1000}, torch::kFloat32);
  EXPECT_EQ(counter.current_bytes() - before, 4000);
}

// An allocation the machine cannot satisfy is out of memory too, and is not counted.
TEST_F(CpuAllocatorTest, AnAllocationTheMachineRefusesIsOutOfMemoryAndNotCounted) {
  const auto before = counter.current_bytes();
  const auto peak = counter.peak_bytes();
  EXPECT_THROW((void)torch::empty({std::int64_t{1} << 60}, torch::kUInt8), c10::OutOfMemoryError);
  EXPECT_EQ(counter.current_bytes(), before);
  EXPECT_EQ(counter.peak_bytes(), peak) << "a failed allocation must not raise the peak";
}

// Each block is the innermost entered module's, else the phase's; since() splits the bytes alive now and
// peak_since() those at the highest total, each summing to what the allocator counted.
TEST_F(CpuAllocatorTest, AttributionSplitsBytesByTheModuleThatMadeThem) {
  ModuleAttribution attribution(torch::kCPU);
  attribution.set_phase("outside");
  const auto from = attribution.mark();
  attribution.reset_peak(ModuleAttribution::kPart);
  const auto before = counter.current_bytes();
  counter.reset_peak();
  enter_module("a");
  auto x = torch::empty({256});  // 1,024 bytes in a
  enter_module("a.b");
  auto y = torch::empty({512});  // 2,048 bytes in a.b
  exit_module();
  { auto t = torch::empty({1024}); }  // 4,096 bytes in a, freed: the peak
  exit_module();
  auto z = torch::empty({16});  // 64 bytes outside any module
  EXPECT_EQ(attribution.since(from), (ModuleBytes{{"a", 1024}, {"a.b", 2048}, {"(outside)", 64}}));
  EXPECT_EQ(counter.current_bytes() - before, 1024 + 2048 + 64);
  EXPECT_EQ(attribution.peak_since(ModuleAttribution::kPart, from), (ModuleBytes{{"a", 5120}, {"a.b", 2048}}));
  EXPECT_EQ(counter.peak_bytes() - before, 5120 + 2048);
  EXPECT_TRUE(attribution.saw_modules());
  // Freed, a module's bytes leave its split.
  x.reset();
  EXPECT_EQ(attribution.since(from), (ModuleBytes{{"a.b", 2048}, {"(outside)", 64}}));
  // Off the CPU nothing is attributed.
  ModuleAttribution meta(torch::kMeta);
  EXPECT_TRUE(meta.since(meta.mark()).empty());
  EXPECT_FALSE(meta.saw_modules());
}

}  // namespace
}  // namespace memgate
