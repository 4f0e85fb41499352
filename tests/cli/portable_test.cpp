// The CPU gate's bytes do not depend on the host: under every cap of oneDNN's ISA, of ATen's CPU capability and of
// the thread count, a sample of the CPU suite measures exactly the committed baselines (memgate check --exact), and
// the opt-in host kernels keep baselines of their own per CPU class.
//
// These tests compare runs on this host with each other and with baselines recorded on whatever CPU recorded them;
// none expects this host's ISA, caches or core count to be the recorder's.
#include "memgate/gate/baseline.h"
#include "memgate/gate/fixture.h"
#include "memgate/backend/device.h"
#include "fixture_util.h"
#include "test_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace memgate {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// The sample: fp32, bf16 and fp16 autocast; convolutions (strided, 1x1, transposed, depthwise), scaled-dot-product
// attention, matmuls and linears, layer and batch norm; AdamW and SGD; accumulation. Batch sizes as the CPU suite
// probes them, but for the bf16 ResNet, whose larger batches only take longer through LibTorch's bf16 GEMM.
constexpr const char* kSample = R"(device: cpu
fixtures:
  - {fixture: vit_tiny_full, batch_sizes: [1, 2]}            # fp32: patch convolution, SDPA, linears, AdamW
  - {fixture: gpt_tiny, batch_sizes: [1, 2]}                 # fp32: causal attention, embedding, weight tying
  - {fixture: segnet_tiny_stage2, batch_sizes: [1, 2]}       # fp32: depthwise and transposed convolutions
  - {fixture: multimodal_tiny, batch_sizes: [1, 2]}          # bf16: frozen decoder, attention, matmuls, conv encoder
  - {fixture: resnet_tiny_fewshot_amp_accum, batch_sizes: [1, 2]}  # bf16 convolutions, SGD, accumulation
  - {fixture: unet_tiny_fp16, batch_sizes: [1, 2]}           # fp16 convolutions, GradScaler
)";

// The flags of this CPU, to know which ATen capabilities it can run at all.
std::set<std::string> cpu_flags() {
  std::istringstream words(testing::host_cpu_flags());
  std::set<std::string> flags;
  for (std::string w; words >> w;) flags.insert(w);
  return flags;
}

struct Caps {
  std::string onednn;  ///< ONEDNN_MAX_CPU_ISA, or "default"
  std::string aten;    ///< ATEN_CPU_CAPABILITY, or "default"
  int threads;         ///< OMP_NUM_THREADS / MKL_NUM_THREADS of the process
};

void PrintTo(const Caps& c, std::ostream* os) {
  *os << "ONEDNN_MAX_CPU_ISA=" << c.onednn << " ATEN_CPU_CAPABILITY=" << c.aten << " OMP_NUM_THREADS=" << c.threads;
}

