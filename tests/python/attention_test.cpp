// The CPU's choice of attention kernel as PyTorch 2.11 makes it (issue 68): scaled_dot_product_attention runs flash
// attention unless one of sdp_utils_cpp's checks sends it to the math path (a mask that requires grad, a 3-D mask,
// dropout, ...), and flash attention lays its output out as the query is laid out. Each py_attn_* fixture (a
// CLIP-style tower of nn.MultiheadAttention, an encoder-decoder whose attention makes its heads contiguous first, a net
// of attention masks of every kind) is estimated for the CPU and measured on it: every component equal to the byte.
// Before, the estimate made every flash output [B, L, H, D] (the tower's and the encoder-decoder's activations and
// peaks off by the copies one layout makes and the other does not) and took flash attention with a learned bias as
// the mask, whose backward autograd then refused: the estimate failed.
#include "memgate/base/components.h"
#include "memgate/gate/fixture.h"
#include "memgate/launch/estimate.h"
#include "memgate/launch/run.h"
#include "estimate_check.h"
#include "fixture_util.h"
#include "test_util.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

namespace memgate {
namespace {

struct AttentionCase {
  std::string name;     ///< the test's
  std::string fixture;  ///< fixtures/models/<fixture>.yaml
};

void PrintTo(const AttentionCase& c, std::ostream* os) { *os << c.fixture; }

class AttentionChoiceEstimateTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(AttentionChoiceEstimateTest, EstimatesEveryComponentAsTheCpuMeasuresIt) {
  const auto& c = GetParam();
  const auto f = load_fixture(testing::source_dir() + "/fixtures/models/" + c.fixture + ".yaml");
  for (const auto& [batch, m, e] : testing::measure_and_estimate_for_cpu(f, {2, 4})) {
    const auto at = fmt::format("{} at batch {}", c.fixture, batch);
    for (const auto& info : kComponentTable) {
      if (!has_component(m.components, info)) continue;
      const auto want = m.components.*info.member, got = e.components.*info.member;
      std::cout << fmt::format("[ ESTIMATE ] {} {:<19} estimated {:>9} measured {:>9}\n", at, info.name, got, want);
      EXPECT_GT(want, 0) << at << ": " << info.name << " measured nothing";
      EXPECT_EQ(got, want) << at << ": " << info.name;
    }
  }
}

std::string attention_case_name(const ::testing::TestParamInfo<AttentionCase>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(
    Attention, AttentionChoiceEstimateTest,
    ::testing::Values(AttentionCase{"ClipStyleTowerOfMultiheadAttention", "py_attn_clip_tower"},
                      AttentionCase{"EncoderDecoderWithHeadsMadeContiguous", "py_attn_encoder_decoder"},
                      AttentionCase{"LearnedBiasThreeDimensionalAndBooleanMasks", "py_attn_masks"}),
    attention_case_name);

}  // namespace
}  // namespace memgate
