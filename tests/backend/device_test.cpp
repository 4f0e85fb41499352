// Device names, slugs and resolution.
#include "memgate/backend/device.h"
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

namespace memgate {
namespace {

std::string assignment_error(std::string_view resource, std::string_view visible, int count) {
  try {
    (void)assigned_gpu(resource, visible, count);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(GpuAssignmentTest, ACTestIdNamesThePhysicalGpu) {
  EXPECT_EQ(assigned_gpu("id:0,slots:1", "", 4), 0);
  EXPECT_EQ(assigned_gpu("id:3,slots:1", "", 4), 3);
  EXPECT_EQ(assigned_gpu("id:2", "", 4), 2);
  // With CUDA_VISIBLE_DEVICES, CUDA numbers the listed GPUs from 0: physical GPU 3 is ordinal 1 of "2,3".
  EXPECT_EQ(assigned_gpu("id:3,slots:1", "2,3", 2), 1);
  EXPECT_EQ(assigned_gpu("id:2,slots:1", "2,3", 2), 0);
  EXPECT_EQ(assigned_gpu("id:5,slots:1", "5", 1), 0);
}

TEST(GpuAssignmentTest, NoAssignmentIsTheOnlyGpuOrARefusal) {
  EXPECT_EQ(assigned_gpu("", "", 1), 0);
  EXPECT_NE(assignment_error("", "", 2).find("2 GPUs are visible and CTest assigned none"), std::string::npos);
  EXPECT_NE(assignment_error("", "", 0).find("no CUDA device"), std::string::npos);
}

TEST(GpuAssignmentTest, WhatCannotBeMappedIsAnErrorNamingTheVariable) {
  EXPECT_NE(assignment_error("id:1,slots:1", "0,2", 2).find("CTest assigned GPU 1, which CUDA_VISIBLE_DEVICES=\"0,2\" hides"),
            std::string::npos);
  EXPECT_NE(assignment_error("id:1,slots:1", "GPU-8f1c2a", 1).find("UUIDs and MIG instances cannot be mapped"),
            std::string::npos);
  EXPECT_NE(assignment_error("id:4,slots:1", "", 2).find("this process sees 2 CUDA device(s)"), std::string::npos);
  for (const auto* bad : {"id:x,slots:1", "slots:1", "id:-1,slots:1", "id:0,slots:1;id:1,slots:1", "id:"}) {
    EXPECT_NE(assignment_error(bad, "", 2).find("CTEST_RESOURCE_GROUP_0_GPUS: expected one GPU"), std::string::npos)
        << bad;
  }
}

template <typename F>
std::string error_of(F&& f) {
  try {
    (void)f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

using Ordinals = std::vector<c10::DeviceIndex>;

TEST(RankGpuAssignmentTest, EachRankTakesItsResourceGroupsGpu) {
  EXPECT_EQ(assigned_gpus({"id:2,slots:1", "id:0,slots:1"}, "", 4, 2), (Ordinals{2, 0}));
  EXPECT_EQ(assigned_gpus({"id:6,slots:1", "id:7,slots:1"}, "4,5,6,7", 4, 2), (Ordinals{2, 3}));
  EXPECT_EQ(assigned_gpus({"id:3,slots:1"}, "", 4, 1), (Ordinals{3}));
}

TEST(RankGpuAssignmentTest, WithoutCTestTheRanksTakeExactlyTheVisibleGpus) {
  EXPECT_EQ(assigned_gpus({}, "", 4, 4), (Ordinals{0, 1, 2, 3}));
  EXPECT_NE(error_of([] { return assigned_gpus({}, "", 1, 2); })
                .find("2 ranks need a GPU each, and this process sees 1 CUDA device(s)"),
            std::string::npos);
  // More GPUs than ranks and no assignment: another test may hold the others.
  EXPECT_NE(error_of([] { return assigned_gpus({}, "", 8, 4); }).find("make exactly 4 GPUs visible"), std::string::npos);
}

TEST(RankGpuAssignmentTest, WhatCannotBeAssignedIsAnErrorNamingTheGroup) {
  EXPECT_NE(error_of([] { return assigned_gpus({"id:0,slots:1"}, "", 4, 2); })
                .find("CTest assigned 1 resource group(s) to a test of 2 ranks"),
            std::string::npos);
  EXPECT_NE(error_of([] { return assigned_gpus({"id:0,slots:1", "id:0,slots:1"}, "", 4, 2); })
                .find("GPU ordinal 0 to two ranks"),
            std::string::npos);
  EXPECT_NE(error_of([] { return assigned_gpus({"id:0,slots:1", "id:x"}, "", 4, 2); })
                .find("CTEST_RESOURCE_GROUP_1_GPUS: expected one GPU"),
            std::string::npos);
  EXPECT_NE(error_of([] { return assigned_gpus({"id:0,slots:1", "id:5,slots:1"}, "", 4, 2); })
                .find("this process sees 4 CUDA device(s)"),
            std::string::npos);
  EXPECT_NE(error_of([] { return assigned_gpus({}, "", 2, 0); }).find("expected at least one"), std::string::npos);
}

TEST(RankGpuAssignmentTest, ConsecutiveGpusFromTheOneNamed) {
  EXPECT_EQ(consecutive_gpus(0, 2, 2), (Ordinals{0, 1}));
  EXPECT_EQ(consecutive_gpus(4, 4, 8), (Ordinals{4, 5, 6, 7}));
  EXPECT_NE(error_of([] { return consecutive_gpus(0, 8, 1); })
                .find("8 ranks need a GPU each, cuda:0 to cuda:7, and this process sees 1 CUDA device(s)"),
            std::string::npos);
  EXPECT_NE(error_of([] { return consecutive_gpus(6, 4, 8); }).find("cuda:6 to cuda:9"), std::string::npos);
  EXPECT_NE(error_of([] { return consecutive_gpus(0, 2, 0); }).find("memgate estimate"), std::string::npos);
}

TEST(CudaEnvironmentTest, IsPreparedBeforeMainAsPyTorchUsersHaveIt) {
  // Set while the program started (unless the user had set them): lazy module loading, PCI bus order.
  ASSERT_NE(std::getenv("CUDA_MODULE_LOADING"), nullptr);
  ASSERT_NE(std::getenv("CUDA_DEVICE_ORDER"), nullptr);
  EXPECT_TRUE(prepare_cuda_environment());
}

}  // namespace
}  // namespace memgate

namespace memgate {
namespace {

TEST(AllocatorSettingsTest, TheFixtureOverridesTheEnvironmentKeyByKey) {
  EXPECT_EQ(merge_allocator_settings("", ""), "");
  EXPECT_EQ(merge_allocator_settings("", "expandable_segments:True"), "expandable_segments:True");
  EXPECT_EQ(merge_allocator_settings("max_split_size_mb:128", "expandable_segments:True"),
            "max_split_size_mb:128,expandable_segments:True");
  EXPECT_EQ(merge_allocator_settings("expandable_segments:False,max_split_size_mb:128", "expandable_segments:True"),
            "expandable_segments:True,max_split_size_mb:128");
  EXPECT_EQ(merge_allocator_settings("expandable_segments:True,", ""), "expandable_segments:True");
}

TEST(AllocatorSettingsTest, AnEntryWithoutAValueIsAnErrorNamingWhereItCameFrom) {
  try {
    (void)merge_allocator_settings("", "expandable_segments");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the fixture's training.allocator: allocator setting 'expandable_segments': "
                                         "expected key:value"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW((void)merge_allocator_settings(":True", ""), Error);
}

}  // namespace
}  // namespace memgate

namespace memgate {
namespace {

TEST(CpuIsaTest, FollowsOneDnnsClassesAndItsCap) {
  const std::string epyc = "fpu sse4_1 sse4_2 avx avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx_vnni "
                           "avx512_bf16 avx512_vnni";
  EXPECT_EQ(onednn_cpu_isa(epyc, ""), "avx512_core_bf16");
  EXPECT_EQ(onednn_cpu_isa(epyc, "SSE41"), "sse41");
  EXPECT_EQ(onednn_cpu_isa(epyc, "avx2"), "avx2");
  EXPECT_EQ(onednn_cpu_isa(epyc, "AVX512_CORE_AMX"), "avx512_core_bf16") << "a cap above the CPU changes nothing";
  EXPECT_EQ(onednn_cpu_isa("sse4_1 avx avx2 avx_vnni", ""), "avx2_vnni");
  EXPECT_EQ(onednn_cpu_isa("sse4_1 avx avx2 avx512f avx512dq avx512bw avx512vl avx512_vnni avx512_bf16 avx512_fp16 "
                           "amx_tile amx_bf16 amx_int8", ""),
            "avx512_core_amx");
  EXPECT_EQ(onednn_cpu_isa("fp asimd evtstrm", ""), "") << "not x86";
}

TEST(CpuIsaTest, IsPartOfTheCpusDescription) {
  const auto info = describe_device(c10::Device(c10::DeviceType::CPU));
#if defined(__x86_64__)
  EXPECT_FALSE(info.cpu_isa.empty());
#endif
  EXPECT_EQ(info.slug, "cpu") << "the portable kernels by default: one folder for every CPU";
  EXPECT_EQ(info.cpu_kernels, "portable");
}

// ATen sends bf16 / fp16 work to oneDNN by these features, which a ONEDNN_MAX_CPU_ISA cap does not reach.
TEST(CpuIsaTest, ReducedPrecisionFeaturesAreThoseAtenReads) {
  EXPECT_EQ(reduced_precision_cpu_features("fpu sse4_1 avx2 avx512f avx512_bf16 avx512_vnni"), "avx512_bf16");
  EXPECT_EQ(reduced_precision_cpu_features("avx512f avx512_fp16 amx_tile amx_int8 amx_bf16 avx512_bf16 avx_ne_convert"),
            "avx512_bf16 avx512_fp16 avx_ne_convert amx_bf16");
  EXPECT_EQ(reduced_precision_cpu_features("sse4_1 avx avx2 fma"), "");
  EXPECT_EQ(reduced_precision_cpu_features("avx512_bf16x"), "") << "whole words only";
}

TEST(CpuIsaTest, HostKernelsHaveAFolderPerClass) {
  DeviceInfo d;
  d.cpu_isa = "avx512_core_amx";
  set_cpu_kernels(d, CpuKernels::kHost);
  EXPECT_EQ(d.slug, "cpu-avx512-core-amx");
  EXPECT_EQ(d.cpu_kernels, "host");
  set_cpu_kernels(d, CpuKernels::kPortable);
  EXPECT_EQ(d.slug, "cpu");
  EXPECT_EQ(d.cpu_kernels, "portable");
  DeviceInfo arm;  // not x86: no oneDNN class, the machine names it
  set_cpu_kernels(arm, CpuKernels::kHost);
  EXPECT_EQ(arm.slug.rfind("cpu-", 0), 0U) << arm.slug;
  EXPECT_GT(arm.slug.size(), 4U);
}

}  // namespace
}  // namespace memgate
