// The H3 DiT block and the text-refiner block as row-range functions (h3-model.md
// §2.9-2.11, §2.13). THE MODEL DESCRIBES, THE EXECUTOR SLICES (DESIGN.md §3): every
// function here computes the rows it is given, with scratch views the caller took from
// its arena; none knows how the sequence is sliced. Because every backend op is
// batch-invariant, any slicing gives the bytes of one slice of all rows.
//
// Two-pass attention (any slicing):
//   pass 1, all rows first: attn_kv(rows)      K, V (after k-norm + RoPE) into [S, H, Dh] buffers
//   pass 2, per slice:      attn_q_out(rows)   norm1 + modulate, Q, q-norm + RoPE, attention
//                                              against all keys, out-projection, gated add into x
// Pass 1 completes before pass 2 touches the residual, so every slice reads the
// pre-attention residual, as the unsliced computation does.
// Stock attention (one slice of all rows): attn_fused, the fused qkv projection.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "backend/backend.h"
#include "core/status.h"
#include "core/tensor.h"
#include "model/h3/config.h"

namespace ls::h3 {

// name (without prefix) -> view on the backend's device.
using WeightGetter = std::function<TensorView(const std::string&)>;

// Linears are LinearWeight (backend.h): bf16 (the plain weight), int8 ConvRot or fp8
// e4m3, per layer as the checkpoint stores them (cfg.quant, model/h3/quant.h).
struct AttnWeights {
  LinearWeight qkv;       // [3I, D]: rows [q_all | k_all | v_all], each head-major
  TensorView q_norm;      // bf16 [Dh]
  TensorView k_norm;      // bf16 [Dh]
  LinearWeight out_proj;  // [D, I]
};
struct BlockWeights {
  TensorView norm1, norm2;  // bf16 [D]
  AttnWeights attn;
  LinearWeight fc1;         // [2F, D]: rows [gate | up]
  LinearWeight fc2;         // [D, F]
};
// Plain (bf16) block weights, as before quantised formats: aborts if a weight is
// quantised (its dtype is i8 / f8e4m3): use the overload with the config.
BlockWeights dit_block_weights(const WeightGetter& w, int64_t block);
BlockWeights refiner_block_weights(const WeightGetter& w, int64_t block);
// Block weights in the formats of cfg.quant (bf16 layers exactly as above).
BlockWeights dit_block_weights(const WeightGetter& w, const H3Config& cfg, int64_t block);
BlockWeights refiner_block_weights(const WeightGetter& w, const H3Config& cfg, int64_t block);
// The LinearWeight of linear `linear` ("blocks.3.mlp.fc2", "blocks.3.adaln_proj.linear":
// the name without ".weight") in the format of cfg.quant: bf16: w(linear + ".weight");
// int8: + weight_scale viewed as f32 [N] and the group; fp8: weight_scale viewed as f32
// [1] and the input_scale value (host, from the layout).
LinearWeight h3_linear_weight(const WeightGetter& w, const H3Config& cfg, const std::string& linear);

// The six modulation tables of one block: bf16|f32 [3M, D] row-strided views of the
// AdaLN output [3M, 6D] (row = t_index * 3 + tag).
struct BlockTables {
  TensorView shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp;
};
// Views of a block's AdaLN output, bf16|f32 [3M, 6D] contiguous.
BlockTables block_tables(const TensorView& adaln_out);

// Sequence-wide inputs of a block (device views).
struct BlockRows {
  TensorView x;         // bf16 [n, D] residual rows [x_row0, x_row0 + n) (updated in place):
                        // all S rows, or one slice when the residual is offloaded to the host
  TensorView rope;      // bf16 [S, P, 2] (cos, sin)
  TensorView mod_rows;  // i32 [S] modulation row per token
  int64_t x_row0 = 0;   // sequence row of x's first row
  // Residual rows [a, b) of the sequence (must lie inside x).
  TensorView x_rows(int64_t a, int64_t b) const { return x.slice_rows(a - x_row0, b - x_row0); }
};

class DitBlock {
 public:
  DitBlock(Backend& be, const H3Config& cfg, const BlockWeights& w, const BlockTables& t)
      : be_(be), cfg_(cfg), w_(w), t_(t) {}
  // Pass 1 for rows [a, b): K and V of those rows into k_rows / v_rows.
  //   k_rows, v_rows: bf16 [b - a, H, Dh] (rows [a, b) of the [S, H, Dh] K and V, or of
  //   an offload chunk); h: scratch bf16 [b - a, D].
  Status attn_kv(const BlockRows& r, int64_t a, int64_t b, const TensorView& k_rows, const TensorView& v_rows,
                 const TensorView& h) const;
  // Pass 2 for rows [a, b) (needs pass 1 done for all rows).
  //   scratch h bf16 [n, D], q bf16 [n, I], o bf16 [n, I]  (n = b - a)
  Status attn_q_out(const BlockRows& r, int64_t a, int64_t b, const TensorView& k_all, const TensorView& v_all,
                    const TensorView& h, const TensorView& q, const TensorView& o, int64_t kv_tile) const;
  // attn_q_out in its three steps, for callers that feed the keys in chunks (K/V
  // offload): attn_q = norm1 + modulate, Q, q-norm + RoPE (h scratch, q bf16 [n, I]);
  // then the caller's attention into o bf16 [n, I]; attn_out = out-projection into h,
  // gated add into x rows [a, b). attn_q_out is exactly attn_q, attention, attn_out.
  Status attn_q(const BlockRows& r, int64_t a, int64_t b, const TensorView& h, const TensorView& q) const;
  Status attn_out(const BlockRows& r, int64_t a, int64_t b, const TensorView& o, const TensorView& h) const;
  // Stock attention over all S rows with the fused qkv projection.
  //   scratch h bf16 [S, D], qkv bf16 [S, 3I], o bf16 [S, I]; int8_scratch: with attention
  //   int8, int8_all_scratch_bytes(S, H, Dh) bytes (backend.h attention_all_keys), else unused.
  Status attn_fused(const BlockRows& r, const TensorView& h, const TensorView& qkv, const TensorView& o,
                    int64_t kv_tile, const TensorView& int8_scratch = {}) const;
  // MLP half for rows [a, b): norm2, modulate, fc1, SwiGLU, fc2, gated add into x.
  //   scratch h bf16 [n, D], u bf16 [n, 2F], act bf16 [n, F]
  // An int8 fc2 takes u itself (Backend::linear with swiglu_input: the fp32 swiglu of the
  // LS-int8 numerics, no bf16 rounding of the activation), so act is not written.
  Status mlp(const BlockRows& r, int64_t a, int64_t b, const TensorView& h, const TensorView& u,
             const TensorView& act) const;

 private:
  Status norm_modulate(const BlockRows& r, int64_t a, int64_t b, const TensorView& norm_w, const TensorView& shift,
                       const TensorView& scale, const TensorView& h) const;
  Backend& be_;
  const H3Config& cfg_;
  BlockWeights w_;
  BlockTables t_;
};

// Text-refiner block over all L rows (no modulation, no RoPE, plain residual adds).
//   x bf16 [L, D] in place; scratch h [L, D], qkv [L, 3I], o [L, I], u [L, 2F], act [L, F]
Status refiner_block(Backend& be, const H3Config& cfg, const BlockWeights& w, const TensorView& x, const TensorView& h,
                     const TensorView& qkv, const TensorView& o, const TensorView& u, const TensorView& act,
                     int64_t kv_tile, const TensorView& int8_scratch = {});

}  // namespace ls::h3
