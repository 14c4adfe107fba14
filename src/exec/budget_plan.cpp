// Total-budget planner arithmetic (budget_plan.h, docs/budget.md). Notation: L blocks,
// R resident blocks, W one block's weight bytes, N the non-block denoiser weights,
// T modulation tables, X workspace, A(slices) the device activation bytes.
//
//   slots(R)   = 0 if R == L, else min(L - R, prefetch ? 2 : 1)
//   common(R)  = N + R * W + slots(R) * W + X
//   steps      = common(R) + T + A(slices)
//   text       = common(R) + text weights not in slots + refiner activations (L_text rows)
//   precompute = common(R) + T + AdaLN scratch
//   peak       = max(steps, text, precompute)
// Blocks of different layouts (a mixed int8 / bf16 file): R * W is the sum of blocks
// 0 .. R-1's own bytes and a slot W the largest streamed block's (WeightTally::blocks),
// exactly what the WeightStore allocates. common(R) may then dip as R grows (a large
// block 0 leaves the slots); the scan below still finds the largest R that fits, and
// the smallest budget named is the R = 0 one (which the streamed modes use).
//
// common(R) never decreases with R and A(slices) never decreases with any slice, so:
// the most resident blocks that fit is a scan from R = L down; the largest slice of a
// phase that fits is a binary search; and the smallest budget that works is R = 0 with
// one-row slices, minimised over the allowed offload levels (offloading can cost more
// than it saves on short sequences: 4 chunks of kv_chunk rows against K, V of S rows).
//
// PCIe bytes per forward (both directions; weights W per streamed block, kv = 2 S I 2
// bytes of K and V, x = S D 2 bytes of residual, c = attention slice, L blocks):
//   weights  = (L - R) W
//   K/V      = L (kv + (ceil(S / c) - 1) kv)     pass 1 out once, pass 2 in once per slice
//                                                but the first (attended during pass 1)
//   residual = x (1 + 5 L) + target_rows D 2     embed out; per block pass 1 in, pass 2 in
//              [+ L min(S, c) D 2 with K/V]      and out, MLP in and out; final layer in
//                                                [pass 1 also reads the first slice's rows]
#include "exec/budget_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "core/arena.h"
#include "model/h3/layout.h"

namespace ls::exec {

namespace {

using h3::H3Config;
using h3::TensorRole;
using h3::TensorSpec;

uint64_t aligned(int64_t elements, DType t) {
  return Arena::aligned_bytes(static_cast<size_t>(elements) * static_cast<size_t>(dtype_size(t)));
}

}  // namespace

// By role and block index (config.h assigns them once from the name family):
//   block         -> blocks[block]      (norms, qkv, q/k norm, out_proj, fc1, fc2, and
//                                        any per-row scales a quantised format adds)
//   patch_embed, head -> nonblock       (on the device for every step)
//   text_proj, refiner (block -1)       -> text (condition_proj, the refiner's final norm)
//   refiner (block r)                   -> refiner[r]
//   time_embedder -> time_embedder; adaln (block i / -1) -> that block's / the final
//   layer's AdaLN linear (transient during the precompute)
//   rope, adaln_table, unused           -> never on the device (read on the host / unused)
// Each tensor is one allocation of its own dtype's bytes, aligned as the arenas align.
WeightTally tally_weights(const std::vector<TensorSpec>& tensors) {
  WeightTally w;
  std::map<int64_t, uint64_t> blocks, refiner, adaln_blocks;
  uint64_t adaln_final = 0;
  for (const TensorSpec& s : tensors) {
    const uint64_t b = aligned(s.numel(), s.dtype);
    switch (s.role) {
      case TensorRole::block:
        LS_CHECK_MSG(s.block >= 0, "block tensor " + s.name + " without a block index");
        blocks[s.block] += b;
        break;
      case TensorRole::patch_embed:
      case TensorRole::head: w.nonblock += b; break;
      case TensorRole::text_proj: w.text += b; break;
      case TensorRole::refiner:
        if (s.block >= 0) refiner[s.block] += b;
        else w.text += b;
        break;
      case TensorRole::time_embedder: w.time_embedder += b; break;
      case TensorRole::adaln:
        if (s.block >= 0) adaln_blocks[s.block] += b;
        else adaln_final += b;
        break;
      case TensorRole::rope:
      case TensorRole::adaln_table:
      case TensorRole::unused: break;
    }
  }
  for (const auto& [i, b] : blocks) w.block = std::max(w.block, b);
  if (!blocks.empty()) {
    w.blocks.assign(static_cast<size_t>(blocks.rbegin()->first + 1), w.block);
    for (const auto& [i, b] : blocks) w.blocks[static_cast<size_t>(i)] = b;
  }
  for (const auto& [i, b] : refiner) w.refiner_block = std::max(w.refiner_block, b);
  w.refiner_blocks = static_cast<int64_t>(refiner.size());
  w.adaln_largest = adaln_final;
  for (const auto& [i, b] : adaln_blocks) w.adaln_largest = std::max(w.adaln_largest, b);
  return w;
}

uint64_t WeightTally::resident_block_bytes(int64_t R) const {
  uint64_t b = 0;
  for (int64_t i = 0; i < R; ++i) b += block_at(i);
  return b;
}
uint64_t WeightTally::slot_block_bytes(int64_t R, int64_t L) const {
  uint64_t b = 0;
  for (int64_t i = std::max<int64_t>(R, 0); i < L; ++i) b = std::max(b, block_at(i));
  return b;
}
uint64_t WeightTally::streamed_block_bytes(int64_t R, int64_t L) const {
  uint64_t b = 0;
  for (int64_t i = std::max<int64_t>(R, 0); i < L; ++i) b += block_at(i);
  return b;
}

namespace {

// Modulation tables: per block [M, 18D] (= [3M, 6D]) + final [M, 2D], AdaLN dtype, as
// Engine::Impl::compute_tables allocates them.
uint64_t table_bytes(const H3Config& cfg, int64_t M) {
  const DType t = cfg.adaln_dtype();
  return static_cast<uint64_t>(cfg.num_layers) * aligned(M * 18 * cfg.hidden, t) + aligned(M * 2 * cfg.hidden, t);
}

// The precompute's scratch arena besides the tables (mirrors compute_tables): AdaLN
// input [M, t]; unpruned: timesteps, sinusoids, time-MLP hidden and output (fp32) and
// the time embedder's weights; plus the largest AdaLN linear, copied one at a time.
uint64_t precompute_scratch(const H3Config& cfg, const WeightTally& w, int64_t M) {
  const int64_t td = cfg.time_embed_dim;
  uint64_t s = aligned(M * td, cfg.adaln_dtype());
  if (!cfg.curve_form())
    s += aligned(M, DType::f32) + aligned(M * cfg.timestep_input_dim, DType::f32) +
         aligned(M * cfg.time_embed_hidden, DType::f32) + aligned(M * td, DType::f32) + w.time_embedder;
  return s + w.adaln_largest;
}

struct Level {
  bool kv = false, res = false;
  const char* name() const {
    if (kv && res) return "K/V + residual offload";
    if (kv) return "K/V offload";
    if (res) return "residual offload";
    return "no offload";
  }
};

// Device activation bytes of one offload level as a function of the slices (plan.h's
// lists, the same the executor allocates).
struct ActivationModel {
  const H3Config& cfg;
  SequenceSizes z;
  Placement where;
  uint64_t base = 0;

