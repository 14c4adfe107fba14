// Activation buffer sizes of an H3 forward (h3-model.md §6.4): the size of each
// tensor the forward makes, at S packed tokens, for `layerstream info` and for
// checking the published numbers. It is a table of tensor sizes, not a memory model:
// what the device holds at once (which buffers, in which phase, at which slice) comes
// from the one planner (exec::plan_memory, src/exec/planner.h), whose buffer lists the
// executor allocates; `info` prints both.
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

}  // namespace ls::h3
