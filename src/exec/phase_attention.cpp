#include "exec/phase_attention.h"

#include <algorithm>

namespace ls::exec {

Expected<KvOffload> KvOffload::create(Backend& be, Arena& pinned, int64_t S, int64_t I, int64_t chunk) {
  KvOffload kv;
  kv.chunk = chunk;
  pinned.rewind(Arena::Mark{0});
  LS_ASSIGN_OR_RETURN(kv.k_host, pinned.alloc(DType::bf16, {S, I}, "host K"));
  LS_ASSIGN_OR_RETURN(kv.v_host, pinned.alloc(DType::bf16, {S, I}, "host V"));
  for (int j = 0; j < 2; ++j) {
    LS_ASSIGN_OR_RETURN(kv.computed[j], be.take_fence());
    LS_ASSIGN_OR_RETURN(kv.saved[j], be.take_fence());
    LS_ASSIGN_OR_RETURN(kv.loaded[j], be.take_fence());
    LS_ASSIGN_OR_RETURN(kv.used[j], be.take_fence());
  }
  return kv;
}

namespace {

Status attention_stock(ForwardState& st, const AttnSpecs& sp, const h3::DitBlock& blk, int64_t kv_tile) {
  LS_CHECK_MSG(!st.residual_offload, "stock attention reads every residual row: no residual offload");
  const int64_t S = st.S;
  LS_ASSIGN_OR_RETURN(TensorView h, alloc_rows(st.arena, sp.h, S));
  LS_ASSIGN_OR_RETURN(TensorView qkv, alloc_rows(st.arena, *sp.qkv, S));
  LS_ASSIGN_OR_RETURN(TensorView o, alloc_rows(st.arena, sp.out, S));
  return blk.attn_fused(h3::BlockRows{st.x, st.rope, st.mod_rows, 0}, h, qkv, o, kv_tile);
}

Status attention_resident_kv(ForwardState& st, const AttnSpecs& sp, const h3::DitBlock& blk, int64_t slice,
                             int64_t kv_tile) {
  Arena& arena = st.arena;
  const int64_t S = st.S, H = st.cfg.heads, Dh = st.cfg.head_dim;
  LS_ASSIGN_OR_RETURN(TensorView rs, st.residual_slice(sp.residual_slice, slice));
  LS_ASSIGN_OR_RETURN(TensorView k2, alloc_rows(arena, *sp.k, S));  // bf16 [S, I]
  LS_ASSIGN_OR_RETURN(TensorView v2, alloc_rows(arena, *sp.v, S));  // bf16 [S, I]
  st.phase_kv = static_cast<uint64_t>(k2.nbytes() + v2.nbytes());
  const TensorView k_all = k2.unflatten_last(H, Dh), v_all = v2.unflatten_last(H, Dh);  // bf16 [S, H, Dh]
  // Pass 1: K and V of every row before any residual row changes.
  for (int64_t a = 0; a < S; a += slice) {
    const int64_t b = std::min(S, a + slice);
    Arena::Scope slice_scope(arena);
    LS_ASSIGN_OR_RETURN(TensorView h, alloc_rows(arena, sp.h, b - a));
    LS_ASSIGN_OR_RETURN(const h3::BlockRows r, st.residual_in(rs, a, b));
    LS_TRY(blk.attn_kv(r, a, b, k_all.slice_rows(a, b), v_all.slice_rows(a, b), h));
  }
  LS_TRY(st.mark("attention pass 1"));
  // Pass 2: per slice Q, attention against all keys, out-projection, gated add.
  for (int64_t a = 0; a < S; a += slice) {
    const int64_t b = std::min(S, a + slice);
    Arena::Scope slice_scope(arena);
    LS_ASSIGN_OR_RETURN(TensorView h, alloc_rows(arena, sp.h, b - a));
    LS_ASSIGN_OR_RETURN(TensorView q, alloc_rows(arena, *sp.q, b - a));
    LS_ASSIGN_OR_RETURN(TensorView o, alloc_rows(arena, sp.out, b - a));
    LS_ASSIGN_OR_RETURN(const h3::BlockRows r, st.residual_in(rs, a, b));
    LS_TRY(blk.attn_q_out(r, a, b, k_all, v_all, h, q, o, kv_tile));
    LS_TRY(st.residual_out(r, a, b));
  }
  return Status();
}

Status attention_offloaded_kv(ForwardState& st, const AttnSpecs& sp, const h3::DitBlock& blk, int64_t slice,
                              int64_t kv_tile, KvOffload& kv) {
  Backend& be = st.be;
  Arena& arena = st.arena;
  const int64_t S = st.S, H = st.cfg.heads, Dh = st.cfg.head_dim, I = st.cfg.inner();
  const int64_t chunk = kv.chunk, n_chunks = (S + chunk - 1) / chunk;
  LS_ASSIGN_OR_RETURN(TensorView rs, st.residual_slice(sp.residual_slice, slice));
  // Two device chunk buffers per tensor of `chunk` rows (a multiple of kv_tile, so
  // chunks hold whole key tiles). Allocated K0, V0, K1, V1 (the plan lists K0, K1, V0,
  // V1: equal sizes, so the same bytes in all).
  TensorView kc[2], vc[2];
  for (int j = 0; j < 2; ++j) {
    LS_ASSIGN_OR_RETURN(kc[j], alloc_rows(arena, *sp.k_chunk[j], chunk));
    LS_ASSIGN_OR_RETURN(vc[j], alloc_rows(arena, *sp.v_chunk[j], chunk));
    st.phase_kv += static_cast<uint64_t>(kc[j].nbytes() + vc[j].nbytes());
  }
  // Pass 1: chunk c into buffer c % 2, then out to the host on the transfer queue.
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int64_t k0 = c * chunk, k1 = std::min(S, k0 + chunk);
    const int j = static_cast<int>(c % 2);
    LS_TRY(kv.saved[j].wait(Queue::compute));  // chunk c - 2's copy out is done
    for (int64_t a = k0; a < k1; a += slice) {
      const int64_t b = std::min(k1, a + slice);
      Arena::Scope slice_scope(arena);
      LS_ASSIGN_OR_RETURN(TensorView h, alloc_rows(arena, sp.h, b - a));
      LS_ASSIGN_OR_RETURN(const h3::BlockRows r, st.residual_in(rs, a, b));
      LS_TRY(blk.attn_kv(r, a, b, kc[j].slice_rows(a - k0, b - k0).unflatten_last(H, Dh),
                         vc[j].slice_rows(a - k0, b - k0).unflatten_last(H, Dh), h));
    }
    LS_TRY(kv.computed[j].signal(Queue::compute));
    LS_TRY(kv.computed[j].wait(Queue::transfer));
    LS_TRY(be.copy_async(kv.k_host.slice_rows(k0, k1), kc[j].slice_rows(0, k1 - k0), Queue::transfer));
    LS_TRY(be.copy_async(kv.v_host.slice_rows(k0, k1), vc[j].slice_rows(0, k1 - k0), Queue::transfer));
    LS_TRY(kv.saved[j].signal(Queue::transfer));
    st.kv_bytes += static_cast<uint64_t>(2 * (k1 - k0) * I * 2);
  }
  LS_TRY(st.mark("attention pass 1"));
  // Pass 2: for every slice, every chunk in order; load g streams chunk g % n_chunks
  // into buffer g % 2 two steps ahead of its use.
  const int64_t n_slices = (S + slice - 1) / slice, total = n_slices * n_chunks;
  auto load = [&](int64_t g) -> Status {
    const int64_t c = g % n_chunks, k0 = c * chunk, k1 = std::min(S, k0 + chunk);
    const int j = static_cast<int>(g % 2);
    LS_TRY(kv.used[j].wait(Queue::transfer));  // attention on chunk g - 2 is done
    LS_TRY(be.copy_async(kc[j].slice_rows(0, k1 - k0), kv.k_host.slice_rows(k0, k1), Queue::transfer));
    LS_TRY(be.copy_async(vc[j].slice_rows(0, k1 - k0), kv.v_host.slice_rows(k0, k1), Queue::transfer));
    st.kv_bytes += static_cast<uint64_t>(2 * (k1 - k0) * I * 2);
    return kv.loaded[j].signal(Queue::transfer);
  };
  for (int64_t g = 0; g < std::min<int64_t>(2, total); ++g) LS_TRY(load(g));
  int64_t g = 0;
  for (int64_t a = 0; a < S; a += slice) {
    const int64_t b = std::min(S, a + slice);
    Arena::Scope slice_scope(arena);
    LS_ASSIGN_OR_RETURN(TensorView h, alloc_rows(arena, sp.h, b - a));
    LS_ASSIGN_OR_RETURN(TensorView q, alloc_rows(arena, *sp.q, b - a));
    LS_ASSIGN_OR_RETURN(TensorView o, alloc_rows(arena, sp.out, b - a));
    LS_ASSIGN_OR_RETURN(TensorView state, alloc_rows(arena, *sp.state, b - a));
    LS_ASSIGN_OR_RETURN(const h3::BlockRows r, st.residual_in(rs, a, b));
    LS_TRY(blk.attn_q(r, a, b, h, q));
    AttentionParams ap;
    ap.kv_tile = kv_tile;
    ap.state = TensorView(state.data, DType::f32, {b - a, H, Dh + kAttentionStateExtra}, state.device);
    for (int64_t c = 0; c < n_chunks; ++c, ++g) {
      const int64_t k0 = c * chunk, k1 = std::min(S, k0 + chunk);
      const int j = static_cast<int>(g % 2);
      LS_TRY(kv.loaded[j].wait(Queue::compute));
      ap.state_in = c > 0;
      ap.finalize = c == n_chunks - 1;
      LS_TRY(be.attention(q.unflatten_last(H, Dh), kc[j].slice_rows(0, k1 - k0).unflatten_last(H, Dh),
                          vc[j].slice_rows(0, k1 - k0).unflatten_last(H, Dh), o.unflatten_last(H, Dh), ap));
      LS_TRY(kv.used[j].signal(Queue::compute));
      if (g + 2 < total) LS_TRY(load(g + 2));
    }
    LS_TRY(blk.attn_out(r, a, b, o, h));
    LS_TRY(st.residual_out(r, a, b));
  }
  return Status();
}

}  // namespace

Status run_attention(ForwardState& st, const AttnSpecs& specs, const h3::DitBlock& blk, int64_t slice, int64_t kv_tile,
                     KvOffload* kv) {
  // The phase's buffers are rewound at scope exit and the next phase may reuse the
  // bytes at once: queued work is ordered on the compute queue, and every transfer into
  // or out of these buffers was waited for by compute above. On a backend with queues
  // the transfer queue is idle here except for weight copies.
  Arena::Scope phase(st.arena);
  switch (specs.kind) {
    case AttentionKind::stock: return attention_stock(st, specs, blk, kv_tile);
    case AttentionKind::resident_kv: return attention_resident_kv(st, specs, blk, slice, kv_tile);
    case AttentionKind::offloaded_kv:
      LS_CHECK_MSG(kv != nullptr, "K/V offload without its host buffers and fences");
      return attention_offloaded_kv(st, specs, blk, slice, kv_tile, *kv);
  }
  return Status();
}

}  // namespace ls::exec