  // ranks > 1: one sequence-parallel rank's buffers (plan.h PlanKnobs::ranks; no offload).
  ActivationModel(const H3Config& c, SequenceSizes sz, Level l, int64_t kv_chunk, int64_t ranks = 1, bool int8 = false)
      : cfg(c), z(sz), where{l.kv, l.res, l.kv ? kv_chunk : 0, ranks, ranks > 1 ? rank_rows(sz.S, ranks) : 0, int8} {
    base = sum_bytes(persistent_buffers(cfg, z, where));
  }
  bool stock_attention_allowed() const { return !where.kv_offload && !where.residual_offload; }
  uint64_t attn(int64_t n) const { return attention_phase(cfg, z.S, n, where).bytes(); }  // n = 0: stock
  uint64_t mlp(int64_t n) const {  // the MLP slice is also the patch-embedding slice
    return std::max(embed_phase(cfg, n, where).bytes(), mlp_phase(cfg, n, where).bytes());
  }
  uint64_t fin(int64_t n) const { return final_phase(cfg, n, where).bytes(); }
  uint64_t total(int64_t a, int64_t m, int64_t f) const { return base + std::max({attn(a), mlp(m), fin(f)}); }
};

// Largest n in [lo, hi] with f(n) <= cap, given f(lo) <= cap and f non-decreasing.
template <typename Fn>
int64_t largest_fitting(int64_t lo, int64_t hi, uint64_t cap, Fn f) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (f(mid) <= cap) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

struct Context {
  const H3Config& cfg;
  const BudgetOptions& o;
  SequenceSizes z;
  WeightTally w;
  int64_t L = 0;
  int64_t kv_chunk = 0;  // resolved K/V chunk rows (used by the K/V offload levels)
  uint64_t tables = 0, scratch = 0, refiner_act = 0;

