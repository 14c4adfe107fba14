// Plan and planner: how one forward slices its rows, where K/V and the residual live,
// and exactly how many activation bytes that takes on the device (DESIGN.md §2, §3).
// Pure functions, no allocation on any device.
//
// The plan lists every buffer the executor takes from the activation arena, in the
// order the executor takes them, grouped in phases whose lifetimes nest, AS THE DEVICE
// HOLDS THEM (with K/V or residual offload the lists already say so):
//
//   persistent (whole forward): residual x (absent with residual offload), RoPE table,
//               modulation-row indices, final-layer row indices
//   then ONE of these at a time (each freed before the next starts):
//     embed   : per slice of `embed_slice` rows: fp32 patch rows + fp32 projection
//     attn    : stock: h, fused qkv, attention out (all rows)
//               two-pass: K and V for all rows, then per slice h, Q, attention out
//               K/V offload: 2 K chunks + 2 V chunks of kv_chunk rows (one in use, one
//               streaming), then per slice h, Q, attention out, fp32 attention state
//               (attention int8: one bf16 K, V scratch pair of one statistics block,
//               min(S, kInt8StatBlock) rows, and two int8 key chunks of kv_chunk keys)
//     mlp     : per slice: h, fc1 out (2F), swiglu out (F)
//     final   : [PDD effective heads] + per slice: h, fp32 modulated rows, fp32 head out
//   residual offload: every phase starts with TWO "residual slice 0/1" bf16 [n, D] (n =
//   that phase's slice rows): slice i's rows are copied in on the transfer queue while
//   slice i - 1 computes, and back out while slice i + 1 computes.
//
// predicted peak = sum(persistent) + max over phases(sum(phase buffers at the largest
// slice)), every buffer rounded up with Arena::aligned_bytes. Every list is made from a
// typed phase struct (exec/buffers.h: EmbedSpecs, AttnSpecs, ...) and the executor
// allocates from those structs, never by looking a buffer up by name, so the arena's
// measured peak equals the prediction for the largest slice and can never exceed it.
//
// Usage:
//   PlanKnobs k; k.mlp_chunk_tokens = 4096; k.attn_chunk_tokens = 4096;
//   k.kv_offload = true;                                  // optional, needs attn_chunk_tokens
//   Expected<Plan> p = make_plan(cfg, cond, k);          // or plan_for_budget(cfg, cond, 3 << 30)
//   p->predicted_peak_bytes, p->stock_peak_bytes, p->describe()
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "model/h3/conditioning.h"
#include "model/h3/config.h"
#include "model/h3/layout.h"

