// The phase buffers' arithmetic (exec/plan.cpp's header comment has the formulas):
// every PlanPhase list the planner sums is made here, from the same struct the
// executor allocates from.
#include "exec/buffers.h"

#include <algorithm>
#include <iterator>

#include "backend/backend.h"  // kAttentionStateExtra

namespace ls::exec {

Expected<TensorView> alloc_rows(Arena& arena, const PlannedBuffer& spec, int64_t rows) {
  LS_CHECK_MSG(rows <= spec.rows, "slice of " + std::to_string(rows) + " rows exceeds the planned " + spec.what);
  return arena.alloc(spec.dtype, {rows, spec.cols}, spec.what.c_str());
}

namespace {

int64_t patch_width(const h3::H3Config& cfg) { return std::max(cfg.video_patch_dim(), cfg.audio_latents_dim); }

// With residual offload a phase starts with its two residual slices bf16 [n, D]: slice
// i's rows are copied in on the transfer queue while slice i - 1 computes and copied
// back while slice i + 1 computes, so the copies overlap the compute (double buffer).
std::optional<ResidualSliceSpecs> residual_slice(const h3::H3Config& cfg, const Placement& where, int64_t n) {
  if (!where.residual_offload) return std::nullopt;
  ResidualSliceSpecs r;
  for (int j = 0; j < 2; ++j) r.buf[j] = PlannedBuffer{"residual slice " + std::to_string(j), DType::bf16, n, cfg.hidden};
  return r;
}

void add(std::vector<PlannedBuffer>& v, const std::optional<PlannedBuffer>& b) {
  if (b) v.push_back(*b);
}
void add(std::vector<PlannedBuffer>& v, const std::optional<ResidualSliceSpecs>& r) {
  if (r) v.insert(v.end(), std::begin(r->buf), std::end(r->buf));
}

bool same_specs(const std::vector<PlannedBuffer>& a, const std::vector<PlannedBuffer>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].what != b[i].what || a[i].dtype != b[i].dtype || a[i].rows != b[i].rows || a[i].cols != b[i].cols)
      return false;
  return true;
}

template <typename Specs>
Specs checked(Specs s, const PlanPhase& planned) {
  LS_CHECK_MSG(same_specs(s.phase().buffers, planned.buffers),
               "the plan's '" + planned.name + "' buffers are not what its slices and placement give");
  return s;
}

}  // namespace

std::vector<PlannedBuffer> PersistentSpecs::list() const {
  std::vector<PlannedBuffer> v;
  add(v, x);
  v.push_back(rope);
  v.push_back(mod_rows);
  v.push_back(final_rows);
  return v;
}

PlanPhase EmbedSpecs::phase() const {
  PlanPhase p{"embed", {}};
  add(p.buffers, residual_slice);
  p.buffers.push_back(patch_rows);
  p.buffers.push_back(patch_embedding);
  return p;
}

PlanPhase AttnSpecs::phase() const {
  PlanPhase p{"attn", {}};
  add(p.buffers, residual_slice);
  add(p.buffers, k_chunk[0]);
  add(p.buffers, k_chunk[1]);
  add(p.buffers, v_chunk[0]);
  add(p.buffers, v_chunk[1]);
  add(p.buffers, k);
  add(p.buffers, v);
  add(p.buffers, k_all);
  add(p.buffers, v_all);
  p.buffers.push_back(h);
  add(p.buffers, qkv);
  add(p.buffers, q);
  add(p.buffers, send);
  add(p.buffers, q_all);
  add(p.buffers, out_all);
  p.buffers.push_back(out);
  add(p.buffers, state);
  add(p.buffers, int8_stats);  // [int8 attention]
  add(p.buffers, int8_keys);
  add(p.buffers, int8_chunk[0]);
  add(p.buffers, int8_chunk[1]);
  return p;
}

PlanPhase MlpSpecs::phase() const {
  PlanPhase p{"mlp", {}};
  add(p.buffers, residual_slice);
  p.buffers.push_back(h);
  p.buffers.push_back(fc1_out);
  p.buffers.push_back(swiglu_out);
  return p;
}

PlanPhase FinalSpecs::phase() const {
  PlanPhase p{"final", {}};
  add(p.buffers, residual_slice);
  add(p.buffers, pdd_head);
  add(p.buffers, pdd_bias);
  p.buffers.push_back(h);
  p.buffers.push_back(modulated);
  p.buffers.push_back(head_out);
  return p;
}

namespace {

// Sequence parallel: no slice holds more than one rank's rows.
int64_t cap(int64_t n, const Placement& where) { return where.ranks > 1 ? std::min(n, where.rank_rows) : n; }

}  // namespace

