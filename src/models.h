// Internal: one factory per architecture, called by build_model (model.cpp).
#pragma once

#include "memgate/fixture.h"
#include "memgate/model.h"
#include "memgate/nn.h"

#include <memory>

namespace memgate {

std::unique_ptr<Model> make_vit_model(const VitSpec& spec, nn::ParamOptions param);

}  // namespace memgate
