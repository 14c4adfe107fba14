// Time embedding and AdaLN modulation tables (h3-model.md §2.5, §2.6).
//
// Given M timesteps (fp32 [M], t in [0, 1], not x1000):
//  unpruned: emb = [cos, sin](t * freq) fp32 [M, tin] -> proj_in (fp32 GEMM + bias)
//            -> SiLU (fp32) -> proj_out (fp32 GEMM + bias) -> t_emb = bf16 [M, t];
//            AdaLN input = bf16(silu(t_emb)) (apply_silu = True, computed in fp32, one rounding)
//  curve:    t_emb = lerp of adaln_t_table [G, k] rows (fp32, host), AdaLN input = t_emb
//            (the table stores the post-SiLU curve; apply_silu = False)
// then per block: table = AdaLN linear(input) -> [M, 18D] in the AdaLN dtype (bf16 |
// fp32 curve), read as [3M, 6D] (row = t_index * 3 + modality); the final layer's
// [M, 2D] = (shift, scale).
// Every op is row-wise, so a timestep's rows do not depend on which other timesteps
// are computed with it: precomputing the whole schedule gives the bytes of per-step.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "core/tensor.h"
#include "model/h3/block.h"
#include "model/h3/config.h"

namespace ls::h3 {

// Curve form on the host: t_emb rows fp32 [M, k] from the table fp32 [G, k].
//   pos = fl32(clamp(t, 0, 1) * (G - 1)); i0 = min(floor(pos), G - 2); w = pos - i0;
//   PyTorch lerp: a + w (b - a) if |w| < 0.5 else b - (b - a)(1 - w), all fp32.
std::vector<float> curve_time_embedding(const TensorView& table, const std::vector<float>& t);

// Scratch for the unpruned time embedding of M rows (device views):
//   t f32 [M]; sinus f32 [M, tin]; hidden f32 [M, Th]; temb f32 [M, t]
struct TimeEmbedScratch {
  TensorView t, sinus, hidden, temb;
};

// AdaLN input rows (bf16 [M, t] unpruned / f32 [M, k] curve) into `ain`; `t_emb_out`
// (optional, may be empty) receives t_emb as ComfyUI has it (bf16 [M, t] unpruned).
// Unpruned: `scratch.t` must already hold the timesteps. Curve: `ain` must already
// hold the host-computed curve rows (nothing to do on the device).
Status adaln_input(Backend& be, const H3Config& cfg, const WeightGetter& w, const TimeEmbedScratch& scratch,
                   const TensorView& ain);

// One AdaLN linear: out [M, E*D] = ain * W^T + b, W = `prefix`.linear.weight, through
// Backend::linear: a plain weight (a TensorView converts) is exactly the gemm; the full
// int8 files' blocks.N.adaln_proj.linear (int8 ConvRot, G = 64, unpruned form: ain bf16
// [M, t], out bf16) adds the bias in fp32 before the one rounding. Build the weight with
// h3_linear_weight(w, cfg, "blocks.N.adaln_proj.linear") (block.h) to get its format.
Status adaln_linear(Backend& be, const TensorView& ain, const LinearWeight& weight, const TensorView& bias,
                    const TensorView& out);

}  // namespace ls::h3