namespace ls::exec {

// Memory knobs. None of them changes an output bit except kv_tile (a numerics setting,
// DESIGN.md §1.2).
struct PlanKnobs {
  int64_t mlp_chunk_tokens = 0;    // rows per MLP (and patch-embedding) slice; 0 = all rows
  int64_t attn_chunk_tokens = 0;   // rows per attention slice (two-pass); 0 = stock attention
  int64_t final_chunk_tokens = 0;  // rows per final-layer slice; 0 = all target rows
  int64_t kv_tile = 1024;          // keys per attention tile (changes bits; not a memory knob)
  // K/V offload: pass 1 writes K and V of every row to pinned host memory; pass 2 streams
  // them back in chunks of kv_chunk rows (two buffers per tensor: one attended, one in
  // flight), carrying the fp32 attention state across chunks. Needs two-pass attention.
  bool kv_offload = false;
  // Residual offload: x [S, D] lives in pinned host memory; each phase holds two slices
  // (one computing, one in flight).
  // Needs two-pass attention (stock attention reads all S rows of x at once).
  bool residual_offload = false;
  // Rows of one K/V chunk on the device (K/V offload only). 0 = the default,
  // min(S, kv_tile * ceil(4096 / kv_tile)); else a multiple of kv_tile, or >= S (then S).
  int64_t kv_chunk_rows = 0;
  // Sequence-parallel ranks (Ulysses, docs/multi-gpu.md): the plan is ONE rank's, each
  // rank holding rank_rows(S, ranks) rows of the residual and H / ranks heads of
  // attention. Must divide cfg.heads; K/V and residual offload need ranks == 1 (not
  // supported yet across ranks). 1 = one device, the plan as before.
  int64_t ranks = 1;
  // [int8 attention] attention int8 (a numerics setting, docs/int8-attention.md §6): the
  // attention phase (and the text refiner) also hold the int8 statistics and prepared keys.
  // Set from the backend's numerics (DeviceProfile::int8_attention); the engine refuses a
  // plan whose flag differs from its backend's.
  bool int8_attention = false;
};

// Rows of the packed sequence one of `ranks` ranks holds: ceil(S / ranks) (the last
// ranks hold fewer real rows, the rest is padding that only travels in the all-to-all).
inline int64_t rank_rows(int64_t S, int64_t ranks) { return ranks <= 1 ? S : (S + ranks - 1) / ranks; }

// Default K/V chunk: about 4096 keys, rounded up to whole kv_tile tiles.
constexpr int64_t kDefaultKvChunkKeys = 4096;
// [int8 attention] default K/V chunk: 16,384 keys. Each chunk is one attention call per query
// slice, which reads and writes the slice's fp32 state (bench/results/issue26, run 10: pass 2
// at 3 GiB with 4,096-key chunks ran ~30 % above the one-call rate; session 14 cut the cost
// per call to 0.15 ms). The bf16 K, V are compute scratch of one statistics block
// (kInt8StatBlock rows, numerics.h), so a larger int8 chunk costs only its prepared bytes
// (2 I + 4 H a key, twice). An int8 chunk shorter than S is a multiple of 128 keys (keys are
// prepared chunk by chunk, and K's scale groups lie in 128-key tiles: contract v4).
constexpr int64_t kInt8DefaultKvChunkKeys = 16384;

// The resolved rows of a K/V chunk for S keys (see PlanKnobs::kv_chunk_rows): always a
// multiple of kv_tile unless it equals S; the default about kDefaultKvChunkKeys keys
// (int8: kInt8DefaultKvChunkKeys). Errors (invalid_argument): kv_chunk_rows < 0, or not a
// multiple of kv_tile (int8: and of 128) while < S; kv_tile < 1.
Expected<int64_t> resolve_kv_chunk(int64_t kv_chunk_rows, int64_t kv_tile, int64_t S, bool int8 = false);

// Where K/V and the residual live, as the buffer-list functions take it (resolved).
struct Placement {
  bool kv_offload = false;
  bool residual_offload = false;
  int64_t kv_chunk = 0;  // rows per K/V chunk buffer; > 0 with kv_offload
  // Sequence parallel (ranks > 1): every slice is at most rank_rows rows, and the
  // attention phase holds the all-to-all buffers of H / ranks heads (buffers.h).
  int64_t ranks = 1;
  int64_t rank_rows = 0;  // rank_rows(S, ranks) when ranks > 1
  bool int8_attention = false;  // [int8 attention] PlanKnobs::int8_attention
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
// From a layout already built.
SequenceSizes sequence_sizes(const h3::PackedLayout& layout);

// One call's packed layout (h3::build_layout), built once and handed to every step of
// the call: the planner's (the mode's plan, its smallest budget, the AdaLN table rows,
// the device peak: PlanRequest::layout) and the executor's (Engine::has_adaln_tables,
// precompute_adaln, prepare, forward), so no step rebuilds it from the whole
// conditioning. Built on first use (a geometry error comes where the first step needs
// the layout), with the [S, 3] positions when a forward will read it (`for_forward`;
// planning reads row counts only), or handed over already built. Not thread-safe (a
// call's ranks read it after its first get()); the layout (or cfg and cond) must outlive it.
class CallLayout {
 public:
  CallLayout(const h3::H3Config& cfg, const h3::Conditioning& cond, bool for_forward = false)
      : cfg_(&cfg), cond_(&cond), for_forward_(for_forward) {}
  explicit CallLayout(const h3::PackedLayout& built) : built_(&built) {}
  CallLayout(const CallLayout&) = delete;
  CallLayout& operator=(const CallLayout&) = delete;
  // The layout (built on the first call; its error, an invalid geometry, every call).
  Expected<const h3::PackedLayout*> get() const;
  Expected<SequenceSizes> sizes() const;

