// Device names, slugs and resolution.
#include "memgate/measure/device.h"
#include "memgate/base/error.h"

#include <gtest/gtest.h>

namespace memgate {
namespace {

TEST(DeviceTest, SlugsAreLowerCaseWithDashes) {
  EXPECT_EQ(slugify("NVIDIA H100 80GB HBM3"), "nvidia-h100-80gb-hbm3");
  EXPECT_EQ(slugify("NVIDIA GeForce RTX 4090"), "nvidia-geforce-rtx-4090");
  EXPECT_EQ(slugify("  Tesla T4 (PCIe) "), "tesla-t4-pcie");
  EXPECT_EQ(slugify(""), "unknown");
}

TEST(DeviceTest, ResolvesCpuAndAuto) {
  EXPECT_TRUE(resolve_device("cpu").is_cpu());
  EXPECT_EQ(resolve_device("auto").is_cuda(), cuda_available());
}

TEST(DeviceTest, RejectsADeviceThatIsNotThere) {
  try {
    (void)resolve_device("cuda:7");
    FAIL() << "cuda:7 resolved";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no such CUDA device"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)resolve_device("gpu"), Error);
  EXPECT_THROW((void)resolve_device("cuda:x"), Error);
}

TEST(DeviceTest, DescribesTheCpuWithVersions) {
  const auto info = describe_device(resolve_device("cpu"));
  EXPECT_EQ(info.slug, "cpu");
  EXPECT_FALSE(info.name.empty());
  EXPECT_EQ(info.torch_version.rfind("2.11", 0), 0U) << info.torch_version;
}

}  // namespace
}  // namespace memgate