  int64_t slots(int64_t R) const { return R >= L ? 0 : std::min<int64_t>(L - R, o.prefetch ? 2 : 1); }
  // One slot: the largest streamed block (blocks may differ in layout); 0 when all resident.
  uint64_t slot_block(int64_t R) const { return w.slot_block_bytes(R, L); }
  // What BudgetPlan / DevicePeak call block_bytes: one slot, or the largest block when all
  // are resident (= W of the arithmetic above when every block has the same layout).
  uint64_t block_bytes(int64_t R) const { return R < L ? slot_block(R) : w.block; }
  uint64_t resident_weights(int64_t R) const { return w.nonblock + w.resident_block_bytes(R); }
  uint64_t common(int64_t R) const {
    return resident_weights(R) + static_cast<uint64_t>(slots(R)) * slot_block(R) + o.workspace_bytes;
  }
  // Text weights beyond the slots: condition_proj and the final norm always; the refiner
  // blocks too unless they stream through existing block slots (same tensors as a
  // block's non-AdaLN part, so they fit one slot each).
  uint64_t text_extra(int64_t R) const {
    const bool through_slots = slots(R) > 0 && w.refiner_block <= slot_block(R);
    return w.text + (through_slots ? 0 : static_cast<uint64_t>(w.refiner_blocks) * w.refiner_block) + refiner_act;
  }
  uint64_t steps_peak(int64_t R, uint64_t act) const { return common(R) + tables + act; }
  uint64_t text_peak(int64_t R) const { return common(R) + text_extra(R); }
  uint64_t precompute_peak(int64_t R) const { return common(R) + tables + scratch; }
  uint64_t peak(int64_t R, uint64_t act) const {
    return std::max({steps_peak(R, act), text_peak(R), precompute_peak(R)});
  }
};

struct Mode {
  Level lv;
  int64_t floor = 1;    // smallest slice rows allowed (clamped to each phase's rows)
  bool keep_resident;   // may keep blocks resident (only the first, no-offload mode)
  std::string step;
};

struct Choice {
  int64_t R = 0, attn = 0, mlp = 0, fin = 0;
};

// The attention slice for n fitting rows (BudgetOptions::attention_row_quantum q), never
// below the mode's floor:
//   K/V on the device: floor(n / q) q, whole query chunks (more slices cost nothing but a
//     re-read of K and V from device memory);
//   K/V offloaded: with s = ceil(S / n) slices, the smallest multiple of q holding
//     ceil(S / s) rows, when it fits (<= n): the same slice count, so the same K/V
//     traffic (another slice would reload all of K and V once more);
//   else n. Both are non-decreasing in n (for the second, a slice count s that drops
//   makes ceil(S / s) exceed the old n), so the plan's slices, and its exposed transfer
//   time, stay monotone in the budget.
int64_t quantised_attention_slice(int64_t n, int64_t S, int64_t floor, int64_t q, bool kv_offload) {
  if (q <= 1 || n < q || n >= S) return n;
  if (!kv_offload) {
    const int64_t m = n / q * q;
    return m >= floor ? m : n;
  }
  const int64_t s = (S + n - 1) / n, rows = (S + s - 1) / s;
  const int64_t m = (rows + q - 1) / q * q;
  return m <= n && m >= floor ? m : n;
}

// The choice of one mode at `budget`, or false when even its floor does not fit.
bool try_mode(const Context& c, const Mode& m, uint64_t budget, Choice* out) {
  const ActivationModel act(c.cfg, c.z, m.lv, c.kv_chunk, c.o.ranks, c.o.int8_attention);
  const int64_t fa = std::min(m.floor, c.z.S), fm = fa, ff = std::min(m.floor, c.z.target_rows);
  // The floor's activations; stock attention counts when allowed (at n = S two-pass
  // attention holds the same bytes in more buffers, so alignment can make it larger).
  const uint64_t attn_min = act.stock_attention_allowed() ? std::min(act.attn(0), act.attn(fa)) : act.attn(fa);
  const uint64_t act_min = act.base + std::max({attn_min, act.mlp(fm), act.fin(ff)});
  int64_t R = -1;
  for (int64_t r = m.keep_resident ? c.L : 0; r >= 0; --r)
    if (c.peak(r, act_min) <= budget) {
      R = r;
      break;
    }
  if (R < 0) return false;
  // What the activation arena may take; the peak is base + max over phases, so each
  // phase's slice is chosen alone.
  const uint64_t cap = budget - c.steps_peak(R, 0) - act.base;
  Choice ch;
  ch.R = R;
  if (act.stock_attention_allowed() && act.attn(0) <= cap) ch.attn = 0;
  else
    ch.attn = quantised_attention_slice(largest_fitting(fa, c.z.S, cap, [&](int64_t n) { return act.attn(n); }), c.z.S,
                                        fa, c.o.attention_row_quantum, m.lv.kv);
  ch.mlp = largest_fitting(fm, c.z.S, cap, [&](int64_t n) { return act.mlp(n); });
  ch.fin = largest_fitting(ff, c.z.target_rows, cap, [&](int64_t n) { return act.fin(n); });
  *out = ch;
  return true;
}

std::vector<Level> levels(const BudgetOptions& o) {
  // Built in a fixed array, then copied: GCC 13 reports a false -Wstringop-overflow on
  // push_back's reallocation path of a vector of this 2-byte struct (Release, the GPU
  // machine's compiler).
  Level l[3] = {{false, false}};
  size_t n = 1;
  if (o.ranks <= 1) {  // offload is not supported across sequence-parallel ranks yet
    if (o.allow_kv_offload) l[n++] = {true, false};
    if (o.allow_residual_offload) l[n++] = {o.allow_kv_offload, true};
  }
  return std::vector<Level>(l, l + n);
}

// The two no-offload modes, tried in order: keep blocks resident with slices of at least
// the preferred size, then every block streamed with slices down to one row.
std::vector<Mode> no_offload_modes(int64_t preferred) {
  return {{Level{}, preferred, true, "weights streamed"}, {Level{}, 1, false, "weights streamed, small slices"}};
}

// The offload modes, each tried only when no no-offload mode fits: every block streamed
// (memory an offload frees is never spent on resident blocks), slices down to one row.
std::vector<Mode> offload_modes(const BudgetOptions& o) {
  std::vector<Mode> v;
  for (const Level& l : levels(o))
    if (l.kv || l.res) v.push_back({l, 1, false, l.name()});
  return v;
}

// One block's K and V of all S rows in the form K/V offload moves and keeps on the host: bf16
// K and V, or with attention int8 the prepared keys (k8 + sk + v8t, 2 I + 4 H bytes a key;
// exec KvOffload). Per block it crosses out once and back in per query slice but the first.
uint64_t offload_kv_bytes(const H3Config& cfg, uint64_t S, bool int8) {
  const uint64_t I = static_cast<uint64_t>(cfg.inner()), H = static_cast<uint64_t>(cfg.heads);
  return int8 ? S * (2 * I + 4 * H) : 2 * S * I * 2;
}

// Host <-> device bytes per forward of a choice (see the top of this file).
struct Traffic {
  uint64_t weights = 0, kv = 0, residual = 0;
  uint64_t total() const { return weights + kv + residual; }
};
Traffic traffic(const Context& c, Level lv, const Choice& ch) {
  const uint64_t S = static_cast<uint64_t>(c.z.S), D = static_cast<uint64_t>(c.cfg.hidden),
                 L = static_cast<uint64_t>(c.L);
  Traffic t;
  t.weights = c.w.streamed_block_bytes(ch.R, c.L);
  const bool int8 = c.o.int8_attention;
  if (lv.kv) {
    LS_CHECK(ch.attn > 0);
    const uint64_t kv = offload_kv_bytes(c.cfg, S, int8);
    const uint64_t slices = (S + static_cast<uint64_t>(ch.attn) - 1) / static_cast<uint64_t>(ch.attn);
    // Out once (bf16: pass 1; int8: the prepare walk); back in for every query slice but the
    // first (attended behind those copies).
    t.kv = L * (kv + (slices - 1) * kv);
  }
  if (lv.res) {
    t.residual = S * D * 2 * (1 + 5 * L) + static_cast<uint64_t>(c.z.target_rows) * D * 2;
    // With K/V offload the first query slice's rows are read once more for its Q (int8 too:
    // its prepare walk is pass 1, contract v3).
    if (lv.kv) t.residual += L * std::min(S, static_cast<uint64_t>(ch.attn)) * D * 2;
  }
  return t;
}

// Seconds of transfer per forward the compute cannot hide, by the device facts (B_h2d,
// B_d2h bytes/s; T_att, T_gemm FLOP/s). Every offload copy runs on the ONE transfer
// queue (in call order, beside the weight streaming), so per block and phase the copies
// hide behind that phase's compute, and what is left shows (a = attention slice rows,
// s = ceil(S / a), kv = 4SI bytes of K and V (offload_kv_bytes), x = 2SD bytes of residual, W = a streamed
// block's weights, which cross during the block's first phase):
//   attention pass 1 (K/V offload): max(0, kv / B_d2h + W / B_h2d [+ x / B_h2d]
//                                   - 4SDI / T_gemm (K, V) - 4aSI / T_att (the first
//                                   query slice's attention, run behind the copies))
//   int8 attention (K/V offload): kv = S (2 I + 4 H), the prepared keys; the prepare walk
//                                   is pass 1 above (K, V computed once, block by block,
//                                   copied out prepared, the first query slice attending
//                                   behind the copies)
//   attention pass 2 (K/V offload): (s - 1) x max(0, kv / B_h2d - a k), per reloaded
//                                   slice, k = 4SI / T_att + 4DI / T_gemm [- 4D / B_h2d]
//                                   (its attention and Q / out GEMMs [minus its residual
//                                   copies]), k clamped at >= 0
//   residual only, pass 1 / pass 2 : max(0, W / B_h2d + x / B_h2d - 4SDI / T_gemm),
//                                   max(0, 2x / B_h2d - 4S^2 I / T_att - 4SDI / T_gemm)
//   MLP (residual offload)        : max(0, 2x / B_h2d - 6SDF / T_gemm)
//   embedding out, head rows in   : whole (the embedding synchronises per slice)
//   weights with ONE slot          : (L - R) W / B_h2d whole (any level, none included)
// Not modelled: each phase's first slice in and last slice out (the double buffer's
// fill and drain, one slice each, ~2.5 ms at H3 size); counting them would make the
// exposure grow with the slices. Every term is non-increasing in the slices (and the
// rest constant), so the exposure of a level never grows with the budget.
double exposed_seconds(const Context& c, Level lv, const Choice& ch) {
  const Traffic t = traffic(c, lv, ch);
  const DeviceFacts& f = c.o.device;
  const double Bh = f.pcie_gb_per_s * 1e9, Bd = f.d2h_gb_per_s * 1e9, Ta = f.attention_tflops * 1e12,
               Tg = f.gemm_tflops * 1e12;
  const double S = static_cast<double>(c.z.S), I = static_cast<double>(c.cfg.inner()),
               D = static_cast<double>(c.cfg.hidden), F = static_cast<double>(c.cfg.ffn), L = static_cast<double>(c.L);
  const double kv = static_cast<double>(offload_kv_bytes(c.cfg, c.z.S, c.o.int8_attention)), x = 2.0 * S * D, W = static_cast<double>(t.weights) / L;
  const double kv_gemms = 4.0 * S * D * I / Tg;  // K and V (or Q and out) of all rows
  double per_block = 0;
  if (lv.kv) {
    const double a = std::min(S, static_cast<double>(ch.attn));
    const double slices = std::ceil(S / a);
    // Pass 1 (int8: the prepare walk) copies out behind the K/V GEMMs and the first slice's
    // attention.
    const double out = kv / Bd + W / Bh + (lv.res ? x / Bh : 0.0);
    per_block += std::max(0.0, out - kv_gemms - 4.0 * a * S * I / Ta);
    const double k = std::max(0.0, 4.0 * S * I / Ta + 4.0 * D * I / Tg - (lv.res ? 4.0 * D / Bh : 0.0));
    per_block += (slices - 1.0) * std::max(0.0, kv / Bh - a * k);
  } else if (lv.res) {
    per_block += std::max(0.0, W / Bh + x / Bh - kv_gemms);
    per_block += std::max(0.0, 2.0 * x / Bh - 4.0 * S * S * I / Ta - kv_gemms);
  }
  if (lv.res) per_block += std::max(0.0, 2.0 * x / Bh - 6.0 * S * D * F / Tg);
  double e = L * per_block;
  if (lv.res) e += (x + static_cast<double>(c.z.target_rows) * D * 2.0) / Bh;
  // One slot: block i+1's copy starts once block i's work has released the slot, so every
  // streamed block's weights cross while nothing computes.
  if (c.slots(ch.R) == 1) e += static_cast<double>(t.weights) / Bh;
  return e;
}

// tables_required: the total budget always holds tables (>= 1 row set); a device peak
// of a run without sigmas (knobs / activation modes, device_peak()) may count none.
Status check_options(const BudgetOptions& o, bool tables_required = true) {
  if (o.kv_tile < 1) return Status(make_error(ErrorCode::invalid_argument, "kv_tile must be >= 1"));
  if (o.attention_row_quantum < 1)
    return Status(make_error(ErrorCode::invalid_argument, "attention_row_quantum must be >= 1"));
  if (o.kv_chunk_rows < 0)
    return Status(make_error(ErrorCode::invalid_argument, "kv_chunk_rows must be >= 0 (0 = the default)"));
  if (o.modulation_rows < (tables_required ? 1 : 0))
    return Status(make_error(ErrorCode::invalid_argument,
                             "modulation_rows (distinct timesteps of the run's AdaLN tables) must be >= 1"));
  if (!(o.device.pcie_gb_per_s > 0) || !(o.device.d2h_gb_per_s > 0) || !(o.device.attention_tflops > 0) ||
      !(o.device.gemm_tflops > 0))
    return Status(make_error(ErrorCode::invalid_argument,
                             "device facts (PCIe GB/s both ways, attention and GEMM TFLOP/s) must be > 0"));
  return Status();
}

// From the call's layout (built once per call, CallLayout): its row counts and text rows.
Expected<Context> make_context(const H3Config& cfg, const CallLayout& layout, const BudgetOptions& o,
                               bool tables_required = true) {
  LS_TRY(check_options(o, tables_required));
  LS_TRY(h3::check_h3_config(cfg));
  LS_ASSIGN_OR_RETURN(const h3::PackedLayout* lay, layout.get());
  const SequenceSizes z = sequence_sizes(*lay);
  Context c{cfg, o, z, o.tensors ? tally_weights(*o.tensors) : tally_weights(h3::h3_tensor_specs(cfg))};
  c.L = cfg.num_layers;
  LS_ASSIGN_OR_RETURN(c.kv_chunk, resolve_kv_chunk(o.kv_chunk_rows, o.kv_tile, z.S, o.int8_attention));
  c.tables = table_bytes(cfg, o.modulation_rows);
  c.scratch = precompute_scratch(cfg, c.w, o.modulation_rows);
  c.refiner_act = refiner_peak_bytes(cfg, lay->L, o.int8_attention);  // L = the geometry's text tokens
  return c;
}

uint64_t minimum(const Context& c, bool offload_only = false) {
  uint64_t best = std::numeric_limits<uint64_t>::max();
  for (const Level& l : levels(c.o)) {
    if (offload_only && !l.kv && !l.res) continue;
    const ActivationModel act(c.cfg, c.z, l, c.kv_chunk, c.o.ranks, c.o.int8_attention);
    best = std::min(best, c.peak(0, act.total(1, 1, std::min<int64_t>(1, c.z.target_rows))));
  }
  return best;
}

// The device peak by component of R resident blocks and `act` activation bytes under
// offload level lv (the numbers BudgetPlan carries, for any residency).
DevicePeak peak_of(const Context& c, int64_t R, uint64_t act, Level lv) {
  DevicePeak d;
  d.resident_blocks = R;
  d.slots = c.slots(R);
  d.block_bytes = c.block_bytes(R);
  d.resident_weight_bytes = c.resident_weights(R);
  d.slot_bytes = static_cast<uint64_t>(d.slots) * c.slot_block(R);
  d.modulation_table_bytes = c.tables;
  d.activation_bytes = act;
  d.workspace_bytes = c.o.workspace_bytes;
  d.text_phase_extra_bytes = c.text_extra(R);
  d.precompute_scratch_bytes = c.scratch;
  d.steps_peak_bytes = c.steps_peak(R, act);
  d.text_peak_bytes = c.text_peak(R);
  d.precompute_peak_bytes = c.precompute_peak(R);
  d.predicted_peak_bytes = std::max({d.steps_peak_bytes, d.text_peak_bytes, d.precompute_peak_bytes});
  const uint64_t S = static_cast<uint64_t>(c.z.S);
  d.host_pinned_bytes = c.w.streamed_block_bytes(R, c.L);  // streamed blocks' pinned copies
  if (lv.kv) d.host_pinned_bytes += offload_kv_bytes(c.cfg, S, c.o.int8_attention);  // one block's K, V
  if (lv.res) d.host_pinned_bytes += S * static_cast<uint64_t>(c.cfg.hidden) * 2;       // the residual x
  return d;
}

std::string budget_text(uint64_t b) {
  return b == std::numeric_limits<uint64_t>::max() ? std::string("unlimited") : format_bytes(b);
}

}  // namespace

Expected<Numerics> resolve_described(const BackendDescription& b, const Numerics& asked) {
  Numerics r = asked;
  if (r.attention == AttentionAlgorithm::backend_default) r.attention = b.default_attention();
  LS_TRY(b.can_implement_attention(r.attention));
  if (r.kv_tile == 0) r.kv_tile = b.default_kv_tile(r.attention);
  return r;
}

DeviceProfile device_profile(const BackendDescription& b, const Numerics& n) {
  const AttentionEntry* e = b.attention(n.attention);
  LS_CHECK_MSG(e != nullptr && n.kv_tile > 0, "device_profile needs resolved numerics (" + describe(n) + ")");
  DeviceProfile d;
  d.name = b.name;
  d.workspace_bytes = b.workspace_bytes(n);
  d.default_kv_tile = b.default_kv_tile(n.attention);
  d.attention_row_quantum = e->quantum(n);
  d.throughput = b.rates;
  d.throughput.attention_tflops = e->tflops;
  d.int8_attention = e->key_prepass;  // [int8 attention] as the live profile
  std::ostringstream ws, tile, tp;
  ws << "workspace " << format_bytes(d.workspace_bytes) << " (" << d.workspace_bytes << " bytes): " << b.workspace_note(n);
  tile << "kv_tile " << d.default_kv_tile << ": the backend's default " << e->with;
  tp << "throughput " << d.throughput.pcie_gb_per_s << " GB/s host-to-device, " << d.throughput.d2h_gb_per_s
     << " GB/s device-to-host, " << d.throughput.attention_tflops << " TFLOP/s attention, "
     << d.throughput.gemm_tflops
     << " TFLOP/s GEMM (" << b.rates_source << "; they pick the K/V-hiding slice "
     << kv_hiding_slice(d.throughput) << " and the offload level, never a bit)";
  if (d.attention_row_quantum > 1)
    tile << "; attention slices in whole " << d.attention_row_quantum << "-query " << e->quantum_unit
         << " where that keeps their count";
  d.assumed = {ws.str(), tile.str(), tp.str()};
  return d;
}

BudgetOptions budget_options_for(const DeviceProfile& d) {
  BudgetOptions o;
  o.kv_tile = d.default_kv_tile;
  o.workspace_bytes = d.workspace_bytes;
  o.device = d.throughput;
  o.attention_row_quantum = d.attention_row_quantum;
  o.int8_attention = d.int8_attention;  // [int8 attention]
  return o;
}

int64_t kv_hiding_slice(const DeviceFacts& f) {
  // c >= T / B (FLOP per byte): see the header.
  const double c = std::ceil(f.attention_tflops * 1e12 / (f.pcie_gb_per_s * 1e9));
  return std::max<int64_t>(1, static_cast<int64_t>(c));
}

uint64_t block_weight_bytes(const H3Config& cfg) { return tally_weights(h3::h3_tensor_specs(cfg)).block; }

Expected<int64_t> modulation_rows_for(const H3Config& cfg, const h3::Conditioning& cond,
                                      const std::vector<float>& sigmas) {
  return modulation_rows_for(CallLayout(cfg, cond), cond, sigmas);
}

Expected<int64_t> modulation_rows_for(const CallLayout& layout, const h3::Conditioning& cond,
                                      const std::vector<float>& sigmas) {
  LS_ASSIGN_OR_RETURN(const h3::PackedLayout* lay, layout.get());
  return static_cast<int64_t>(h3::schedule_timesteps(*lay, cond, sigmas).size());
}

namespace {

// BudgetOptions::adaptive_slots: the offload levels are also planned with one slot.
BudgetOptions one_slot_options(const BudgetOptions& o) {
  BudgetOptions o1 = o;
  o1.prefetch = false;
  return o1;
}
bool plans_one_slot_too(const BudgetOptions& o) { return o.prefetch && o.adaptive_slots; }

// The smallest budget the policy reaches: c's levels, and with c1 (the one-slot context)
// its offload levels (the only ones policy step 3 plans with one slot).
uint64_t minimum_of(const Context& c, const Context* c1) {
  return c1 ? std::min(minimum(c), minimum(*c1, /*offload_only=*/true)) : minimum(c);
}

}  // namespace

Expected<uint64_t> min_total_budget(const H3Config& cfg, const h3::Conditioning& cond, const BudgetOptions& o) {
  return min_total_budget(cfg, CallLayout(cfg, cond), o);
}

Expected<uint64_t> min_total_budget(const H3Config& cfg, const CallLayout& layout, const BudgetOptions& o) {
  LS_ASSIGN_OR_RETURN(Context c, make_context(cfg, layout, o));
  if (!plans_one_slot_too(o)) return minimum(c);
  const BudgetOptions o1 = one_slot_options(o);
  LS_ASSIGN_OR_RETURN(Context c1, make_context(cfg, layout, o1));
  return minimum_of(c, &c1);
}

Expected<BudgetPlan> plan_total_budget(const H3Config& cfg, const h3::Conditioning& cond, uint64_t budget,
                                       const BudgetOptions& o) {
  return plan_total_budget(cfg, CallLayout(cfg, cond), budget, o);
}

Expected<BudgetPlan> plan_total_budget(const H3Config& cfg, const CallLayout& layout, uint64_t budget,
                                       const BudgetOptions& o) {
  LS_ASSIGN_OR_RETURN(Context c2, make_context(cfg, layout, o));
  const BudgetOptions o1 = one_slot_options(o);
  std::optional<Context> c1;  // the one-slot alternative of the offload levels (adaptive_slots)
  if (plans_one_slot_too(o)) {
    LS_ASSIGN_OR_RETURN(Context one, make_context(cfg, layout, o1));
    c1.emplace(one);
  }
  const int64_t hiding = kv_hiding_slice(o.device);
  const int64_t preferred = std::min(hiding, c2.z.S);
  // Offload only when it must: the no-offload modes first (the first that fits wins).
  std::optional<Mode> chosen;
  Choice ch;
  const Context* cc = &c2;  // the context (slot count) of the chosen plan
  for (const Mode& m : no_offload_modes(preferred))
    if (try_mode(c2, m, budget, &ch)) {
      chosen = m;
      break;
    }
  // Then, among the offload levels that fit, the one whose transfers the compute hides
  // best (exposed_seconds; the earlier level, i.e. fewer offloads, on a tie). Raw PCIe
  // bytes would prefer residual offload too often: its copies are never hidden, while
  // K/V streams behind attention once slices reach the hiding size. With c1, each level
  // with one slot too, after all the two-slot ones (so two slots win a tie): at 3 GiB and
  // S = 111k the second slot's 735 MiB as attention slices (9,344 -> 16,000 rows) drop
  // the K/V reloads from 1.78 to 1.04 TiB, ~6.7 s of exposed copies against the 0.7 s
  // the unhidden weight copies cost.
  if (!chosen) {
    double best = std::numeric_limits<double>::infinity();
    for (const Context* x : {&c2, c1 ? &*c1 : nullptr}) {
      if (!x) continue;
      for (const Mode& m : offload_modes(o)) {
        Choice mc;
        if (!try_mode(*x, m, budget, &mc)) continue;
        const double cost = exposed_seconds(*x, m.lv, mc);
        if (cost < best) {
          best = cost;
          chosen = m;
          ch = mc;
          cc = x;
        }
      }
    }
  }
  if (!chosen) {
    const uint64_t need = minimum_of(c2, c1 ? &*c1 : nullptr);
    LS_CHECK(need > budget);
    return make_error(ErrorCode::out_of_budget,
                      "a total device budget of " + budget_text(budget) + " (" + std::to_string(budget) +
                          " bytes) is too small for S = " + std::to_string(c2.z.S) + " rows on this model (" +
                          std::to_string(c2.L) + " blocks of " + format_bytes(c2.w.block) +
                          " weights): the smallest total budget that works is " + format_bytes(need) + " (" +
                          std::to_string(need) +
                          " bytes: every block streamed, K/V and residual offloaded where that helps, one-row "
                          "slices). Raise --vram-budget, shorten the clip or allow offloading.");
  }
  const Context& c = *cc;
  const Level lv = chosen->lv;

  BudgetPlan bp;
  bp.budget_bytes = budget;
  bp.sizes = c.z;
  bp.num_layers = c.L;
  bp.resident_blocks = ch.R;
  bp.slots = c.slots(ch.R);
  bp.prefetch = c.o.prefetch;
  bp.one_slot_chosen = cc != &c2;
  bp.kv_offload = lv.kv;
  bp.residual_offload = lv.res;
  bp.kv_chunk = lv.kv ? c.kv_chunk : 0;
  bp.exposed_transfer_seconds = exposed_seconds(c, lv, ch);  // 0 without offload, unless one slot
  bp.kv_hiding_slice = hiding;
  bp.slice_floor = chosen->floor;
  bp.step = chosen->keep_resident ? (ch.R == c.L ? "all resident" : "weights streamed") : chosen->step;

  PlanKnobs k;
  k.attn_chunk_tokens = ch.attn;
  k.mlp_chunk_tokens = ch.mlp;
  k.final_chunk_tokens = ch.fin;
  k.kv_tile = o.kv_tile;
  k.kv_offload = lv.kv;
  k.residual_offload = lv.res;
  k.kv_chunk_rows = lv.kv ? c.kv_chunk : 0;
  k.ranks = o.ranks;
  k.int8_attention = o.int8_attention;  // [int8 attention]
  LS_ASSIGN_OR_RETURN(bp.activations, make_plan(cfg, layout, k));
  const Plan& p = bp.activations;
  bp.activation_bytes = p.predicted_peak_bytes;
  LS_CHECK(p.kv_chunk == bp.kv_chunk);
  LS_CHECK(bp.activation_bytes == ActivationModel(cfg, c.z, lv, c.kv_chunk, c.o.ranks, c.o.int8_attention).total(ch.attn, ch.mlp, ch.fin));

  bp.block_bytes = c.block_bytes(ch.R);
  bp.nonblock_weight_bytes = c.w.nonblock;
  bp.resident_weight_bytes = c.resident_weights(ch.R);
  bp.slot_bytes = static_cast<uint64_t>(bp.slots) * c.slot_block(ch.R);
  bp.modulation_table_bytes = c.tables;
  bp.workspace_bytes = o.workspace_bytes;
  bp.text_phase_extra_bytes = c.text_extra(ch.R);
  bp.precompute_scratch_bytes = c.scratch;
  bp.steps_peak_bytes = c.steps_peak(ch.R, bp.activation_bytes);
  bp.text_peak_bytes = c.text_peak(ch.R);
  bp.precompute_peak_bytes = c.precompute_peak(ch.R);
  bp.predicted_peak_bytes = std::max({bp.steps_peak_bytes, bp.text_peak_bytes, bp.precompute_peak_bytes});
  LS_CHECK(bp.predicted_peak_bytes <= budget);

  const Traffic t = traffic(c, lv, ch);
  bp.pcie_weight_bytes = t.weights;
  bp.pcie_kv_bytes = t.kv;
  bp.pcie_residual_bytes = t.residual;
  const uint64_t S = static_cast<uint64_t>(c.z.S);
  if (lv.kv) bp.host_pinned_bytes += offload_kv_bytes(cfg, S, c.o.int8_attention);  // one block's K, V (reused)
  if (lv.res) bp.host_pinned_bytes += S * static_cast<uint64_t>(cfg.hidden) * 2;      // the residual x
  return bp;
}

Expected<DevicePeak> device_peak(const H3Config& cfg, const h3::Conditioning& cond, const BudgetOptions& o,
                                 int64_t resident_blocks, const Plan& activations) {
  return device_peak(cfg, CallLayout(cfg, cond), o, resident_blocks, activations);
}

Expected<DevicePeak> device_peak(const H3Config& cfg, const CallLayout& layout, const BudgetOptions& o,
                                 int64_t resident_blocks, const Plan& activations) {
  LS_ASSIGN_OR_RETURN(Context c, make_context(cfg, layout, o, /*tables_required=*/false));
  if (resident_blocks < 0 || resident_blocks > c.L)
    return make_error(ErrorCode::invalid_argument, "resident blocks must be 0.." + std::to_string(c.L) + " (got " +
                                                       std::to_string(resident_blocks) + ")");
  LS_CHECK(activations.sizes == c.z);
  return peak_of(c, resident_blocks, activations.predicted_peak_bytes,
                 Level{activations.kv_offload, activations.residual_offload});
}

std::string BudgetPlan::describe() const {
  std::ostringstream os;
  const Plan& p = activations;
  os << "budget " << budget_text(budget_bytes) << ": " << step << "; ";
  if (!streamed()) {
    os << "all " << num_layers << " blocks resident";
  } else {
    os << resident_blocks << "/" << num_layers << " blocks resident, " << streamed_blocks() << " streamed through "
       << slots << (slots == 1 ? " slot" : " slots") << " of " << format_bytes(block_bytes)
       << (prefetch ? " (prefetch)"
                    : one_slot_chosen ? " (no prefetch: the second slot's bytes hold larger slices, which expose less transfer)"
                                      : " (no prefetch)");
  }
  os << "; K/V " << (kv_offload ? "offloaded (chunks of " + std::to_string(kv_chunk) + " keys)" : std::string("on device"))
     << ", residual " << (residual_offload ? "offloaded (two slices per phase, copies overlapped)" : "on device") << "; ";
  if (p.two_pass_attention()) os << "attention slices " << p.attn_slice;
  else os << "stock attention";
  os << ", MLP slices " << p.mlp_slice << ", head slices " << p.final_slice << ", kv_tile " << p.kv_tile;
  os << "; peak " << format_bytes(predicted_peak_bytes) << " predicted (weights " << format_bytes(resident_weight_bytes)
     << " + slots " << format_bytes(slot_bytes) << " + AdaLN tables " << format_bytes(modulation_table_bytes)
     << " + activations " << format_bytes(activation_bytes) << " + workspace " << format_bytes(workspace_bytes) << ")";
  os << "; PCIe " << format_bytes(pcie_bytes_per_forward()) << " per forward";
  return os.str();
}

}  // namespace ls::exec
