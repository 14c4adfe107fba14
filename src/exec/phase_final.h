// Phase final: the final layer on the target rows [target audio | target video], per
// slice of `slice` rows: norm, modulation (the final AdaLN table), the fp32 output head
// of the row's stream, and the rows' copy to the host or, for a device output, their
// unpacking into it on the device (issue 13).
//
// Buffers (FinalSpecs): with a PDD bank, one f32 [Pv, D] + [Pv] effective head (Pv >=
// Pa): the audio head while the target audio rows are projected, then the video head
// (the audio rows all come first, so each is loaded once; the copies are ordered with
// the GEMMs on the compute queue); per slice bf16 h [n, D], f32 modulated rows [n, D],
// f32 head out [n, max(Pv, Pa)] (+ the residual slice with residual offload).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "exec/buffers.h"
#include "exec/forward_state.h"
#include "exec/phase_output.h"
#include "exec/weights.h"
#include "model/h3/layout.h"

namespace ls::exec {

// final_table: bf16|f32 [M, 2D] (shift | scale per timestep row); pdd: the effective
// heads (select_pdd_heads) or nullopt. Out, per stream: with a device view (video_dev /
// audio_dev: the caller's contiguous f32|bf16 latent on the engine's device) the rows
// are unpacked into it slice by slice (Backend::unpack_*_rows with om's masks and
// carry; a slice's mask values are copied into its modulated-rows buffer, free once the
// head GEMM has read it); otherwise vout f32 [target video rows, Pv] / aout f32 [target
// audio rows, Pa] (host) get the head rows. Synchronises before it returns.
Status run_final(ForwardState& st, const FinalSpecs& specs, int64_t slice, const h3::PackedLayout& lay,
                 const TensorView& final_table, const WeightStore& weights, const std::optional<PddHeads>& pdd,
                 const OutputMapping& om, const TensorView& video_dev, const TensorView& audio_dev,
                 std::vector<float>& vout, std::vector<float>& aout);

}  // namespace ls::exec
