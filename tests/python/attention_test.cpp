// The CPU's choice of attention kernel as PyTorch 2.11 makes it (issue 68): scaled_dot_product_attention runs flash
// attention unless one of sdp_utils_cpp's checks sends it to the math path (a mask that requires grad, a 3-D mask,
// dropout, ...), and flash attention lays its output out as the query is laid out. Each py_attn_* fixture (a
// CLIP-style tower of nn.MultiheadAttention, an encoder-decoder whose attention makes its heads contiguous first, a net
// of attention masks of every kind) is estimated for the CPU and measured on it: every component equal to the byte.
// Before, the estimate made every flash output [B, L, H, D] (the tower's and the encoder-decoder's activations and
// peaks off by the copies one layout makes and the other does not) and took flash attention with a learned bias as
// the mask, whose backward autograd then refused: the estimate failed.
// nn.TransformerEncoder and nn.TransformerEncoderLayer (py_attn_encoder_*, py_attn_layer_*: batch first or not, no
// mask, a causal one, a padding one, both) in eval without gradients take PyTorch's fast path on the CPU where batch
// first (torch._transformer_encoder_layer_fwd); the estimate takes it as the CPU does (memgate._meta's
// fast_paths_on_meta, meta_attention.cpp's kernels). Before, the estimate took the modules' own path: eval_peak
// -5.5% and -8.1% against the CPU's.
#include "memgate/base/components.h"
#include "memgate/gate/fixture.h"
#include "memgate/launch/estimate.h"
#include "memgate/launch/run.h"
#include "estimate_check.h"
#include "fixture_util.h"
#include "test_util.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <exception>
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

// nn.TransformerEncoder with its default enable_nested_tensor and a key padding mask: in eval the CPU reads the mask
// (whether it is left aligned) and packs the unpadded tokens into a nested tensor whose size depends on them. The CPU
// measures it; the estimate refuses it with memgate's message, naming the op, the module and what to do.
TEST(TransformerEncoderEstimateTest, RefusesANestedPaddedBatchNamingTheOpAndTheModule) {
  // The estimate's Python probe refuses it: estimate_profile throws with that message (or reports it as the probe's).
  const auto error = testing::measured_but_estimate_refused(
      load_fixture(testing::source_dir() + "/fixtures/models/py_attn_encoder_nested.yaml"), 2);
  EXPECT_NE(error.find("the estimate cannot run aten::_nested_tensor_from_mask_left_aligned"), std::string::npos)
      << error;
  EXPECT_NE(error.find("'body' (TransformerEncoder)"), std::string::npos) << error;
  EXPECT_NE(error.find("measure it instead"), std::string::npos) << error;
}

std::string attention_case_name(const ::testing::TestParamInfo<AttentionCase>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(
    Attention, AttentionChoiceEstimateTest,
    ::testing::Values(AttentionCase{"ClipStyleTowerOfMultiheadAttention", "py_attn_clip_tower"},
                      AttentionCase{"EncoderDecoderWithHeadsMadeContiguous", "py_attn_encoder_decoder"},
                      AttentionCase{"LearnedBiasThreeDimensionalAndBooleanMasks", "py_attn_masks"},
                      AttentionCase{"TransformerEncoderWithACausalMask", "py_attn_encoder_causal"},
                      AttentionCase{"TransformerEncoderWithAPaddingMaskKeptDense", "py_attn_encoder_padding"},
                      AttentionCase{"TransformerEncoderSequenceFirst", "py_attn_encoder_seq_first"},
                      AttentionCase{"TransformerEncoderLayerWithoutAMask", "py_attn_layer_plain"},
                      AttentionCase{"TransformerEncoderLayerWithBothMasks", "py_attn_layer_both_masks"},
                      AttentionCase{"TransformerEncoderLayerSequenceFirstWithAPaddingMask",
                                    "py_attn_layer_seq_first_padding"}),
    attention_case_name);

}  // namespace
}  // namespace memgate
