// Phase attention of one DiT block, in one of three executions (AttnSpecs::kind):
//
//   stock        : fused qkv over all S rows, one attention call, out-projection and
//                  gated add (the residual must be on the device).
//   resident_kv  : pass 1 computes K and V of every row into K, V [S, I] before any
//                  residual row changes; pass 2, per slice: Q, attention against all
//                  keys, out-projection, gated add (DESIGN.md §1.3).
//   offloaded_kv : the same two passes with K and V in pinned host memory: pass 1
//                  computes chunk c into device buffer c % 2 while the transfer queue
//                  copies chunk c - 1 out; pass 2 copies chunk g + 1 in while attention
//                  runs on chunk g, carrying the fp32 attention state across chunks
//                  (bytes equal one call over all keys: chunks hold whole kv_tiles).
//
// Every execution walks the keys in tiles of kv_tile (the plan's, equal to the
// backend's numerics), so they give the same bytes.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "core/arena.h"
#include "core/status.h"
#include "core/tensor.h"
#include "exec/buffers.h"
#include "exec/forward_state.h"
#include "model/h3/block.h"

namespace ls::exec {

// What the K/V offload holds for one forward: host K, V (pinned, reused block after block)
// and its fences. bf16 attention: K, V bf16 [S, I]. attention int8 (int8_heads = H > 0): only
// the prepared keys cross (docs/int8-attention.md §6), so host K is u8 [S, I + 4 H] (each
// chunk's k8 then its f32 key scales, in the chunk's rows' bytes) and host V u8 [S, I] (each
// chunk's v8t, compact): S (2 I + 4 H) bytes, about half of bf16's 4 S I. Per device chunk
// buffer j in {0, 1}:
//   computed[j]: pass 1's K/V of the chunk in buffer j are computed (compute queue)
//   saved[j]   : that chunk's copy out to the host is done (transfer queue)
//   loaded[j]  : pass 2's copy of a chunk into buffer j is done (transfer queue)
//   used[j]    : attention on the chunk in buffer j is done (compute queue)
struct KvOffload {
  TensorView k_host, v_host;  // pinned host: bf16 [S, I] each, or int8's u8 [S, I + 4 H], [S, I]
  int64_t chunk = 0;          // rows per device chunk buffer (a multiple of kv_tile, or S)
  Backend::Fence computed[2], saved[2], loaded[2], used[2];
  // Takes the host buffers from `pinned` (rewound first; at least host_bytes) and 8 fences
  // from `be`.
  static Expected<KvOffload> create(Backend& be, Arena& pinned, int64_t S, int64_t I, int64_t chunk,
                                    int64_t int8_heads = 0);
  // The pinned arena's capacity for the host buffers (each aligned as Arena allocates).
  static uint64_t host_bytes(int64_t S, int64_t I, int64_t int8_heads = 0);
};

// One block's attention half under `specs`: residual x updated in place.
//   slice: rows per attention slice (two-pass; ignored by stock); kv_tile: keys per tile;
//   kv: the offload's buffers and fences (offloaded_kv only, else null).
Status run_attention(ForwardState& st, const AttnSpecs& specs, const h3::DitBlock& blk, int64_t slice, int64_t kv_tile,
                     KvOffload* kv);

}  // namespace ls::exec
