// Meta kernels for the ops LibTorch's C++ has none for (convolution, batch and layer norm, scaled-dot-product
// attention, embedding, where), so that a training step runs on the Meta device for an estimate.
#pragma once

#include "memgate/measure/estimate.h"

namespace memgate {

/// Registers memgate's Meta kernels (once per process) and makes them follow `target`: the attention kernel the
/// target would pick and the tensors its kernels allocate.
void use_meta_kernels_for(EstimateTarget target);

}  // namespace memgate