 private:
  const h3::H3Config* cfg_ = nullptr;
  const h3::Conditioning* cond_ = nullptr;
  bool for_forward_ = false;
  const h3::PackedLayout* built_ = nullptr;
  mutable std::optional<h3::PackedLayout> own_;
};

struct Plan {
  PlanKnobs knobs;          // as requested
  SequenceSizes sizes;
  // Resolved slice sizes (rows per slice, >= 1, <= the rows they slice).
  int64_t attn_slice = 0;   // 0 = stock attention (fused qkv over all S rows)
  int64_t mlp_slice = 0;    // also the patch-embedding slice
  int64_t final_slice = 0;
  int64_t kv_tile = 1024;
  // Resolved offload choices (the lists below already reflect them).
  bool kv_offload = false;
  bool residual_offload = false;
  int64_t kv_chunk = 0;     // rows per K/V chunk on the device; 0 without K/V offload
  int64_t ranks = 1;        // sequence-parallel ranks; the lists are one rank's
  std::vector<PlannedBuffer> persistent;
  std::vector<PlanPhase> phases;
  uint64_t predicted_peak_bytes = 0;  // activation arena capacity for this plan
  uint64_t stock_peak_bytes = 0;      // the same arithmetic for the stock plan

  bool two_pass_attention() const { return attn_slice > 0; }
  // Rows of one rank (S with one rank).
  int64_t rows_per_rank() const { return rank_rows(sizes.S, ranks); }
  bool sliced_mlp() const { return mlp_slice < rows_per_rank(); }
  bool sliced_head() const { return final_slice < std::min(sizes.target_rows, rows_per_rank()); }
  bool stock() const { return !two_pass_attention() && !sliced_mlp() && !sliced_head(); }
  Placement placement() const {
    return {kv_offload, residual_offload, kv_chunk, ranks, ranks > 1 ? rows_per_rank() : 0, knobs.int8_attention};
  }
  // The phase named "embed", "attn", "mlp" or "final" (LS_CHECK that it exists).
  const PlanPhase& phase(const std::string& name) const;
  // "two-pass attention (4096-row slices), sliced MLP (4096), stock head; K/V offloaded
  //  (chunks of 4096 keys); kv_tile 1024; activation peak 3.512 GiB predicted (stock ...)"
  std::string describe() const;
};

// The plan for these knobs. Errors (invalid_argument): a knob < 0, kv_tile < 1, K/V or
// residual offload with stock attention (attn_chunk_tokens == 0), a kv_chunk_rows that
// is not a multiple of kv_tile and < S; an invalid geometry.
Expected<Plan> make_plan(const h3::H3Config& cfg, const h3::Conditioning& cond, const PlanKnobs& knobs);
// The same for sizes already known (the executor has built the layout: no second
// build_layout per call).
Expected<Plan> make_plan(const h3::H3Config& cfg, const SequenceSizes& sizes, const PlanKnobs& knobs);
// The same for a call's layout (built once per call: CallLayout).
Expected<Plan> make_plan(const h3::H3Config& cfg, const CallLayout& layout, const PlanKnobs& knobs);

// The plan with the largest slices whose predicted peak fits `budget_bytes`: the stock
// plan if it fits, else for each phase the largest slice that fits (binary search; the
// phases are independent because the peak is a max over phases). Fails with
// out_of_budget BEFORE any work, naming the smallest budget that would work (all
// slices of one row), when even that does not fit. Never offloads (the total-budget
// planner, budget_plan.h, decides offload).
// ranks > 1: the budget is PER RANK (each rank's activation arena).
Expected<Plan> plan_for_budget(const h3::H3Config& cfg, const h3::Conditioning& cond, uint64_t budget_bytes,
                               int64_t kv_tile = 1024, int64_t ranks = 1, bool int8 = false);
Expected<Plan> plan_for_budget(const h3::H3Config& cfg, const CallLayout& layout, uint64_t budget_bytes,
                               int64_t kv_tile = 1024, int64_t ranks = 1, bool int8 = false);
// The smallest budget plan_for_budget accepts for (cfg, cond): the one its out_of_budget
// message names (persistent buffers + the largest phase at one-row slices, stock
// attention where that is smaller). Errors: an invalid geometry.
// int8: [int8 attention] the plan holds the prepared int8 K/V (docs/int8-attention.md).
Expected<uint64_t> min_activation_budget(const h3::H3Config& cfg, const h3::Conditioning& cond, int64_t ranks = 1,
                                         bool int8 = false);
Expected<uint64_t> min_activation_budget(const h3::H3Config& cfg, const CallLayout& layout, int64_t ranks = 1,
                                         bool int8 = false);
// invalid_argument unless `ranks` (>= 1) divides cfg.heads; the message names the rank
// counts that do ("56 heads: 1, 2, 4, 7, 8, 14, 28 or 56 ranks").
Status check_ranks(const h3::H3Config& cfg, int64_t ranks);

// ---- the buffer lists (shared by the planner and the executor) ---------------------
// Each phase's buffers in allocation order, for slices of `n` rows (the largest slice
// of the plan), as the device holds them under `where`; the executor allocates the same
// specs with the actual slice's rows (K/V chunks with the actual chunk's rows).
// Names are fixed (reports and tests read them; the executor uses exec/buffers.h):
//   persistent: "residual x" bf16 [S, D] (not with residual offload), "rope table"
//               bf16 [S, 2P], "modulation rows" i32 [S, 1], "final rows" i32 [S, 1]
//   every phase with residual offload: "residual slice 0", "residual slice 1" bf16 [n, D] first
std::vector<PlannedBuffer> persistent_buffers(const h3::H3Config& cfg, const SequenceSizes& sizes,
                                              const Placement& where = {});
// "patch rows" f32 [n, max(Pv, Pa)], "patch embedding" f32 [n, D].
PlanPhase embed_phase(const h3::H3Config& cfg, int64_t n, const Placement& where = {});
// attn_slice 0: stock: "h" [S, D], "qkv" [S, 3I], "attention out" [S, I] (no offload
// allowed: LS_CHECK). Two-pass, K/V resident: "K", "V" [S, I], then per slice "h"
// [n, D], "Q" [n, I], "attention out" [n, I]. K/V offload: "K chunk 0", "K chunk 1",
// "V chunk 0", "V chunk 1" [kv_chunk, I], then "h", "Q", "attention out", then
// "attention state" f32 [n, H * (Dh + kAttentionStateExtra)].
PlanPhase attention_phase(const h3::H3Config& cfg, int64_t S, int64_t attn_slice, const Placement& where = {});
// "h" [n, D], "fc1 out" [n, 2F], "swiglu out" [n, F].
PlanPhase mlp_phase(const h3::H3Config& cfg, int64_t n, const Placement& where = {});
// "PDD video head" f32 [Pv, D] + "PDD video bias" f32 [Pv, 1] (pdd_heads > 1), then per
// slice "h" bf16 [n, D], "modulated rows" f32 [n, D], "head out" f32 [n, max(Pv, Pa)].
PlanPhase final_phase(const h3::H3Config& cfg, int64_t n, const Placement& where = {});
// The buffer named `what`, or nullptr.
const PlannedBuffer* find_buffer(const std::vector<PlannedBuffer>& buffers, const std::string& what);
uint64_t sum_bytes(const std::vector<PlannedBuffer>& buffers);

// The text refiner's arena for L tokens: x [L, D] persistent, then the input cast /
// condition_proj phase, then one refiner block (stock, all L rows).
std::vector<PlannedBuffer> refiner_persistent_buffers(const h3::H3Config& cfg, int64_t L);
PlanPhase refiner_input_phase(const h3::H3Config& cfg, int64_t L);
// int8: attention int8 (the block phase also holds int8_all_scratch_bytes for its attention).
PlanPhase refiner_block_phase(const h3::H3Config& cfg, int64_t L, bool int8 = false);
uint64_t refiner_peak_bytes(const h3::H3Config& cfg, int64_t L, bool int8 = false);

// "512M", "3G", "3.5GiB", "1.5 GB", "123456" (bytes). K/M/G/T and KiB/MiB/GiB/TiB are
// binary (1024-based); KB/MB/GB/TB are decimal. Errors name the input.
Expected<uint64_t> parse_byte_size(const std::string& text);

}  // namespace ls::exec