std::string caps_name(const ::testing::TestParamInfo<Caps>& info) {
  auto lower = [](std::string s) {
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  return "onednn_" + lower(info.param.onednn) + "_aten_" + info.param.aten + "_threads_" +
         std::to_string(info.param.threads);
}

// Every pair of values of any two of the three caps, in 12 runs rather than all 24 combinations (an all-pairs
// design): each oneDNN cap with each ATen capability, and each of those with one thread and with two.
std::vector<Caps> all_caps() {
  const std::vector<std::string> onednn{"default", "SSE41", "AVX2", "AVX512_CORE"}, aten{"default", "avx2", "avx512"};
  std::vector<Caps> out;
  for (std::size_t i = 0; i < onednn.size(); ++i) {
    for (std::size_t j = 0; j < aten.size(); ++j) out.push_back({onednn[i], aten[j], 1 + static_cast<int>((i + j) % 2)});
  }
  return out;
}

// The sample suite in a folder of its own (suites/ beside models/, as memgate reads suites), its fixtures copied
// from the repository: the same text, so the same hashes as the committed baselines.
class SampleTree {
 public:
  SampleTree() {
    fs::create_directories(dir_.path() / "suites");
    fs::create_directories(dir_.path() / "models");
    for (const char* name : {"vit_tiny_full", "gpt_tiny", "segnet_tiny_stage2", "multimodal_tiny",
                             "resnet_tiny_fewshot_amp_accum", "unet_tiny_fp16"}) {
      fs::copy_file(testing::source_dir() + "/fixtures/models/" + name + ".yaml",
                    dir_.path() / "models" / (std::string(name) + ".yaml"));
    }
    testing::write_file(suite(), kSample);
  }
  [[nodiscard]] std::string suite() const { return dir_.path() / "suites" / "sample.yaml"; }
  [[nodiscard]] std::string path() const { return dir_.path(); }

 private:
  testing::TempDir dir_;
};

// Everything that could carry the outer run's choices into the measured process is cleared first.
const std::string kCleanEnv =
    "MEMGATE_CPU_KERNELS= MEMGATE_PROGRESS=0 ONEDNN_MAX_CPU_ISA= DNNL_MAX_CPU_ISA= ATEN_CPU_CAPABILITY= ";

class PortableBytesTest : public ::testing::TestWithParam<Caps> {};

// The CI check of the portable CPU kernels: identical bytes to the committed baselines/cpu under every cap.
TEST_P(PortableBytesTest, EqualTheCommittedBaselinesToTheByte) {
  const auto& caps = GetParam();
  const auto flags = cpu_flags();
  auto has = [&](std::initializer_list<const char*> needed) {
    for (const char* f : needed) {
      if (flags.count(f) == 0) return false;
    }
    return true;
  };
  // ATen trusts ATEN_CPU_CAPABILITY without asking the CPU: a capability above it would run instructions it lacks.
  // (A oneDNN cap is a ceiling, harmless above the CPU.)
  if (caps.aten == "avx2" && !has({"avx2", "fma"})) GTEST_SKIP() << "this CPU cannot run ATen's AVX2 kernels";
  if (caps.aten == "avx512" && !has({"avx512f", "avx512bw", "avx512vl", "avx512dq"})) {
    GTEST_SKIP() << "this CPU cannot run ATen's AVX-512 kernels";
  }
  std::string env = kCleanEnv + "OMP_NUM_THREADS=" + std::to_string(caps.threads) +
                    " MKL_NUM_THREADS=" + std::to_string(caps.threads) + " ";
  if (caps.onednn != "default") env += "ONEDNN_MAX_CPU_ISA=" + caps.onednn + " DNNL_MAX_CPU_ISA=" + caps.onednn + " ";
  if (caps.aten != "default") env += "ATEN_CPU_CAPABILITY=" + caps.aten + " ";
  const SampleTree tree;
  std::string out;
  const int rc = testing::run(env + MEMGATE_CLI + " check --suite " + tree.suite() + " --device cpu --exact --baselines " +
                                  testing::source_dir() + "/baselines",
                              &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_THAT(out, HasSubstr("memgate check: passed (12 probes on cpu, 96 components compared with a baseline): 96 ok\n")) << out;
}

INSTANTIATE_TEST_SUITE_P(Caps, PortableBytesTest, ::testing::ValuesIn(all_caps()), caps_name);

// --exact is what makes the check above a check: one byte off, within the tolerance, fails it.
TEST(PortableBytesTest, ExactCheckFailsOnOneByte) {
  testing::TempDir dir;
  const auto fixture = dir / "tiny.yaml";
  testing::write_file(fixture, testing::tiny_vit_yaml("  trainable: head\n"));
  const auto baselines = dir / "baselines";
  const std::string cli = MEMGATE_CLI;
  std::string out;
  // A baseline of the measured bytes, written by the library's update function (as the update workflow writes it).
  ASSERT_EQ(testing::run(kCleanEnv + cli + " profile --config " + fixture + " --device cpu --batch-sizes 2 --output " +
                             (dir / "p.json"),
                         &out),
            0)
      << out;
  const auto profile = nlohmann::json::parse(testing::read_file(dir / "p.json"));
  const auto loaded = load_fixture(fixture);
  ProbeResult probe;
  probe.batch_size = 2;
  for (const auto& info : kComponentTable) {
    const auto& components = profile["probes"][0]["components"];
    if (components.contains(std::string(info.name))) {
      probe.components.set(info.name, components[std::string(info.name)].get<std::int64_t>());
    }
  }
  auto device = describe_device(c10::Device(c10::DeviceType::CPU));
  device.cpu_threads = 1;
  const auto path = baseline_path(baselines, "cpu", loaded.name);
  ASSERT_TRUE(update_baseline(path, loaded, device, {probe}, "test"));
  const auto check = kCleanEnv + cli + " check --config " + fixture + " --device cpu --batch-sizes 2 --baselines " +
                     baselines;
  EXPECT_EQ(testing::run(check + " --exact", &out), 0) << out;
  // One byte less in the baseline: within the 0.25% tolerance, so the gate passes; --exact does not.
  auto j = nlohmann::json::parse(testing::read_file(path));
  auto& activations = j["probes"][0]["components"]["activations"];
  activations = activations.get<std::int64_t>() - 1;
  testing::write_file(path, j.dump(2) + "\n");
  EXPECT_EQ(testing::run(check, &out), 0) << out;
  EXPECT_EQ(testing::run(check + " --exact", &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("differs     tiny_bs2_activations"));
  EXPECT_THAT(out, HasSubstr("(+1 bytes); --exact wants the same bytes"));
  EXPECT_THAT(out, HasSubstr("7 ok, 1 differs"));
}

}  // namespace
}  // namespace memgate
