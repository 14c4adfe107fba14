// Phase MLP of one DiT block, per slice of `slice` rows: norm2, modulation, fc1,
// SwiGLU, fc2 and the gated add into the residual (in place; each row from that row
// alone, so slicing never changes a bit).
//
// Buffers (MlpSpecs): per slice bf16 h [n, D], fc1 out [n, 2F], swiglu out [n, F]
// (+ the residual slice with residual offload).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "exec/buffers.h"
#include "exec/forward_state.h"
#include "model/h3/block.h"

namespace ls::exec {

Status run_mlp(ForwardState& st, const MlpSpecs& specs, const h3::DitBlock& blk, int64_t slice);

}  // namespace ls::exec
