// Activation buffer sizes of an H3 forward (h3-model.md §6.4) and the per-block live
// activation memory of two plans (DESIGN.md §2): the stock one (every buffer holds
// all S tokens, as ComfyUI runs it) and the sliced one (K and V resident for all
// tokens, everything else in slices of c tokens). Pure arithmetic, for `layerstream
// info` and for checking the planner's predictions against the published numbers.
//
// bf16 = 2 bytes, fp32 = 4 bytes; sizes are exact element counts x element size (no
// arena alignment; the planner adds that).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/h3/config.h"

namespace ls::h3 {

struct MemoryItem {
  std::string what;             // "fused qkv output"
  DType dtype = DType::bf16;
  std::vector<int64_t> shape;   // PyTorch order
  int64_t elements() const;
  int64_t bytes() const { return elements() * dtype_size(dtype); }
  std::string shape_str() const;  // "[111274, 21504]"
};

// The §6.4 table for this config at S packed tokens, `video_tokens` of them target
// video rows (the only rows the final layer's fp32 modulation holds):
//   residual stream x (and each norm output h)   bf16 [S, D]
//   fused qkv output                             bf16 [S, 3I]
//   K (or V, or Q) alone                         bf16 [S, H, Dh]
//   attention output (pre out_proj)              bf16 [S, I]
//   fc1 output                                   bf16 [S, 2F]
//   swiglu intermediate                          bf16 [S, F]
//   rope table                                   bf16 [S, P, 2, 2]   (P = 3 * rope_inv_freq_len)
//   rope angles                                  fp32 [S, 2P]
//   final-layer modulated video rows             fp32 [video_tokens, D]
std::vector<MemoryItem> h3_buffer_table(const H3Config& cfg, int64_t S, int64_t video_tokens);

struct MemoryPhase {
  std::string name;              // "attention", "MLP", "pass 1 (K, V)"
  std::vector<MemoryItem> live;  // every buffer live at the phase's high point
  int64_t bytes() const;
};

struct BlockMemory {
  std::string plan;                  // "stock" / "sliced (8192-token slices, K/V resident)"
  int64_t slice_tokens = 0;          // c (0 for stock)
  std::vector<MemoryPhase> phases;
  int64_t peak_bytes() const;        // max over phases, the residual included
  const MemoryPhase& peak_phase() const;
  int64_t residual_bytes = 0;        // the residual stream alone (lives across blocks)
};

// Stock plan (h3-model.md §6.4, "live set per block"):
//   attention phase: x [S,D] + h [S,D] + qkv [S,3I] + attn out [S,I] + out_proj out [S,D]
//   MLP phase:       x [S,D] + h [S,D] + fc1 [S,2F] + swiglu [S,F] + fc2 out [S,D]
// At H3 dims and S = 111,274: 9.285 GiB / 12.256 GiB.
BlockMemory h3_block_memory_stock(const H3Config& cfg, int64_t S);

// Sliced plan with K/V resident (DESIGN.md §1.3: pass 1 builds K and V for all tokens,
// pass 2 runs Q, attention, out_proj and the gated add per slice; the MLP runs per
// slice). With c = min(slice_tokens, S):
//   pass 1 (per slice): x [S,D] + K [S,I] + V [S,I] + h [c,D] + k,v GEMM out [c,2I]
//   pass 2 (per slice): x + K + V + h [c,D] + q [c,I] + fp32 accumulator [c,I] +
//                       fp32 running max and sum [c,H,2] + attn out [c,I] + out_proj out [c,D]
//   MLP (per slice, K and V freed): x + h [c,D] + fc1 [c,2F] + swiglu [c,F] + fc2 out [c,D]
// At H3 dims, S = 111,274, c = 8192: pass 2 is the peak, 4.69 GiB, of which 1.11 GiB
// is the residual and 2.97 GiB K and V (DESIGN.md's "≈ 3.5 GiB" counts K, V and the
// slice buffers, not the residual).
BlockMemory h3_block_memory_sliced(const H3Config& cfg, int64_t S, int64_t slice_tokens = 8192);

}  // namespace ls::h3
