// Planner arithmetic (DESIGN.md §2). Notation: D hidden, I = H * Dh attention width,
// F ffn width, P rope pairs, Pv = 4 * latents_dim (video patch width), Pa =
// audio_latents_dim, S packed rows, n slice rows. Every buffer is rounded up to the
// arena's 256-byte alignment on its own, exactly as Arena::alloc does.
//
//   persistent = bf16 [S, D] (x) + bf16 [S, 2P] (rope) + i32 [S] (mod rows) + i32 [S] (final rows)
//   embed(n)   = f32 [n, max(Pv, Pa)] + f32 [n, D]
//   attn stock = bf16 [S, D] + bf16 [S, 3I] + bf16 [S, I]
//   attn(n)    = 2 * bf16 [S, I] (K, V) + bf16 [n, D] + 2 * bf16 [n, I]          (pass 2 >= pass 1)
//   mlp(n)     = bf16 [n, D] + bf16 [n, 2F] + bf16 [n, F]
//   final(n)   = [PDD: f32 [Pv, D] + f32 [Pv]] + bf16 [n, D] + f32 [n, D] + f32 [n, max(Pv, Pa)]
//   peak       = persistent + max(embed(n_mlp), attn, mlp(n_mlp), final(n_final))
//
// Offload replaces, on the device:
//   K/V offload      : 2 * bf16 [S, I] -> 4 * bf16 [kv_chunk, I] (K and V chunks, two each)
//                      + f32 [n, H * (Dh + 8)] (the chunked attention's running state)
//   residual offload : bf16 [S, D] (x) -> 2 * bf16 [n, D] at the head of every phase
//
// At H3 size (D 5376, I 7168, F 14336) and S = 111,274 this reproduces DESIGN.md §2:
// stock attention 1.11 + 4.46 + 1.49 GiB, MLP S * 43008 * 2 B = 8.9 GiB; two-pass K + V
// = 2.97 GiB + 8192-row slices.
#include "exec/plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>

#include "backend/backend.h"  // int8_all_scratch_bytes
#include "core/arena.h"
#include "exec/buffers.h"
#include "model/h3/layout.h"

