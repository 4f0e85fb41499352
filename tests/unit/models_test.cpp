// Parameter counts of each architecture against its reference implementation.
#include "memgate/fixture.h"
#include "memgate/model.h"
#include "memgate/vit.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace memgate {
namespace {

ParamCounts count_on_meta(const ModelSpec& spec) {
  auto model = build_model(spec, torch::Device(torch::kMeta));
  return count_parameters(model->module());
}

TEST(VitTest, BasePatch16MatchesTimm) {
  VitSpec vit;  // defaults are vit_base_patch16_224
  EXPECT_EQ(count_on_meta({"vit", vit}).total, 86'567'656);
}

}  // namespace
}  // namespace memgate
