// Plan and planner: how one forward slices its rows, and exactly how many activation
// bytes that takes (DESIGN.md §2, §3). Pure functions, no allocation on any device.
//
// The plan lists every buffer the executor takes from the activation arena, in the
// order the executor takes them, grouped in phases whose lifetimes nest:
//
//   persistent (whole forward): residual x, RoPE table, modulation-row indices
//   then ONE of these at a time (each freed before the next starts):
//     embed   : per slice of `embed_slice` rows: fp32 patch rows + fp32 projection
//     attn    : stock: h, fused qkv, attention out (all rows)
//               two-pass: K and V for all rows, then per slice h, Q, attention out
//     mlp     : per slice: h, fc1 out (2F), swiglu out (F)
//     final   : [PDD effective heads] + per slice: h, fp32 modulated rows, fp32 head out
//
// predicted peak = sum(persistent) + max over phases(sum(phase buffers at the largest
// slice)), every buffer rounded up with Arena::aligned_bytes. The executor allocates
// from exactly these lists (plan_buffers()), so the arena's measured peak equals the
// prediction for the largest slice and can never exceed it.
//
// Usage:
//   PlanKnobs k; k.mlp_chunk_tokens = 4096; k.attn_chunk_tokens = 4096;
//   Expected<Plan> p = make_plan(cfg, cond, k);          // or plan_for_budget(cfg, cond, 3 << 30)
//   p->predicted_peak_bytes, p->stock_peak_bytes, p->describe()
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "model/h3/conditioning.h"
#include "model/h3/config.h"

namespace ls::exec {

// Memory knobs. None of them changes an output bit except kv_tile (a numerics setting,
// DESIGN.md §1.2).
struct PlanKnobs {
  int64_t mlp_chunk_tokens = 0;    // rows per MLP (and patch-embedding) slice; 0 = all rows
  int64_t attn_chunk_tokens = 0;   // rows per attention slice (two-pass); 0 = stock attention
  int64_t final_chunk_tokens = 0;  // rows per final-layer slice; 0 = all target rows
  int64_t kv_tile = 1024;          // keys per attention tile (changes bits; not a memory knob)
};

// One buffer the executor allocates: dtype [rows, cols].
struct PlannedBuffer {
  std::string what;  // "residual x", "K", "fc1 out", ...
  DType dtype = DType::bf16;
  int64_t rows = 0, cols = 0;
  uint64_t bytes() const;  // Arena::aligned_bytes(rows * cols * dtype_size)
};

struct PlanPhase {
  std::string name;                     // "embed", "attn", "mlp", "final"
  std::vector<PlannedBuffer> buffers;   // at the largest slice, allocation order
  uint64_t bytes() const;
};

// Row counts of the packed sequence the plan depends on (from the layout).
struct SequenceSizes {
  int64_t S = 0;            // packed rows
  int64_t target_rows = 0;  // target audio + target video rows (the final layer's rows)
  bool operator==(const SequenceSizes&) const = default;
};
// From the conditioning's geometry, keyframes and references (h3-model.md §2.4).
Expected<SequenceSizes> sequence_sizes(const h3::H3Config& cfg, const h3::Conditioning& cond);

struct Plan {
  PlanKnobs knobs;          // as requested
  SequenceSizes sizes;
  // Resolved slice sizes (rows per slice, >= 1, <= the rows they slice).
  int64_t attn_slice = 0;   // 0 = stock attention (fused qkv over all S rows)
  int64_t mlp_slice = 0;    // also the patch-embedding slice
  int64_t final_slice = 0;
  int64_t kv_tile = 1024;
  std::vector<PlannedBuffer> persistent;
  std::vector<PlanPhase> phases;
  uint64_t predicted_peak_bytes = 0;  // activation arena capacity for this plan
  uint64_t stock_peak_bytes = 0;      // the same arithmetic for the stock plan

  bool two_pass_attention() const { return attn_slice > 0; }
  bool sliced_mlp() const { return mlp_slice < sizes.S; }
  bool sliced_head() const { return final_slice < sizes.target_rows; }
  bool stock() const { return !two_pass_attention() && !sliced_mlp() && !sliced_head(); }
  // "two-pass attention (slice 4096), sliced MLP (4096), stock head; peak 3.512 GiB (stock 12.3 GiB)"
  std::string describe() const;
};

// The plan for these knobs. Errors: a knob < 0, kv_tile < 1, an invalid geometry.
Expected<Plan> make_plan(const h3::H3Config& cfg, const h3::Conditioning& cond, const PlanKnobs& knobs);

// The plan with the largest slices whose predicted peak fits `budget_bytes`: the stock
// plan if it fits, else for each phase the largest slice that fits (binary search; the
// phases are independent because the peak is a max over phases). Fails with
// out_of_budget BEFORE any work, naming the smallest budget that would work (all
// slices of one row), when even that does not fit.
Expected<Plan> plan_for_budget(const h3::H3Config& cfg, const h3::Conditioning& cond, uint64_t budget_bytes,
                               int64_t kv_tile = 1024);

// ---- the buffer lists (shared by the planner and the executor) ---------------------
// Each phase's buffers in allocation order, for slices of `n` rows (the largest slice
// of the plan); the executor allocates the same specs with the actual slice's rows.
std::vector<PlannedBuffer> persistent_buffers(const h3::H3Config& cfg, const SequenceSizes& sizes);
PlanPhase embed_phase(const h3::H3Config& cfg, int64_t n);
// attn_slice 0: stock (h, fused qkv, attention out over S rows); else two-pass:
// K, V [S, I] then per slice h, Q, attention out.
PlanPhase attention_phase(const h3::H3Config& cfg, int64_t S, int64_t attn_slice);
PlanPhase mlp_phase(const h3::H3Config& cfg, int64_t n);
// PDD effective video head first (pdd_heads > 1), then per slice h, fp32 modulated rows, fp32 head out.
PlanPhase final_phase(const h3::H3Config& cfg, int64_t n);
uint64_t sum_bytes(const std::vector<PlannedBuffer>& buffers);

// The text refiner's arena for L tokens: x [L, D] persistent, then the input cast /
// condition_proj phase, then one refiner block (stock, all L rows).
std::vector<PlannedBuffer> refiner_persistent_buffers(const h3::H3Config& cfg, int64_t L);
PlanPhase refiner_input_phase(const h3::H3Config& cfg, int64_t L);
PlanPhase refiner_block_phase(const h3::H3Config& cfg, int64_t L);
uint64_t refiner_peak_bytes(const h3::H3Config& cfg, int64_t L);

// "512M", "3G", "3.5GiB", "1.5 GB", "123456" (bytes). K/M/G/T and KiB/MiB/GiB/TiB are
// binary (1024-based); KB/MB/GB/TB are decimal. Errors name the input.
Expected<uint64_t> parse_byte_size(const std::string& text);

}  // namespace ls::exec