namespace ls::exec {

uint64_t PlannedBuffer::bytes() const {
  return Arena::aligned_bytes(static_cast<size_t>(rows) * static_cast<size_t>(cols) * static_cast<size_t>(dtype_size(dtype)));
}

uint64_t sum_bytes(const std::vector<PlannedBuffer>& buffers) {
  uint64_t s = 0;
  for (const auto& b : buffers) s += b.bytes();
  return s;
}

uint64_t PlanPhase::bytes() const { return sum_bytes(buffers); }

const PlannedBuffer* find_buffer(const std::vector<PlannedBuffer>& buffers, const std::string& what) {
  for (const auto& b : buffers)
    if (b.what == what) return &b;
  return nullptr;
}

Expected<int64_t> resolve_kv_chunk(int64_t kv_chunk_rows, int64_t kv_tile, int64_t S, bool int8) {
  if (kv_tile < 1) return make_error(ErrorCode::invalid_argument, "kv_tile must be >= 1");
  if (kv_chunk_rows < 0)
    return make_error(ErrorCode::invalid_argument,
                      "kv_chunk_rows must be >= 0 (0 = the default, about " + std::to_string(kDefaultKvChunkKeys) +
                          " keys)");
  if (kv_chunk_rows == 0) {
    const int64_t keys = int8 ? kInt8DefaultKvChunkKeys : kDefaultKvChunkKeys;
    const int64_t tiles = (keys + kv_tile - 1) / kv_tile;
    return std::min(S, kv_tile * tiles);
  }
  if (kv_chunk_rows >= S) return S;
  // Every chunk but the last must hold whole kv_tile tiles, so that feeding chunks walks
  // exactly the tiles of one call over all keys (backend.h AttentionParams).
  if (kv_chunk_rows % kv_tile != 0)
    return make_error(ErrorCode::invalid_argument,
                      "kv_chunk_rows " + std::to_string(kv_chunk_rows) + " must be a multiple of kv_tile " +
                          std::to_string(kv_tile) + " (or at least S = " + std::to_string(S) +
                          "): chunks must hold whole attention tiles");
  // int8 (contract v4): keys are prepared chunk by chunk, and K's scale groups lie in
  // 128-key tiles, so a prepare starts at a multiple of kInt8KeyGroupTile.
  if (int8 && kv_chunk_rows % kInt8KeyGroupTile != 0)
    return make_error(ErrorCode::invalid_argument,
                      "kv_chunk_rows " + std::to_string(kv_chunk_rows) + " with attention int8 must be a multiple of " +
                          std::to_string(kInt8KeyGroupTile) + " (or at least S = " + std::to_string(S) +
                          "): keys are prepared chunk by chunk, in whole 128-key tiles (K's scale groups)");
  return kv_chunk_rows;
}

// The lists are made from the typed phase structs (exec/buffers.h), the ones the
// executor allocates from.
std::vector<PlannedBuffer> persistent_buffers(const h3::H3Config& cfg, const SequenceSizes& z, const Placement& where) {
  return persistent_specs(cfg, z, where).list();
}

PlanPhase embed_phase(const h3::H3Config& cfg, int64_t n, const Placement& where) {
  return embed_specs(cfg, n, where).phase();
}

PlanPhase attention_phase(const h3::H3Config& cfg, int64_t S, int64_t attn_slice, const Placement& where) {
  return attention_specs(cfg, S, attn_slice, where).phase();
}

PlanPhase mlp_phase(const h3::H3Config& cfg, int64_t n, const Placement& where) {
  return mlp_specs(cfg, n, where).phase();
}

PlanPhase final_phase(const h3::H3Config& cfg, int64_t n, const Placement& where) {
  return final_specs(cfg, n, where).phase();
}

std::vector<PlannedBuffer> refiner_persistent_buffers(const h3::H3Config& cfg, int64_t L) {
  return {{"text x", DType::bf16, L, cfg.hidden}};
}
PlanPhase refiner_input_phase(const h3::H3Config& cfg, int64_t L) {
  if (cfg.text_dim == cfg.hidden) return {"text input", {}};  // no condition_proj: input goes to x
  return {"text input", {{"text states", DType::bf16, L, cfg.text_dim}}};
}
PlanPhase refiner_block_phase(const h3::H3Config& cfg, int64_t L, bool int8) {
  const int64_t D = cfg.hidden, I = cfg.inner(), F = cfg.ffn;
  PlanPhase p{"refiner block",
              {{"h", DType::bf16, L, D},
               {"qkv", DType::bf16, L, 3 * I},
               {"attention out", DType::bf16, L, I},
               {"fc1 out", DType::bf16, L, 2 * F},
               {"swiglu out", DType::bf16, L, F}}};
  // [int8 attention] the statistics and prepared keys of the L text keys (one row of bytes).
  if (int8) p.buffers.push_back({"int8 attention scratch", DType::u8, 1, int8_all_scratch_bytes(L, cfg.heads, cfg.head_dim)});
  return p;
}
uint64_t refiner_peak_bytes(const h3::H3Config& cfg, int64_t L, bool int8) {
  return sum_bytes(refiner_persistent_buffers(cfg, L)) +
         std::max(refiner_input_phase(cfg, L).bytes(), refiner_block_phase(cfg, L, int8).bytes());
}

SequenceSizes sequence_sizes(const h3::PackedLayout& lay) {
  SequenceSizes z;
  z.S = lay.S;
  z.target_rows = lay.target_rows();
  return z;
}

Expected<SequenceSizes> sequence_sizes(const h3::H3Config& cfg, const h3::Conditioning& cond) {
  return CallLayout(cfg, cond).sizes();
}

Expected<const h3::PackedLayout*> CallLayout::get() const {
  if (built_ != nullptr) return built_;
  if (!own_) {
    LS_ASSIGN_OR_RETURN(h3::PackedLayout lay, h3::build_layout(*cfg_, *cond_, /*with_positions=*/for_forward_));
    own_ = std::move(lay);
  }
  return &*own_;
}

Expected<SequenceSizes> CallLayout::sizes() const {
  LS_ASSIGN_OR_RETURN(const h3::PackedLayout* lay, get());
  return sequence_sizes(*lay);
}

namespace {

struct Resolved {
  int64_t attn = 0, mlp = 0, fin = 0;
  Placement where;
};

Plan assemble(const h3::H3Config& cfg, const SequenceSizes& z, const PlanKnobs& knobs, Resolved r) {
  Plan p;
  p.knobs = knobs;
  p.sizes = z;
  p.attn_slice = r.attn;
  p.mlp_slice = r.mlp;
  p.final_slice = r.fin;
  p.kv_tile = knobs.kv_tile;
  p.kv_offload = r.where.kv_offload;
  p.residual_offload = r.where.residual_offload;
  p.kv_chunk = r.where.kv_chunk;
  p.ranks = r.where.ranks;
  const Placement& w = r.where;
  p.persistent = persistent_buffers(cfg, z, w);
  p.phases = {embed_phase(cfg, r.mlp, w), attention_phase(cfg, z.S, r.attn, w), mlp_phase(cfg, r.mlp, w),
              final_phase(cfg, r.fin, w)};
  uint64_t phase_max = 0;
  for (const auto& ph : p.phases) phase_max = std::max(phase_max, ph.bytes());
  p.predicted_peak_bytes = sum_bytes(p.persistent) + phase_max;
  return p;
}

// Sequence parallel: one rank's placement (no offload), its slices capped at its rows.
Placement rank_placement(const SequenceSizes& z, int64_t ranks, bool int8 = false) {
  Placement w;
  w.int8_attention = int8;  // [int8 attention]
  w.ranks = ranks;
  w.rank_rows = ranks > 1 ? rank_rows(z.S, ranks) : 0;
  return w;
}

// The stock plan: one slice of all rows (of one rank's rows with ranks > 1).
Resolved stock_resolved(const SequenceSizes& z, int64_t ranks, bool int8 = false) {
  const int64_t R = rank_rows(z.S, ranks);
  return Resolved{0, R, std::min(z.target_rows, R), rank_placement(z, ranks, int8)};
}

uint64_t stock_peak(const h3::H3Config& cfg, const SequenceSizes& z, int64_t ranks = 1, bool int8 = false) {
  PlanKnobs k;
  k.ranks = ranks;
  k.int8_attention = int8;
  return assemble(cfg, z, k, stock_resolved(z, ranks, int8)).predicted_peak_bytes;
}

Status check_knobs(const PlanKnobs& k) {
  if (k.mlp_chunk_tokens < 0 || k.attn_chunk_tokens < 0 || k.final_chunk_tokens < 0)
    return Status(make_error(ErrorCode::invalid_argument, "slice sizes must be >= 0 (0 = all rows)"));
  if (k.kv_tile < 1) return Status(make_error(ErrorCode::invalid_argument, "kv_tile must be >= 1"));
  if ((k.kv_offload || k.residual_offload) && k.attn_chunk_tokens == 0)
    return Status(make_error(ErrorCode::invalid_argument,
                             std::string(k.kv_offload ? "K/V" : "residual") +
                                 " offload needs two-pass attention: set attn_chunk_tokens > 0 (stock attention "
                                 "holds K, V and the residual of all rows on the device)"));
  if (k.kv_chunk_rows < 0)
    return Status(make_error(ErrorCode::invalid_argument, "kv_chunk_rows must be >= 0 (0 = the default)"));
  if (k.ranks < 1) return Status(make_error(ErrorCode::invalid_argument, "ranks must be >= 1"));
  if (k.ranks > 1 && (k.kv_offload || k.residual_offload))
    return Status(make_error(ErrorCode::invalid_argument,
                             std::string(k.kv_offload ? "K/V" : "residual") + " offload is not supported yet with " +
                                 std::to_string(k.ranks) +
                                 " sequence-parallel ranks (each rank already holds 1/ranks of K, V and the "
                                 "residual): drop the offload or run on one device (docs/multi-gpu.md)"));
  return Status();
}

}  // namespace

Status check_ranks(const h3::H3Config& cfg, int64_t ranks) {
  if (ranks >= 1 && cfg.heads % ranks == 0) return Status();
  std::string divisors;
  std::vector<int64_t> d;
  for (int64_t n = 1; n <= cfg.heads; ++n)
    if (cfg.heads % n == 0) d.push_back(n);
  for (size_t i = 0; i < d.size(); ++i)
    divisors += (i == 0 ? "" : i + 1 == d.size() ? " or " : ", ") + std::to_string(d[i]);
  return Status(make_error(ErrorCode::invalid_argument,
                           std::to_string(ranks) + " ranks do not divide the model's " + std::to_string(cfg.heads) +
                               " attention heads (sequence parallel splits the heads evenly): use " + divisors +
                               " devices"));
}

namespace {

}  // namespace

Expected<Plan> make_plan(const h3::H3Config& cfg, const h3::Conditioning& cond, const PlanKnobs& knobs) {
  return make_plan(cfg, CallLayout(cfg, cond), knobs);
}

Expected<Plan> make_plan(const h3::H3Config& cfg, const CallLayout& layout, const PlanKnobs& knobs) {
  LS_TRY(check_knobs(knobs));
  LS_ASSIGN_OR_RETURN(SequenceSizes z, layout.sizes());
  return make_plan(cfg, z, knobs);
}

Expected<Plan> make_plan(const h3::H3Config& cfg, const SequenceSizes& z, const PlanKnobs& knobs) {
  LS_TRY(check_knobs(knobs));
  LS_TRY(check_ranks(cfg, knobs.ranks));
  // One rank holds R rows (R = S with one rank): no slice is larger.
  const int64_t R = rank_rows(z.S, knobs.ranks), T = std::min(z.target_rows, R);
  Resolved r;
  r.attn = knobs.attn_chunk_tokens == 0 ? 0 : std::min(knobs.attn_chunk_tokens, R);
  r.mlp = knobs.mlp_chunk_tokens == 0 ? R : std::min(knobs.mlp_chunk_tokens, R);
  r.fin = knobs.final_chunk_tokens == 0 ? T : std::min(knobs.final_chunk_tokens, T);
  LS_ASSIGN_OR_RETURN(const int64_t chunk, resolve_kv_chunk(knobs.kv_chunk_rows, knobs.kv_tile, z.S, knobs.int8_attention));
  r.where = rank_placement(z, knobs.ranks, knobs.int8_attention);
  r.where.kv_offload = knobs.kv_offload;
  r.where.residual_offload = knobs.residual_offload;
  r.where.kv_chunk = knobs.kv_offload ? chunk : 0;
  Plan p = assemble(cfg, z, knobs, r);
  p.stock_peak_bytes = stock_peak(cfg, z, knobs.ranks, knobs.int8_attention);
  return p;
}

// Largest n in [1, hi] with f(n) <= budget (f non-decreasing), or 0 if none.
template <typename F>
static int64_t largest_fitting(int64_t hi, uint64_t budget, F f) {
  if (f(1) > budget) return 0;
  int64_t lo = 1;  // f(lo) fits
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (f(mid) <= budget) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// The smallest activation budget: the persistent buffers plus the largest phase at
// one-row slices (stock attention instead when that is smaller).
static uint64_t min_budget(const h3::H3Config& cfg, const SequenceSizes& z, int64_t ranks, bool int8) {
  const Placement w = rank_placement(z, ranks, int8);
  const uint64_t base = sum_bytes(persistent_buffers(cfg, z, w));
  const uint64_t attn = base + std::min(attention_phase(cfg, z.S, 0, w).bytes(), attention_phase(cfg, z.S, 1, w).bytes());
  const uint64_t mlp = base + std::max(embed_phase(cfg, 1, w).bytes(), mlp_phase(cfg, 1, w).bytes());
  const uint64_t fin = base + final_phase(cfg, 1, w).bytes();
  return std::max({attn, mlp, fin});
}

Expected<uint64_t> min_activation_budget(const h3::H3Config& cfg, const h3::Conditioning& cond, int64_t ranks,
                                         bool int8) {
  return min_activation_budget(cfg, CallLayout(cfg, cond), ranks, int8);
}

Expected<uint64_t> min_activation_budget(const h3::H3Config& cfg, const CallLayout& layout, int64_t ranks,
                                         bool int8) {
  LS_TRY(check_ranks(cfg, ranks));
  LS_ASSIGN_OR_RETURN(SequenceSizes z, layout.sizes());
  return min_budget(cfg, z, ranks, int8);
}

Expected<Plan> plan_for_budget(const h3::H3Config& cfg, const h3::Conditioning& cond, uint64_t budget,
                               int64_t kv_tile, int64_t ranks, bool int8) {
  return plan_for_budget(cfg, CallLayout(cfg, cond), budget, kv_tile, ranks, int8);
}

Expected<Plan> plan_for_budget(const h3::H3Config& cfg, const CallLayout& layout, uint64_t budget, int64_t kv_tile,
                               int64_t ranks, bool int8) {
  PlanKnobs k;
  k.kv_tile = kv_tile;
  k.ranks = ranks;
  k.int8_attention = int8;
  LS_TRY(check_knobs(k));
  LS_TRY(check_ranks(cfg, ranks));
  LS_ASSIGN_OR_RETURN(SequenceSizes z, layout.sizes());
  const uint64_t stock = stock_peak(cfg, z, ranks, int8);
  if (stock <= budget) {
    Plan p = assemble(cfg, z, k, stock_resolved(z, ranks, int8));
    p.stock_peak_bytes = stock;
    return p;
  }
  // The peak is persistent + max over phases, so each phase's slice is chosen alone:
  // the largest slice whose phase fits next to the persistent buffers (slices of at
  // most one rank's rows).
  const Placement w = rank_placement(z, ranks, int8);
  const int64_t R = rank_rows(z.S, ranks), T = std::min(z.target_rows, R);
  const uint64_t base = sum_bytes(persistent_buffers(cfg, z, w));
  auto attn = [&](int64_t n) { return base + attention_phase(cfg, z.S, n, w).bytes(); };
  auto mlp = [&](int64_t n) { return base + std::max(embed_phase(cfg, n, w).bytes(), mlp_phase(cfg, n, w).bytes()); };
  auto fin = [&](int64_t n) { return base + final_phase(cfg, n, w).bytes(); };
  Resolved r;
  r.where = w;
  const uint64_t attn_stock = base + attention_phase(cfg, z.S, 0, w).bytes();
  const bool attn_stock_fits = attn_stock <= budget;
  const int64_t na = attn_stock_fits ? 0 : largest_fitting(R, budget, attn);
  const int64_t nm = largest_fitting(R, budget, mlp);
  const int64_t nf = largest_fitting(T, budget, fin);
  if ((!attn_stock_fits && na == 0) || nm == 0 || nf == 0) {
    const uint64_t need = min_budget(cfg, z, ranks, int8);
    LS_CHECK(need == std::max({std::min(attn_stock, attn(1)), mlp(1), fin(1)}) && need > budget);
    return make_error(ErrorCode::out_of_budget,
                      "an activation budget of " + format_bytes(budget) + " (" + std::to_string(budget) +
                          " bytes) is too small for S = " + std::to_string(z.S) + " rows: the smallest budget that works is " +
                          format_bytes(need) + " (" + std::to_string(need) +
                          " bytes; one-row slices, with K and V of all rows resident). Raise --budget or shorten the clip.");
  }
  r.attn = na;
  r.mlp = nm;
  r.fin = nf;
  k.attn_chunk_tokens = na;
  k.mlp_chunk_tokens = nm;
  k.final_chunk_tokens = nf;
  Plan p = assemble(cfg, z, k, r);
  p.stock_peak_bytes = stock;
  LS_CHECK(p.predicted_peak_bytes <= budget);
  return p;
}

const PlanPhase& Plan::phase(const std::string& name) const {
  for (const auto& ph : phases)
    if (ph.name == name) return ph;
  LS_CHECK_MSG(false, "the plan has no phase named '" + name + "'");
  return phases.front();
}

std::string Plan::describe() const {
  std::ostringstream os;
  if (stock()) {
    os << "stock plan (one slice of all " << sizes.S << " rows)";
  } else {
    if (two_pass_attention()) os << "two-pass attention (" << attn_slice << "-row slices)";
    else os << "stock attention";
    os << ", ";
    if (sliced_mlp()) os << "sliced MLP (" << mlp_slice << ")";
    else os << "stock MLP";
    os << ", ";
    if (sliced_head()) os << "sliced head (" << final_slice << ")";
    else os << "stock head";
  }
  if (kv_offload) os << "; K/V offloaded (chunks of " << kv_chunk << " keys)";
  if (residual_offload) os << "; residual offloaded (two slices on the device per phase, copies overlapped)";
  os << "; kv_tile " << kv_tile << "; activation peak " << format_bytes(predicted_peak_bytes) << " predicted (stock "
     << format_bytes(stock_peak_bytes) << ")";
  return os.str();
}

Expected<uint64_t> parse_byte_size(const std::string& text) {
  auto fail = [&]() {
    return Error{ErrorCode::invalid_argument, "cannot read '" + text +
                                                  "' as a size: expected a number with an optional unit, e.g. 512M, 3G, "
                                                  "3.5GiB, 1.5GB, 123456 (K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024, "
                                                  "KB/MB/GB/TB powers of 1000)"};
  };
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  const size_t num_begin = i;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == num_begin) return fail();
  const std::string num = text.substr(num_begin, i - num_begin);
  if (std::count(num.begin(), num.end(), '.') > 1) return fail();
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::string unit;
  for (; i < text.size(); ++i) {
    if (std::isspace(static_cast<unsigned char>(text[i]))) break;
    unit += static_cast<char>(std::toupper(static_cast<unsigned char>(text[i])));
  }
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  if (i != text.size()) return fail();
  double mult = 1;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KIB") mult = 1024.0;
  else if (unit == "M" || unit == "MIB") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GIB") mult = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TIB") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "KB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  else if (unit == "TB") mult = 1e12;
  else return fail();
  const double v = std::strtod(num.c_str(), nullptr) * mult;
  if (!(v >= 0) || v > 1.8e19) return fail();
  return static_cast<uint64_t>(std::floor(v));
}

}  // namespace ls::exec