PersistentSpecs persistent_specs(const h3::H3Config& cfg, const SequenceSizes& z, const Placement& where) {
  PersistentSpecs s;
  // Sequence parallel: the residual holds this rank's R rows; the RoPE and row-index
  // tables stay whole (small, indexed by sequence row).
  if (!where.residual_offload) s.x = PlannedBuffer{"residual x", DType::bf16, where.ranks > 1 ? where.rank_rows : z.S, cfg.hidden};
  s.rope = {"rope table", DType::bf16, z.S, 2 * cfg.rope_pairs()};
  s.mod_rows = {"modulation rows", DType::i32, z.S, 1};
  s.final_rows = {"final rows", DType::i32, z.S, 1};
  return s;
}

EmbedSpecs embed_specs(const h3::H3Config& cfg, int64_t n, const Placement& where) {
  n = cap(n, where);
  EmbedSpecs s;
  s.residual_slice = residual_slice(cfg, where, n);
  s.patch_rows = {"patch rows", DType::f32, n, patch_width(cfg)};
  s.patch_embedding = {"patch embedding", DType::f32, n, cfg.hidden};
  return s;
}

namespace {
AttnSpecs bf16_attention_specs(const h3::H3Config& cfg, int64_t S, int64_t attn_slice, const Placement& where) {
  const int64_t D = cfg.hidden, I = cfg.inner();
  AttnSpecs s;
  if (where.ranks > 1) {
    // Ulysses (docs/multi-gpu.md): stock attention is one slice of this rank's rows.
    LS_CHECK_MSG(!where.kv_offload && !where.residual_offload, "offload with sequence parallel ranks");
    LS_CHECK_MSG(cfg.heads % where.ranks == 0, "ranks must divide the heads");
    const int64_t N = where.ranks, R = where.rank_rows, Il = I / N;
    const int64_t n = attn_slice == 0 ? R : std::min(attn_slice, R);
    s.kind = AttentionKind::ulysses;
    s.k_all = PlannedBuffer{"K all", DType::bf16, N * R, Il};
    s.v_all = PlannedBuffer{"V all", DType::bf16, N * R, Il};
    s.h = {"h", DType::bf16, n, D};
    s.q = PlannedBuffer{"Q", DType::bf16, n, I};
    s.send = PlannedBuffer{"send", DType::bf16, n, I};
    s.q_all = PlannedBuffer{"Q all", DType::bf16, N * n, Il};
    s.out_all = PlannedBuffer{"attention out all", DType::bf16, N * n, Il};
    s.out = {"attention out", DType::bf16, n, I};
    return s;
  }
  if (attn_slice == 0) {
    LS_CHECK_MSG(!where.kv_offload && !where.residual_offload, "K/V and residual offload need two-pass attention");
    s.kind = AttentionKind::stock;
    s.h = {"h", DType::bf16, S, D};
    s.qkv = PlannedBuffer{"qkv", DType::bf16, S, 3 * I};
    s.out = {"attention out", DType::bf16, S, I};
    return s;
  }
  const int64_t n = attn_slice;
  s.residual_slice = residual_slice(cfg, where, n);
  if (where.kv_offload) {
    // bf16 [kv_chunk, I] x 2 per tensor: the chunk attention reads and the next one
    // streaming in on the transfer queue. Pass 1 computes K and V into them and copies
    // each finished chunk to pinned host memory (the GEMMs are row-invariant).
    LS_CHECK_MSG(where.kv_chunk > 0, "K/V offload needs a resolved kv_chunk");
    s.kind = AttentionKind::offloaded_kv;
    for (int j = 0; j < 2; ++j) {
      s.k_chunk[j] = PlannedBuffer{"K chunk " + std::to_string(j), DType::bf16, where.kv_chunk, I};
      s.v_chunk[j] = PlannedBuffer{"V chunk " + std::to_string(j), DType::bf16, where.kv_chunk, I};
    }
    // f32 [n, H, Dh + 8]: each (query, head)'s running max, sum and accumulator, carried
    // from one K/V chunk to the next (backend.h AttentionParams::state).
    s.state = PlannedBuffer{"attention state", DType::f32, n, cfg.heads * (cfg.head_dim + kAttentionStateExtra)};
  } else {
    s.kind = AttentionKind::resident_kv;
    s.k = PlannedBuffer{"K", DType::bf16, S, I};
    s.v = PlannedBuffer{"V", DType::bf16, S, I};
  }
  s.h = {"h", DType::bf16, n, D};
  s.q = PlannedBuffer{"Q", DType::bf16, n, I};
  s.out = {"attention out", DType::bf16, n, I};
  return s;
}

}  // namespace

