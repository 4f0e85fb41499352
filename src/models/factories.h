// Internal: one factory per architecture, called by build_model (model.cpp).
#pragma once

#include "memgate/models/zoo.h"
#include "memgate/models/model.h"
#include "memgate/models/nn.h"

#include <memory>

namespace memgate {

/// Images [B, in_chans, size, size] and binary masks [B, classes, size, size] of a segmentation task (seeded by
/// the caller): the batch of the UNet and the SegNet.
Batch dense_mask_batch(std::int64_t batch_size, std::int64_t in_chans, std::int64_t classes, std::int64_t size,
                       torch::Device device);

std::unique_ptr<Model> make_gpt_model(const GptOptions& spec, nn::ParamOptions param);
/// `param` places the fp32 mask decoder; the LLM and the encoder go to the same device in spec.frozen_dtype.
std::unique_ptr<Model> make_multimodal_model(const MultimodalOptions& spec, nn::ParamOptions param);
std::unique_ptr<Model> make_resnet_model(const ResNetOptions& spec, nn::ParamOptions param);
std::unique_ptr<Model> make_segnet_model(const SegNetOptions& spec, nn::ParamOptions param);
std::unique_ptr<Model> make_unet_model(const UNetOptions& spec, nn::ParamOptions param);
std::unique_ptr<Model> make_vit_model(const VitOptions& spec, nn::ParamOptions param);

}  // namespace memgate
