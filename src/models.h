// Internal: one factory per architecture, called by build_model (model.cpp).
#pragma once

#include "memgate/fixture.h"
#include "memgate/model.h"
#include "memgate/nn.h"

#include <memory>

namespace memgate {

std::unique_ptr<Model> make_gpt_model(const GptSpec& spec, nn::ParamOptions param);
/// `param` places the fp32 mask decoder; the LLM and the encoder go to the same device in spec.frozen_dtype.
std::unique_ptr<Model> make_multimodal_model(const MultimodalSpec& spec, nn::ParamOptions param);
std::unique_ptr<Model> make_resnet_model(const ResNetSpec& spec, nn::ParamOptions param);
std::unique_ptr<Model> make_segnet_model(const SegNetSpec& spec, nn::ParamOptions param);
std::unique_ptr<Model> make_unet_model(const UNetSpec& spec, nn::ParamOptions param);
std::unique_ptr<Model> make_vit_model(const VitSpec& spec, nn::ParamOptions param);

}  // namespace memgate
