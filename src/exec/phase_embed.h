// Phase embed: the packed input rows into the residual x, per slice of the MLP slice's
// rows (DESIGN.md §3): text rows are copied from the refined text; the target latents
// are packed to patch rows by Backend::pack_video_rows / pack_audio_rows where they live
// (on the device: no host copy; host latents by the CPU op, then copied); condition rows
// (patchified and augmented on the host by h3::EmbedInputs) are staged through the host.
// Every row is projected by the fp32 patch embedding GEMM + bias and rounded once to bf16.
//
// Buffers (EmbedSpecs): per slice f32 [n, max(Pv, Pa)] patch rows and f32 [n, D]
// projection (+ the residual slice with residual offload).
#pragma once

#include "core/status.h"
#include "core/tensor.h"
#include "exec/buffers.h"
#include "exec/forward_state.h"
#include "exec/weights.h"
#include "model/h3/embed.h"
#include "model/h3/layout.h"

namespace ls::exec {

// text: host bf16 [L, D] (the refined text); `slice` rows per slice (plan.mlp_slice).
Status run_embed(ForwardState& st, const EmbedSpecs& specs, int64_t slice, const h3::PackedLayout& lay,
                 const h3::EmbedInputs& inputs, const TensorView& text, const WeightStore& weights);

}  // namespace ls::exec
