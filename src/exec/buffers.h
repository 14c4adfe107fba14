// Typed phase buffers: what each phase of the executor takes from the activation
// arena, as named fields instead of a list searched by name (DESIGN.md §2, exec/plan.h).
//
// The Plan keeps its generic lists (PlanPhase::buffers: reports, sums, the planner);
// every list is made FROM one of these structs (plan.cpp: embed_phase(...) ==
// embed_specs(...).phase()), so the executor and the planner cannot disagree on a
// buffer. The executor turns the plan into a phase's struct with one function per phase
// (embed_specs(cfg, plan), ...), which LS_CHECKs that the plan's list is the struct's.
//
// A spec is the buffer at the plan's LARGEST slice; the executor allocates it with the
// actual slice's rows (alloc_rows), so the arena's measured peak equals the prediction
// for the largest slice and never exceeds it. Fields marked "optional" are absent
// (std::nullopt) under the placement that does not hold them on the device.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/arena.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "exec/plan.h"
#include "model/h3/config.h"

namespace ls::exec {

// Allocates `spec` with `rows` rows (<= the planned rows; LS_CHECK) from the arena.
Expected<TensorView> alloc_rows(Arena& arena, const PlannedBuffer& spec, int64_t rows);

// Residual offload: a phase's two residual slice buffers, "residual slice 0" and
// "residual slice 1", bf16 [n, D] each. The rows of slice i go into buffer i % 2 on the
// transfer queue while slice i - 1 computes in the other, and go back to the host from
// it on the transfer queue while slice i + 1 computes (ForwardState::ResidualWalk).
struct ResidualSliceSpecs {
  PlannedBuffer buf[2];
};

// Whole forward: allocated once, before the embedding.
struct PersistentSpecs {
  std::optional<PlannedBuffer> x;  // "residual x" bf16 [S, D]; absent with residual offload
  PlannedBuffer rope;              // "rope table" bf16 [S, 2P] (viewed as [S, P, 2])
  PlannedBuffer mod_rows;          // "modulation rows" i32 [S, 1] (viewed as [S])
  PlannedBuffer final_rows;        // "final rows" i32 [S, 1] (viewed as [S])
  std::vector<PlannedBuffer> list() const;  // allocation order
};

// Embed: per slice of n rows (the MLP slice).
struct EmbedSpecs {
  std::optional<ResidualSliceSpecs> residual_slice;  // 2 x bf16 [n, D], residual offload only
  PlannedBuffer patch_rows;                     // "patch rows" f32 [n, max(Pv, Pa)]
  PlannedBuffer patch_embedding;                // "patch embedding" f32 [n, D]
  PlanPhase phase() const;
};

// Attention, one of three executions:
//   stock        : h, qkv, out over all S rows (fused qkv, one attention call)
//   resident_kv  : K, V [S, I] for all rows, then per slice h, Q, out
//   offloaded_kv : K, V chunks [kv_chunk, I] x 2 each (one attended, one in flight),
//                  then per slice h, Q, out and the fp32 attention state
//   ulysses      : sequence parallel (ranks > 1, docs/multi-gpu.md): "K all", "V all"
//                  [ranks * R, I / ranks] (every row's K and V of this rank's heads,
//                  kept for pass 2), then per slice of n of this rank's rows: h, Q
//                  [n, I], "send" [n, I] (Q packed per destination rank), "Q all"
//                  [ranks * n, I / ranks] (every rank's slice, this rank's heads),
//                  "attention out all" (the same), "attention out" [n, I]. Pass 1 uses
//                  the first five per-slice buffers' bytes (h, K, V, send, receive).
enum class AttentionKind { stock, resident_kv, offloaded_kv, ulysses };
struct AttnSpecs {
  AttentionKind kind = AttentionKind::stock;
  std::optional<ResidualSliceSpecs> residual_slice;  // 2 x bf16 [n, D], residual offload only
  std::optional<PlannedBuffer> k, v;                 // resident_kv: "K", "V" bf16 [S, I]
  std::optional<PlannedBuffer> k_chunk[2], v_chunk[2];  // offloaded_kv: bf16 [kv_chunk, I]
  PlannedBuffer h;                                   // bf16 [n, D] (stock: n = S)
  std::optional<PlannedBuffer> qkv;                  // stock: bf16 [S, 3I]
  std::optional<PlannedBuffer> q;                    // two-pass: "Q" bf16 [n, I]
  PlannedBuffer out;                                 // "attention out" bf16 [n, I]
  std::optional<PlannedBuffer> state;                // offloaded_kv: f32 [n, H * (Dh + kAttentionStateExtra)]
  // ulysses only (see above).
  std::optional<PlannedBuffer> k_all, v_all, send, q_all, out_all;
  // [int8 attention] (Placement::int8_attention; docs/int8-attention.md §6), bytes as u8 [1, n]:
  //   int8_stats   the key statistics f32 [3, H, Dh] (every kind)
  //   int8_keys    the prepared keys of all S keys (stock, resident_kv, ulysses: Hl heads)
  //   int8_chunk   offloaded_kv: two prepared-key chunk buffers of kv_chunk keys
  std::optional<PlannedBuffer> int8_stats, int8_keys, int8_chunk[2];
  PlanPhase phase() const;
};

// MLP: per slice of n rows.
struct MlpSpecs {
  std::optional<ResidualSliceSpecs> residual_slice;  // 2 x bf16 [n, D], residual offload only
  PlannedBuffer h;                              // bf16 [n, D]
  PlannedBuffer fc1_out;                        // "fc1 out" bf16 [n, 2F]
  PlannedBuffer swiglu_out;                     // "swiglu out" bf16 [n, F]
  PlanPhase phase() const;
};

// Final layer: [PDD effective head] + per slice of n target rows.
struct FinalSpecs {
  std::optional<ResidualSliceSpecs> residual_slice;  // 2 x bf16 [n, D], residual offload only
  std::optional<PlannedBuffer> pdd_head;        // "PDD video head" f32 [Pv, D] (pdd_heads > 1)
  std::optional<PlannedBuffer> pdd_bias;        // "PDD video bias" f32 [Pv, 1] (pdd_heads > 1)
  PlannedBuffer h;                              // bf16 [n, D]
  PlannedBuffer modulated;                      // "modulated rows" f32 [n, D]
  PlannedBuffer head_out;                       // "head out" f32 [n, max(Pv, Pa)]
  PlanPhase phase() const;
};

// The builders (the planner's arithmetic, plan.cpp): buffers at slices of n rows as
// the device holds them under `where`.
PersistentSpecs persistent_specs(const h3::H3Config& cfg, const SequenceSizes& sizes, const Placement& where);
EmbedSpecs embed_specs(const h3::H3Config& cfg, int64_t n, const Placement& where);
AttnSpecs attention_specs(const h3::H3Config& cfg, int64_t S, int64_t attn_slice, const Placement& where);
MlpSpecs mlp_specs(const h3::H3Config& cfg, int64_t n, const Placement& where);
FinalSpecs final_specs(const h3::H3Config& cfg, int64_t n, const Placement& where);

// The executor's view of a plan: one function per phase turns the plan into its struct
// (built from the plan's resolved slices and placement, LS_CHECKed equal to the plan's
// list: a plan edited by hand is a bug).
PersistentSpecs persistent_specs(const h3::H3Config& cfg, const Plan& plan);
EmbedSpecs embed_specs(const h3::H3Config& cfg, const Plan& plan);
AttnSpecs attention_specs(const h3::H3Config& cfg, const Plan& plan);
MlpSpecs mlp_specs(const h3::H3Config& cfg, const Plan& plan);
FinalSpecs final_specs(const h3::H3Config& cfg, const Plan& plan);

}  // namespace ls::exec