// [int8 attention] (docs/int8-attention.md §6): the statistics, and the prepared keys of all
// S keys (of this rank's heads with sequence parallel) or two chunk buffers with K/V offload.
AttnSpecs attention_specs(const h3::H3Config& cfg, int64_t S, int64_t attn_slice, const Placement& where) {
  AttnSpecs s = bf16_attention_specs(cfg, S, attn_slice, where);
  if (!where.int8_attention) return s;
  const int64_t Hl = cfg.heads / std::max<int64_t>(1, where.ranks), Dh = cfg.head_dim;
  const int64_t keys = where.ranks > 1 ? where.ranks * where.rank_rows : S;
  if (s.kind == AttentionKind::stock) {  // one scratch for attention_int8_all (statistics + keys)
    s.int8_keys = PlannedBuffer{"int8 attention scratch", DType::u8, 1, int8_all_scratch_bytes(S, Hl, Dh)};
    return s;
  }
  s.int8_stats = PlannedBuffer{"int8 key statistics and V scales", DType::u8, 1, int8_tables_bytes(keys, Hl, Dh)};
  if (s.kind == AttentionKind::offloaded_kv) {
    for (int j = 0; j < 2; ++j)
      s.int8_chunk[j] =
          PlannedBuffer{"int8 key chunk " + std::to_string(j), DType::u8, 1, int8_keys_bytes(where.kv_chunk, Hl, Dh)};
    // The bf16 K, V are compute-queue scratch here (computed, prepared, never copied: the
    // int8 chunks are what crosses), one statistics block at a time (contract v3: a block's
    // keys are prepared once the block has been seen), so one pair of a block's rows serves.
    const int64_t scratch = std::min(S, kInt8StatBlock);
    s.k_chunk[0] = PlannedBuffer{"K chunk 0 (int8: bf16 scratch)", DType::bf16, scratch, cfg.inner()};
    s.v_chunk[0] = PlannedBuffer{"V chunk 0 (int8: bf16 scratch)", DType::bf16, scratch, cfg.inner()};
    s.k_chunk[1].reset();
    s.v_chunk[1].reset();
  } else {
    s.int8_keys = PlannedBuffer{"int8 keys", DType::u8, 1, int8_keys_bytes(keys, Hl, Dh)};
  }
  return s;
}

MlpSpecs mlp_specs(const h3::H3Config& cfg, int64_t n, const Placement& where) {
  n = cap(n, where);
  MlpSpecs s;
  s.residual_slice = residual_slice(cfg, where, n);
  s.h = {"h", DType::bf16, n, cfg.hidden};
  s.fc1_out = {"fc1 out", DType::bf16, n, 2 * cfg.ffn};
  s.swiglu_out = {"swiglu out", DType::bf16, n, cfg.ffn};
  return s;
}

FinalSpecs final_specs(const h3::H3Config& cfg, int64_t n, const Placement& where) {
  const int64_t D = cfg.hidden, Pv = cfg.video_patch_dim();
  n = cap(n, where);
  FinalSpecs s;
  s.residual_slice = residual_slice(cfg, where, n);
  if (cfg.pdd_heads > 1) {
    s.pdd_head = PlannedBuffer{"PDD video head", DType::f32, Pv, D};
    s.pdd_bias = PlannedBuffer{"PDD video bias", DType::f32, Pv, 1};
  }
  s.h = {"h", DType::bf16, n, D};
  s.modulated = {"modulated rows", DType::f32, n, D};
  s.head_out = {"head out", DType::f32, n, patch_width(cfg)};
  return s;
}

PersistentSpecs persistent_specs(const h3::H3Config& cfg, const Plan& plan) {
  PersistentSpecs s = persistent_specs(cfg, plan.sizes, plan.placement());
  LS_CHECK_MSG(same_specs(s.list(), plan.persistent), "the plan's persistent buffers are not what its sizes give");
  return s;
}
EmbedSpecs embed_specs(const h3::H3Config& cfg, const Plan& plan) {
  return checked(embed_specs(cfg, plan.mlp_slice, plan.placement()), plan.phase("embed"));
}
AttnSpecs attention_specs(const h3::H3Config& cfg, const Plan& plan) {
  return checked(attention_specs(cfg, plan.sizes.S, plan.attn_slice, plan.placement()), plan.phase("attn"));
}
MlpSpecs mlp_specs(const h3::H3Config& cfg, const Plan& plan) {
  return checked(mlp_specs(cfg, plan.mlp_slice, plan.placement()), plan.phase("mlp"));
}
FinalSpecs final_specs(const h3::H3Config& cfg, const Plan& plan) {
  return checked(final_specs(cfg, plan.final_slice, plan.placement()), plan.phase("final"));
}

}  // namespace ls::exec
