#include "exec/phase_attention.h"

#include <algorithm>
#include <optional>

namespace ls::exec {

uint64_t KvOffload::host_bytes(int64_t S, int64_t I, int64_t int8_heads) {
  if (int8_heads > 0)
    return Arena::aligned_bytes(static_cast<size_t>(S * (I + 4 * int8_heads))) +
           Arena::aligned_bytes(static_cast<size_t>(S * I));
  return 2 * Arena::aligned_bytes(static_cast<size_t>(S * I * 2));
}

Expected<KvOffload> KvOffload::create(Backend& be, Arena& pinned, int64_t S, int64_t I, int64_t chunk,
                                      int64_t int8_heads) {
  KvOffload kv;
  kv.chunk = chunk;
  pinned.rewind(Arena::Mark{0});
  if (int8_heads > 0) {
    LS_ASSIGN_OR_RETURN(kv.k_host, pinned.alloc(DType::u8, {S, I + 4 * int8_heads}, "host K (int8: k8 | sk)"));
    LS_ASSIGN_OR_RETURN(kv.v_host, pinned.alloc(DType::u8, {S, I}, "host V (int8: v8t)"));
  } else {
    LS_ASSIGN_OR_RETURN(kv.k_host, pinned.alloc(DType::bf16, {S, I}, "host K"));
    LS_ASSIGN_OR_RETURN(kv.v_host, pinned.alloc(DType::bf16, {S, I}, "host V"));
  }
  for (int j = 0; j < 2; ++j) {
    LS_ASSIGN_OR_RETURN(kv.computed[j], be.take_fence());
    LS_ASSIGN_OR_RETURN(kv.saved[j], be.take_fence());
    LS_ASSIGN_OR_RETURN(kv.loaded[j], be.take_fence());
    LS_ASSIGN_OR_RETURN(kv.used[j], be.take_fence());
  }
  return kv;
}

namespace {

// [int8 attention] views over the byte buffers of AttnSpecs::int8_* (docs/int8-attention.md §6).
// The statistics f32 [2 + NB, H, Dh] and the V-scale table f32 [NB, 2, H, Dh] of a sequence of
// S keys (one buffer, AttnSpecs::int8_stats), and the prepared keys of n keys from key k0.
struct Int8Tables {
  TensorView stats, vs;
};
Int8Tables int8_tables_of(const TensorView& bytes, int64_t S, int64_t H, int64_t Dh) {
  const auto [stats, vs] = int8_tables_view(bytes.data, S, H, Dh, bytes.device);
  return {stats, vs};
}
Int8Keys int8_keys_of(const TensorView& bytes, int64_t n, int64_t H, int64_t Dh, const TensorView& vs) {
  return int8_keys_view(bytes.data, n, H, Dh, bytes.device, vs);
}

// The device buffers of K/V offload (bf16 and int8): two chunk buffers per tensor of
// `chunk` rows (a multiple of kv_tile, so chunks hold whole key tiles), allocated K0, V0,
// K1, V1 (the plan lists K0, K1, V0, V1: equal sizes, so the same bytes in all); then the
// per-slice buffers once, at the first (largest) slice of n0 rows (a shorter slice uses a
// prefix).
struct OffloadBuffers {
  TensorView kc[2], vc[2];
  TensorView h, q, o, state;  // bf16 [n, D], bf16 [n, I], bf16 [n, I], f32 [n, H (Dh + 8)]
};
Expected<OffloadBuffers> offload_buffers(ForwardState& st, const AttnSpecs& sp, int64_t n0) {
  OffloadBuffers b;
  for (int j = 0; j < 2; ++j) {
    if (!sp.k_chunk[j]) continue;  // int8: one bf16 pair of one statistics block
    // Rows as planned: kv_chunk (bf16), min(S, kInt8StatBlock) (int8 scratch).
    LS_ASSIGN_OR_RETURN(b.kc[j], alloc_rows(st.arena, *sp.k_chunk[j], sp.k_chunk[j]->rows));
    LS_ASSIGN_OR_RETURN(b.vc[j], alloc_rows(st.arena, *sp.v_chunk[j], sp.v_chunk[j]->rows));
    st.phase_kv += static_cast<uint64_t>(b.kc[j].nbytes() + b.vc[j].nbytes());
  }
  LS_ASSIGN_OR_RETURN(b.h, alloc_rows(st.arena, sp.h, n0));
  LS_ASSIGN_OR_RETURN(b.q, alloc_rows(st.arena, *sp.q, n0));
  LS_ASSIGN_OR_RETURN(b.o, alloc_rows(st.arena, sp.out, n0));
  LS_ASSIGN_OR_RETURN(b.state, alloc_rows(st.arena, *sp.state, n0));
  return b;
}

// Pass 1's end of chunk [k0, k1) in buffer j: compute signals computed[j]; the transfer
// queue waits for it, copies the bf16 K and V out to the host rows and signals saved[j].
Status copy_out_chunk(ForwardState& st, KvOffload& kv, const OffloadBuffers& b, int j, int64_t k0, int64_t k1) {
  LS_TRY(kv.computed[j].signal(Queue::compute));
  LS_TRY(kv.computed[j].wait(Queue::transfer));
  LS_TRY(st.be.copy_async(kv.k_host.slice_rows(k0, k1), b.kc[j].slice_rows(0, k1 - k0), Queue::transfer));
  LS_TRY(st.be.copy_async(kv.v_host.slice_rows(k0, k1), b.vc[j].slice_rows(0, k1 - k0), Queue::transfer));
  LS_TRY(kv.saved[j].signal(Queue::transfer));
  st.kv_bytes += static_cast<uint64_t>(2 * (k1 - k0) * st.cfg.inner() * 2);
  return Status();
}

// n queries against chunk c of n_chunks: the fp32 state carried in from chunk c - 1 and
// finalised on the last chunk.
AttentionParams chunk_params(const ForwardState& st, const TensorView& state, int64_t n, int64_t kv_tile, int64_t c,
                             int64_t n_chunks) {
  AttentionParams ap;
  ap.kv_tile = kv_tile;
  ap.state = TensorView(state.data, DType::f32, {n, st.cfg.heads, st.cfg.head_dim + kAttentionStateExtra}, state.device);
  ap.state_in = c > 0;
  ap.finalize = c == n_chunks - 1;
  return ap;
}

// [int8 attention] a prepared chunk of n keys as three 2-D views (k8 i8 [n, I], sk f32
// [n, H], v8t i8 [H Dh, n]): in the device chunk buffer `keys`, or over host K/V rows
// [k0, k1) (k8 | sk in host K's n (I + 4 H) bytes, v8t compact in host V's n I).
struct Int8ChunkViews {
  TensorView k8, sk, v8t;
  static Int8ChunkViews device(const Int8Keys& keys, int64_t n, int64_t I, int64_t H, int64_t Dh) {
    const Int8Keys k = keys.slice(0, n);
    TensorView v8t(k.v8t.data, DType::i8, {H * Dh, n}, k.v8t.device);
    v8t.stride[0] = k.v8t.stride[1];  // ld: the chunk buffer's row stride
    return {TensorView(k.k8.data, DType::i8, {n, I}, k.k8.device), k.sk, v8t};
  }
  static Int8ChunkViews host(const KvOffload& kv, int64_t k0, int64_t k1, int64_t I, int64_t H, int64_t Dh) {
    const int64_t n = k1 - k0;
    char* hk = static_cast<char*>(kv.k_host.slice_rows(k0, k1).data);
    char* hv = static_cast<char*>(kv.v_host.slice_rows(k0, k1).data);
    return {TensorView(hk, DType::i8, {n, I}, kv.k_host.device), TensorView(hk + n * I, DType::f32, {n, H}, kv.k_host.device),
            TensorView(hv, DType::i8, {H * Dh, n}, kv.v_host.device)};
  }
};

// The residual rows of an offloaded attention's first walk: the first query slice [0, n0)
// (its Q), then keys [0, S) group by group (chunks of `group` rows: bf16 K/V chunks, int8
// statistics blocks), each in sub-slices of at most `slice` rows (the GEMMs are row-invariant).
RowRanges q_then_groups(int64_t n0, int64_t S, int64_t group, int64_t slice) {
  RowRanges rows{{0, n0}};
  for (int64_t g0 = 0; g0 < S; g0 += group)
    for (const auto& ab : row_slices(g0, std::min(S, g0 + group), slice)) rows.push_back(ab);
  return rows;
}

// Rows [a, b) of one walk: Q into q (h is scratch), or the out-projection and gated add of
// the attention output o (h is scratch). The offloaded paths run these for the first query
// slice, whose attention is done chunk by chunk in between (pass 1 or the int8 prepare).
Status walk_q(ResidualWalk& walk, const h3::DitBlock& blk, int64_t a, int64_t b, const TensorView& h,
              const TensorView& q) {
  LS_ASSIGN_OR_RETURN(const h3::BlockRows r, walk.in(a, b));
  LS_TRY(blk.attn_q(r, a, b, h, q));
  return walk.out(r, a, b);
}
Status walk_out(ResidualWalk& walk, const h3::DitBlock& blk, int64_t a, int64_t b, const TensorView& o,
                const TensorView& h) {
  LS_ASSIGN_OR_RETURN(const h3::BlockRows r, walk.in(a, b));
  LS_TRY(blk.attn_out(r, a, b, o, h));
  return walk.out(r, a, b);
}

// Pass 2 of K/V offload over the query slices `slices` (g = 0, 1 loaded before): per slice
// its Q, then every chunk c in order from buffer j = g % 2 (wait loaded[j], attend(a, b, c,
// j), signal used[j], load(g + 2) while one is left), then its out-projection and gated add.
template <typename Load, typename Attend>
Status stream_chunks(ForwardState& st, ResidualWalk& walk2, const h3::DitBlock& blk, const OffloadBuffers& bufs,
                     KvOffload& kv, const RowRanges& slices, int64_t n_chunks, const Load& load, const Attend& attend) {
  const int64_t total = static_cast<int64_t>(slices.size()) * n_chunks;
  for (int64_t g = 0; g < std::min<int64_t>(2, total); ++g) LS_TRY(load(g));
  int64_t g = 0;
  for (const auto& [a, b] : slices) {
    const int64_t n = b - a;
    LS_ASSIGN_OR_RETURN(const h3::BlockRows r, walk2.in(a, b));
    LS_TRY(blk.attn_q(r, a, b, bufs.h.slice_rows(0, n), bufs.q.slice_rows(0, n)));
    for (int64_t c = 0; c < n_chunks; ++c, ++g) {
      const int j = static_cast<int>(g % 2);
      LS_TRY(kv.loaded[j].wait(Queue::compute));
      LS_TRY(attend(a, b, c, j));
      LS_TRY(kv.used[j].signal(Queue::compute));
      if (g + 2 < total) LS_TRY(load(g + 2));
    }
    LS_TRY(blk.attn_out(r, a, b, bufs.o.slice_rows(0, n), bufs.h.slice_rows(0, n)));
    LS_TRY(walk2.out(r, a, b));
  }
  return Status();
}

Status attention_stock(ForwardState& st, const AttnSpecs& sp, const h3::DitBlock& blk, int64_t kv_tile) {
  LS_CHECK_MSG(!st.residual_offload, "stock attention reads every residual row: no residual offload");
  const int64_t S = st.S;
  LS_ASSIGN_OR_RETURN(TensorView h, alloc_rows(st.arena, sp.h, S));
  LS_ASSIGN_OR_RETURN(TensorView qkv, alloc_rows(st.arena, *sp.qkv, S));
  LS_ASSIGN_OR_RETURN(TensorView o, alloc_rows(st.arena, sp.out, S));
  TensorView int8_scratch;
  if (sp.int8_keys) {
    LS_ASSIGN_OR_RETURN(int8_scratch, alloc_rows(st.arena, *sp.int8_keys, 1));
  }
  return blk.attn_fused(h3::BlockRows{st.x, st.rope, st.mod_rows, 0}, h, qkv, o, kv_tile, int8_scratch);
}

Status attention_resident_kv(ForwardState& st, const AttnSpecs& sp, const h3::DitBlock& blk, int64_t slice,
                             int64_t kv_tile) {
  Arena& arena = st.arena;
  const int64_t S = st.S, H = st.cfg.heads, Dh = st.cfg.head_dim, n0 = std::min(S, slice);
  LS_ASSIGN_OR_RETURN(const ResidualBuffers rs, st.residual_buffers(sp.residual_slice, n0));
  LS_ASSIGN_OR_RETURN(TensorView k2, alloc_rows(arena, *sp.k, S));  // bf16 [S, I]
  LS_ASSIGN_OR_RETURN(TensorView v2, alloc_rows(arena, *sp.v, S));  // bf16 [S, I]
  st.phase_kv = static_cast<uint64_t>(k2.nbytes() + v2.nbytes());
  const TensorView k_all = k2.unflatten_last(H, Dh), v_all = v2.unflatten_last(H, Dh);  // bf16 [S, H, Dh]
  // The per-slice buffers once, at the largest slice (a shorter last slice uses a prefix).
  LS_ASSIGN_OR_RETURN(TensorView h, alloc_rows(arena, sp.h, n0));    // bf16 [n, D]
  LS_ASSIGN_OR_RETURN(TensorView q, alloc_rows(arena, *sp.q, n0));   // bf16 [n, I]
  LS_ASSIGN_OR_RETURN(TensorView o, alloc_rows(arena, sp.out, n0));  // bf16 [n, I]
  // [int8 attention] the statistics, accumulated slice by slice in pass 1, and the keys
  // prepared once after it (docs/int8-attention.md §6).
  const bool int8 = sp.int8_stats.has_value();
  Int8Tables tables;
  Int8Keys keys;
  if (int8) {
    LS_ASSIGN_OR_RETURN(const TensorView sb, alloc_rows(arena, *sp.int8_stats, 1));
    LS_ASSIGN_OR_RETURN(const TensorView kb, alloc_rows(arena, *sp.int8_keys, 1));
    tables = int8_tables_of(sb, S, H, Dh);
    keys = int8_keys_of(kb, S, H, Dh, tables.vs);
  }
  // Pass 1: K and V of every row before any residual row changes.
  LS_ASSIGN_OR_RETURN(ResidualWalk walk1, ResidualWalk::begin(st, rs, row_slices(0, S, slice), /*reads=*/true,
                                                              /*writes=*/false));
  for (const auto& [a, b] : row_slices(0, S, slice)) {
    LS_ASSIGN_OR_RETURN(const h3::BlockRows r, walk1.in(a, b));
    LS_TRY(blk.attn_kv(r, a, b, k_all.slice_rows(a, b), v_all.slice_rows(a, b), h.slice_rows(0, b - a)));
    if (int8) LS_TRY(st.be.int8_key_stats(k_all.slice_rows(a, b), v_all.slice_rows(a, b), tables.stats, a, a == 0));
    LS_TRY(walk1.out(r, a, b));
  }
  LS_TRY(walk1.finish());
  if (int8) LS_TRY(st.be.int8_prepare(k_all, v_all, tables.stats, keys));
  LS_TRY(st.mark("attention pass 1"));
  // Pass 2: per slice Q, attention against all keys, out-projection, gated add.
  LS_ASSIGN_OR_RETURN(ResidualWalk walk2, ResidualWalk::begin(st, rs, row_slices(0, S, slice), /*reads=*/true,
                                                              /*writes=*/true));
  for (const auto& [a, b] : row_slices(0, S, slice)) {
    const int64_t n = b - a;
    LS_ASSIGN_OR_RETURN(const h3::BlockRows r, walk2.in(a, b));
    if (int8) {  // attn_q_out with attention_int8 against the prepared keys
      LS_TRY(blk.attn_q(r, a, b, h.slice_rows(0, n), q.slice_rows(0, n)));
      AttentionParams ap;
      ap.kv_tile = kv_tile;
      LS_TRY(st.be.attention_int8(q.slice_rows(0, n).unflatten_last(H, Dh), keys,
                                  o.slice_rows(0, n).unflatten_last(H, Dh), ap));
      LS_TRY(blk.attn_out(r, a, b, o.slice_rows(0, n), h.slice_rows(0, n)));
    } else {
      LS_TRY(blk.attn_q_out(r, a, b, k_all, v_all, h.slice_rows(0, n), q.slice_rows(0, n), o.slice_rows(0, n),
                            kv_tile));
    }
    LS_TRY(walk2.out(r, a, b));
  }
  return walk2.finish();
}

// K/V offload. Pass 1 computes chunk c of K and V into device buffer j = c % 2 and
// copies it out on the transfer queue; while that copy runs, the compute queue attends
// the FIRST query slice [0, n0) against the chunk still in its buffer (its Q computed
// first, its fp32 state carried from chunk to chunk in ascending order, exactly the
// calls pass 2 would make for it), so pass 1's copies hide behind that attention instead
// of behind the short K/V GEMMs alone. Pass 2 then out-projects slice 0 and streams the
// chunks back for slices 1.. only. A query's bits do not depend on where its key tiles
// come from (backend.h's chunked-attention contract), so every row equals the
// one-call result. Fences per chunk buffer j (KvOffload):
//   pass 1  compute waits saved[j] (chunk c - 2's copy out) before writing the buffer,
//           signals computed[j]; transfer waits computed[j], copies out, signals saved[j];
//           compute attends slice 0 on the buffer, signals used[j]
//   pass 2  transfer waits used[j] before loading a chunk into j, signals loaded[j];
//           compute waits loaded[j], attends, signals used[j]
// The first query slice's h, Q, out and state buffers are the ones pass 2 uses for
// every slice, so pass 1 holds no buffer pass 2 does not (the plan's attention phase).
Status attention_offloaded_kv(ForwardState& st, const AttnSpecs& sp, const h3::DitBlock& blk, int64_t slice,
                              int64_t kv_tile, KvOffload& kv) {
  Backend& be = st.be;
  const int64_t S = st.S, H = st.cfg.heads, Dh = st.cfg.head_dim, I = st.cfg.inner();
  const int64_t chunk = kv.chunk, n_chunks = (S + chunk - 1) / chunk;
  const int64_t n0 = std::min(S, slice);  // the first query slice is rows [0, n0)
  LS_ASSIGN_OR_RETURN(const ResidualBuffers rs, st.residual_buffers(sp.residual_slice, n0));
  LS_ASSIGN_OR_RETURN(const OffloadBuffers bufs, offload_buffers(st, sp, n0));
  const auto& [kc, vc, h, q, o, state] = bufs;
  // Queries [a, b) (in q) against chunk c (in buffer j), the state carried in from chunk
  // c - 1 and finalised into o on the last chunk.
  auto attend = [&](int64_t a, int64_t b, int64_t c, int j) -> Status {
    const int64_t n = b - a, k0 = c * chunk, k1 = std::min(S, k0 + chunk);
    const AttentionParams ap = chunk_params(st, state, n, kv_tile, c, n_chunks);
    return be.attention(q.slice_rows(0, n).unflatten_last(H, Dh), kc[j].slice_rows(0, k1 - k0).unflatten_last(H, Dh),
                        vc[j].slice_rows(0, k1 - k0).unflatten_last(H, Dh), o.slice_rows(0, n).unflatten_last(H, Dh),
                        ap);
  };
  // Pass 1's residual rows: the first query slice (its Q), then each chunk's rows in
  // sub-slices of at most `slice` rows (the GEMMs are row-invariant).
  LS_ASSIGN_OR_RETURN(ResidualWalk walk1, ResidualWalk::begin(st, rs, q_then_groups(n0, S, chunk, slice),
                                                              /*reads=*/true, /*writes=*/false));
  LS_TRY(walk_q(walk1, blk, 0, n0, h, q));  // h is scratch: the K/V sub-slices reuse it below
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int64_t k0 = c * chunk, k1 = std::min(S, k0 + chunk);
    const int j = static_cast<int>(c % 2);
    LS_TRY(kv.saved[j].wait(Queue::compute));  // chunk c - 2's copy out is done
    for (const auto& [a, b] : row_slices(k0, k1, slice)) {
      LS_ASSIGN_OR_RETURN(const h3::BlockRows r, walk1.in(a, b));
      LS_TRY(blk.attn_kv(r, a, b, kc[j].slice_rows(a - k0, b - k0).unflatten_last(H, Dh),
                         vc[j].slice_rows(a - k0, b - k0).unflatten_last(H, Dh), h.slice_rows(0, b - a)));
      LS_TRY(walk1.out(r, a, b));
    }
    LS_TRY(copy_out_chunk(st, kv, bufs, j, k0, k1));
    // The first query slice against chunk c, behind the copy out (both only read the buffer).
    LS_TRY(attend(0, n0, c, j));
    LS_TRY(kv.used[j].signal(Queue::compute));
  }
  LS_TRY(walk1.finish());
  LS_TRY(st.mark("attention pass 1"));
  // Pass 2: slice 0's out-projection and gated add (its attention is done), then for
  // every further slice every chunk in order; load g streams chunk g % n_chunks into
  // buffer g % 2 two steps ahead of its use.
  LS_ASSIGN_OR_RETURN(ResidualWalk walk2, ResidualWalk::begin(st, rs, row_slices(0, S, slice), /*reads=*/true,
                                                              /*writes=*/true));
  LS_TRY(walk_out(walk2, blk, 0, n0, o, h));
  auto load = [&](int64_t g) -> Status {
    const int64_t c = g % n_chunks, k0 = c * chunk, k1 = std::min(S, k0 + chunk);
    const int j = static_cast<int>(g % 2);
    LS_TRY(kv.used[j].wait(Queue::transfer));  // attention on the buffer's previous chunk is done
    LS_TRY(be.copy_async(kc[j].slice_rows(0, k1 - k0), kv.k_host.slice_rows(k0, k1), Queue::transfer));
    LS_TRY(be.copy_async(vc[j].slice_rows(0, k1 - k0), kv.v_host.slice_rows(k0, k1), Queue::transfer));
    st.kv_bytes += static_cast<uint64_t>(2 * (k1 - k0) * I * 2);
    return kv.loaded[j].signal(Queue::transfer);
  };
  LS_TRY(stream_chunks(st, walk2, blk, bufs, kv, row_slices(n0, S, slice), n_chunks, load, attend));
  // With one query slice no pass-2 load follows pass 1's last copies out, and nothing
  // waits for them: they only READ the chunk buffers, so the next phase may take the
  // bytes at once. What they then write to host K/V is rewritten (in queue order) by the
  // next block's pass 1 before any load reads it.
  return walk2.finish();
}

// [int8 attention] K/V offload (docs/int8-attention.md §6). Two walks. Chunks of `chunk`
// keys (whole kv_tiles) go through int8 chunk buffers q8[j], j = c % 2; the statistics are
// per absolute block of kInt8StatBlock keys (contract v3), so a key can be prepared as soon
// as its own block (and block 0) has been seen:
//   prepare  the first query slice's Q; then block by block: the block's bf16 K, V computed
//            from its residual rows into ONE compute-queue scratch pair kc[0], vc[0] (a
//            block's rows), its statistics (reset on block 0, which also gives K's centre),
//            and int8_prepare of each of its segments (the block's keys within one chunk)
//            into the chunk's buffer q8[j] at the segment's offset. When a chunk's last
//            segment is prepared, the prepared chunk is copied out to host K/V rows [k0, k1)
//            (k8 | sk in host K's n (I + 4 H) bytes, v8t compact in host V's n I), and while
//            that copy runs the first query slice attends the chunk still in q8[j] (its fp32
//            state carried chunk to chunk in ascending order: exactly the calls pass 2 would
//            make for it), so the copies hide behind that attention.
//   pass 2   slice 0's out-projection, then every further query slice against every prepared
//            chunk streamed into q8[g % 2] two loads ahead, carrying the fp32 state.
// Per block: S (2 I + 4 H) bytes out, the same in per query slice after the first; the K/V
// GEMMs run once and (with residual offload) the residual rows are read as bf16 offload
// reads them. A query's bits do not depend on where its key tiles come from, so every row
// equals the one-call result. (Contract v2's statistics spanned all keys, so v2 ran a third
// walk first, pass 1, and computed K, V twice: ~5 % of the 3G forward, session 14.)
// Fences per buffer j: loaded (transfer -> compute), used (compute done reading q8[j]),
// computed (compute wrote q8[j]), saved (the copy out of q8[j] is done).
Status attention_offloaded_kv_int8(ForwardState& st, const AttnSpecs& sp, const h3::DitBlock& blk, int64_t slice,
                                   int64_t kv_tile, KvOffload& kv) {
  Backend& be = st.be;
  Arena& arena = st.arena;
  const int64_t S = st.S, H = st.cfg.heads, Dh = st.cfg.head_dim, I = st.cfg.inner();
  const int64_t chunk = kv.chunk, n_chunks = (S + chunk - 1) / chunk;
  const int64_t n0 = std::min(S, slice);  // the first query slice is rows [0, n0)
  LS_CHECK_MSG(I % 4 == 0, "int8 K/V offload keeps the f32 key scales after k8 in host K: I % 4 == 0");
  LS_CHECK_MSG(kv.k_host.dtype == DType::u8 && kv.k_host.size(1) == I + 4 * H && kv.v_host.size(1) == I,
               "int8 K/V offload needs the int8 host buffers (KvOffload::create with int8_heads = H)");
  LS_ASSIGN_OR_RETURN(const ResidualBuffers rs, st.residual_buffers(sp.residual_slice, n0));
  LS_ASSIGN_OR_RETURN(const OffloadBuffers bufs, offload_buffers(st, sp, n0));
  const auto& [kc, vc, h, q, o, state] = bufs;
  // The bf16 scratch holds one statistics block (or all keys when S is shorter).
  const int64_t block = std::min(S, kInt8StatBlock);
  LS_CHECK_MSG(kc[0].rows() >= block, "int8 K/V offload: the bf16 scratch holds " + std::to_string(kc[0].rows()) +
                                          " rows, less than a statistics block of " + std::to_string(block));
  Int8Keys q8[2];
  LS_ASSIGN_OR_RETURN(const TensorView sb, alloc_rows(arena, *sp.int8_stats, 1));
  const auto [stats, vs] = int8_tables_of(sb, S, H, Dh);
  // The V-scale table (every block's sv, rho) stays on the device; pass 2 streams k8, sk and
  // v8t only.
  for (int j = 0; j < 2; ++j) {
    LS_ASSIGN_OR_RETURN(const TensorView b, alloc_rows(arena, *sp.int8_chunk[j], 1));
    q8[j] = int8_keys_of(b, chunk, H, Dh, vs);
  }
  // Buffer j holding the chunk whose first key is k0.
  auto at = [&](int j, int64_t k0) {
    Int8Keys k = q8[j];
    k.k0 = k0;
    return k;
  };
  auto rows_of = [&](int64_t c) { return std::make_pair(c * chunk, std::min(S, (c + 1) * chunk)); };
  // The prepared chunk c (n keys) on the device (buffer j) and on the host.
  auto device_views = [&](int j, int64_t n) { return Int8ChunkViews::device(q8[j], n, I, H, Dh); };
  auto host_views = [&](int64_t c) {
    const auto [k0, k1] = rows_of(c);
    return Int8ChunkViews::host(kv, k0, k1, I, H, Dh);
  };
  // Queries [a, b) (in q) against the prepared chunk c (in q8[j]), the state carried in from
  // chunk c - 1 and finalised into o on the last chunk.
  auto attend = [&](int64_t a, int64_t b, int64_t c, int j) -> Status {
    const int64_t n = b - a;
    const auto [k0, k1] = rows_of(c);
    const AttentionParams ap = chunk_params(st, state, n, kv_tile, c, n_chunks);
    return be.attention_int8(q.slice_rows(0, n).unflatten_last(H, Dh), at(j, k0).slice(0, k1 - k0),
                             o.slice_rows(0, n).unflatten_last(H, Dh), ap);
  };
  const int64_t n_blocks = (S + block - 1) / block;
  LS_ASSIGN_OR_RETURN(ResidualWalk walk, ResidualWalk::begin(st, rs, q_then_groups(n0, S, block, slice),
                                                             /*reads=*/true, /*writes=*/false));
  LS_TRY(walk_q(walk, blk, 0, n0, h, q));  // h is scratch: the K/V sub-slices reuse it below
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t b0 = b * block, b1 = std::min(S, b0 + block);
    // The block's K, V into the scratch, in sub-slices of at most `slice` rows, and its statistics.
    for (const auto& [a, e] : row_slices(b0, b1, slice)) {
      LS_ASSIGN_OR_RETURN(const h3::BlockRows r, walk.in(a, e));
      const TensorView kr = kc[0].slice_rows(a - b0, e - b0).unflatten_last(H, Dh);
      const TensorView vr = vc[0].slice_rows(a - b0, e - b0).unflatten_last(H, Dh);
      LS_TRY(blk.attn_kv(r, a, e, kr, vr, h.slice_rows(0, std::min(e - a, n0))));
      LS_TRY(be.int8_key_stats(kr, vr, stats, a, a == 0));
      LS_TRY(walk.out(r, a, e));
    }
    // Its segments, one per chunk it meets; a chunk whose last key is here is complete.
    for (int64_t c = b0 / chunk; c * chunk < b1; ++c) {
      const auto [k0, k1] = rows_of(c);
      const int64_t s0 = std::max(k0, b0), s1 = std::min(k1, b1);
      const int j = static_cast<int>(c % 2);
      if (s0 == k0) LS_TRY(kv.saved[j].wait(Queue::compute));  // chunk c - 2's copy out of q8[j] is done
      LS_TRY(be.int8_prepare(kc[0].slice_rows(s0 - b0, s1 - b0).unflatten_last(H, Dh),
                             vc[0].slice_rows(s0 - b0, s1 - b0).unflatten_last(H, Dh), stats,
                             at(j, k0).slice(s0 - k0, s1 - k0)));
      if (s1 < k1) continue;  // the chunk goes on in the next block
      LS_TRY(kv.computed[j].signal(Queue::compute));
      LS_TRY(kv.computed[j].wait(Queue::transfer));
      const Int8ChunkViews d = device_views(j, k1 - k0), hst = host_views(c);
      LS_TRY(be.copy_async(hst.k8, d.k8, Queue::transfer));
      LS_TRY(be.copy_async(hst.sk, d.sk, Queue::transfer));
      LS_TRY(be.copy_async(hst.v8t, d.v8t, Queue::transfer));
      LS_TRY(kv.saved[j].signal(Queue::transfer));
      st.kv_bytes += static_cast<uint64_t>((k1 - k0) * (2 * I + 4 * H));
      // The first query slice against chunk c, behind the copy out (both only read q8[j]).
      LS_TRY(attend(0, n0, c, j));
      LS_TRY(kv.used[j].signal(Queue::compute));
    }
  }
  LS_TRY(walk.finish());
  LS_TRY(st.mark("attention int8 prepare"));
  // Pass 2: slice 0's out-projection and gated add (its attention is done), then every
  // further query slice against the prepared chunks.
  LS_ASSIGN_OR_RETURN(ResidualWalk walk2, ResidualWalk::begin(st, rs, row_slices(0, S, slice), /*reads=*/true,
                                                              /*writes=*/true));
  LS_TRY(walk_out(walk2, blk, 0, n0, o, h));
  // Load g streams chunk g % n_chunks into q8[g % 2] two steps ahead of its use; the chunk's
  // prepared bytes were copied out on the transfer queue before (in order).
  auto load = [&](int64_t g) -> Status {
    const int64_t c = g % n_chunks;
    const auto [k0, k1] = rows_of(c);
    const int j = static_cast<int>(g % 2);
    LS_TRY(kv.used[j].wait(Queue::transfer));  // attention on the buffer's previous chunk is done
    const Int8ChunkViews d = device_views(j, k1 - k0), hst = host_views(c);
    LS_TRY(be.copy_async(d.k8, hst.k8, Queue::transfer));
    LS_TRY(be.copy_async(d.sk, hst.sk, Queue::transfer));
    LS_TRY(be.copy_async(d.v8t, hst.v8t, Queue::transfer));
    st.kv_bytes += static_cast<uint64_t>((k1 - k0) * (2 * I + 4 * H));
    return kv.loaded[j].signal(Queue::transfer);
  };
  LS_TRY(stream_chunks(st, walk2, blk, bufs, kv, row_slices(n0, S, slice), n_chunks, load, attend));
  // Nothing is left in flight that writes a phase buffer: every load was waited for by the
  // attention that read it; with one query slice no load follows the last copies out, which
  // only READ q8 (what they write to the host is rewritten, in queue order, by the next
  // block's prepare before any load reads it).
  return walk2.finish();
}

// Sequence parallel (Ulysses, docs/multi-gpu.md). This rank holds residual rows
// [row0, row1) in x [R, D] (local row i = sequence row row0 + i; the rows past row1 are
// padding on the last ranks) and attends with heads [rank * Hl, (rank + 1) * Hl).
// Every rank walks the same local slices [a, b) of [0, R), so all of them call the same
// collectives with the same sizes; padding rows are computed by nobody, only moved.
//   pass 1, per slice: K, V of the slice's rows; pack each per destination rank (part p
//     = heads of rank p), all-to-all, and place part p (rank p's rows a..b) at rows
//     p * R + a.. of K all / V all: row g of K all is sequence row g (rank p's local row
//     i is row p * R + i), so rows [0, S) are every key of this rank's heads, in order.
//   pass 2, per slice: Q of the slice's rows, packed and all-to-all'd the same way into
//     Q all [N, n, Hl, Dh] (rank p's rows a..b); attention of those queries against all
//     S keys; the all-to-all back (part p of "attention out all" is rank p's rows) and
//     unpack into [n, H, Dh]; out-projection and gated add on this rank's rows.
// Exact: every (query, head) attends over the same S keys in the same kv_tile tiles as
// on one rank, and every other op is row-wise; the collectives only move bytes.
Status attention_ulysses(ForwardState& st, const AttnSpecs& sp, const h3::DitBlock& blk, int64_t slice,
                         int64_t kv_tile) {
  Backend& be = st.be;
  Arena& arena = st.arena;
  Communicator& comm = *st.comm;
  const int64_t S = st.S, R = st.R, N = comm.size(), Dh = st.cfg.head_dim, I = st.cfg.inner();
  const int64_t Hl = st.cfg.heads / N, Il = I / N;
  const int64_t n_max = slice == 0 ? R : std::min(slice, R);
  // Real rows of rank p (the last ranks may hold fewer, or none).
  auto valid_rows = [&](int64_t p) { return std::max<int64_t>(0, std::min(S, (p + 1) * R) - p * R); };
  const int64_t mine = st.row1 - st.row0;
  LS_ASSIGN_OR_RETURN(TensorView k_all, alloc_rows(arena, *sp.k_all, N * R));  // bf16 [N R, Il]
  LS_ASSIGN_OR_RETURN(TensorView v_all, alloc_rows(arena, *sp.v_all, N * R));
  st.phase_kv = static_cast<uint64_t>(k_all.nbytes() + v_all.nbytes());
  // [m, I] -> send [N][m][Il]: part p = columns (heads) of rank p.
  auto pack = [&](const TensorView& src, const TensorView& send, int64_t m) -> Status {
    for (int64_t p = 0; p < N; ++p)
      LS_TRY(be.copy(send.slice_rows(p * m, (p + 1) * m), src.cols(p * Il, (p + 1) * Il)));
    return Status();
  };
  // Pass 1 (per slice: h, K, V, send, receive; the pass-2 buffers' specs, no more bytes).
  for (int64_t a = 0; a < R; a += n_max) {
    const int64_t b = std::min(R, a + n_max), m = b - a, v = std::clamp<int64_t>(mine - a, 0, m);
    Arena::Scope slice_scope(arena);
    LS_ASSIGN_OR_RETURN(TensorView h, alloc_rows(arena, sp.h, m));
    LS_ASSIGN_OR_RETURN(TensorView kl, alloc_rows(arena, *sp.q, m));  // bf16 [m, I]
    LS_ASSIGN_OR_RETURN(TensorView vl, alloc_rows(arena, sp.out, m));  // bf16 [m, I]
    LS_ASSIGN_OR_RETURN(TensorView send2, alloc_rows(arena, *sp.send, m));
    LS_ASSIGN_OR_RETURN(TensorView recv2, alloc_rows(arena, *sp.q_all, N * m));
    const TensorView send(send2.data, DType::bf16, {N * m, Il}, send2.device), recv = recv2;  // [N][m][Il]
    if (v > 0) {
      const h3::BlockRows r = st.device_rows();
      LS_TRY(blk.attn_kv(r, st.row0 + a, st.row0 + a + v, kl.slice_rows(0, v).unflatten_last(st.cfg.heads, Dh),
                         vl.slice_rows(0, v).unflatten_last(st.cfg.heads, Dh), h.slice_rows(0, v)));
    }
    for (int t = 0; t < 2; ++t) {
      LS_TRY(pack(t == 0 ? kl : vl, send, m));
      LS_TRY(comm.all_to_all(send, recv));
      const TensorView& dst = t == 0 ? k_all : v_all;
      for (int64_t p = 0; p < N; ++p)
        LS_TRY(be.copy(dst.slice_rows(p * R + a, p * R + b), recv.slice_rows(p * m, (p + 1) * m)));
    }
  }
  const TensorView keys = k_all.slice_rows(0, S).unflatten_last(Hl, Dh), vals = v_all.slice_rows(0, S).unflatten_last(Hl, Dh);
  // [int8 attention] every key of this rank's heads is here: statistics and prepare once.
  Int8Keys keys8;
  if (sp.int8_stats) {
    LS_ASSIGN_OR_RETURN(const TensorView sb, alloc_rows(arena, *sp.int8_stats, 1));
    LS_ASSIGN_OR_RETURN(const TensorView kb, alloc_rows(arena, *sp.int8_keys, 1));
    const Int8Tables t = int8_tables_of(sb, S, Hl, Dh);
    keys8 = int8_keys_of(kb, S, Hl, Dh, t.vs);
    LS_TRY(be.int8_key_stats(keys, vals, t.stats, 0, true));
    LS_TRY(be.int8_prepare(keys, vals, t.stats, keys8));
  }
  LS_TRY(st.mark("attention pass 1"));
  // Pass 2.
  for (int64_t a = 0; a < R; a += n_max) {
    const int64_t b = std::min(R, a + n_max), m = b - a, v = std::clamp<int64_t>(mine - a, 0, m);
    Arena::Scope slice_scope(arena);
    LS_ASSIGN_OR_RETURN(TensorView h, alloc_rows(arena, sp.h, m));
    LS_ASSIGN_OR_RETURN(TensorView q, alloc_rows(arena, *sp.q, m));  // bf16 [m, I]
    LS_ASSIGN_OR_RETURN(TensorView send2, alloc_rows(arena, *sp.send, m));
    LS_ASSIGN_OR_RETURN(TensorView q_all, alloc_rows(arena, *sp.q_all, N * m));      // bf16 [N m, Il]
    LS_ASSIGN_OR_RETURN(TensorView o_all, alloc_rows(arena, *sp.out_all, N * m));    // bf16 [N m, Il]
    LS_ASSIGN_OR_RETURN(TensorView o, alloc_rows(arena, sp.out, m));                 // bf16 [m, I]
    const TensorView send(send2.data, DType::bf16, {N * m, Il}, send2.device);
    std::optional<h3::BlockRows> r;
    if (v > 0) {
      r = st.device_rows();
      LS_TRY(blk.attn_q(*r, st.row0 + a, st.row0 + a + v, h.slice_rows(0, v), q.slice_rows(0, v)));
    }
    LS_TRY(pack(q, send, m));
    LS_TRY(comm.all_to_all(send, q_all));
    // The real queries of Q all are a prefix: full parts, at most one partial part,
    // then empty ones (only the last ranks are short).
    int64_t nq = 0;
    for (int64_t p = 0; p < N; ++p) {
      const int64_t vp = std::clamp<int64_t>(valid_rows(p) - a, 0, m);
      LS_CHECK_MSG(vp == 0 || nq == p * m, "sequence-parallel queries are not a prefix");
      nq += vp;
    }
    AttentionParams ap;
    ap.kv_tile = kv_tile;
    if (sp.int8_stats)
      LS_TRY(be.attention_int8(q_all.slice_rows(0, nq).unflatten_last(Hl, Dh), keys8,
                               o_all.slice_rows(0, nq).unflatten_last(Hl, Dh), ap));
    else
      LS_TRY(be.attention(q_all.slice_rows(0, nq).unflatten_last(Hl, Dh), keys, vals,
                          o_all.slice_rows(0, nq).unflatten_last(Hl, Dh), ap));
    LS_TRY(comm.all_to_all(o_all, send));  // part p of o_all: rank p's rows; back: part p = heads of rank p
    for (int64_t p = 0; p < N; ++p) LS_TRY(be.copy(o.cols(p * Il, (p + 1) * Il), send.slice_rows(p * m, (p + 1) * m)));
    if (v > 0) {
      LS_TRY(blk.attn_out(*r, st.row0 + a, st.row0 + a + v, o.slice_rows(0, v), h.slice_rows(0, v)));
    }
  }
  return Status();
}

}  // namespace

Status run_attention(ForwardState& st, const AttnSpecs& specs, const h3::DitBlock& blk, int64_t slice, int64_t kv_tile,
                     KvOffload* kv) {
  // The phase's buffers are rewound at scope exit and the next phase may reuse the
  // bytes at once: queued work is ordered on the compute queue, and every transfer INTO
  // these buffers, and every copy out of a residual slice, was waited for by compute
  // above (ResidualWalk::finish). Only K/V copies out of the chunk buffers may still
  // run (one query slice: attention_offloaded_kv says why that is safe).
  Arena::Scope phase(st.arena);
  switch (specs.kind) {
    case AttentionKind::stock: return attention_stock(st, specs, blk, kv_tile);
    case AttentionKind::resident_kv: return attention_resident_kv(st, specs, blk, slice, kv_tile);
    case AttentionKind::offloaded_kv:
      LS_CHECK_MSG(kv != nullptr, "K/V offload without its host buffers and fences");
      if (specs.int8_stats) return attention_offloaded_kv_int8(st, specs, blk, slice, kv_tile, *kv);
      return attention_offloaded_kv(st, specs, blk, slice, kv_tile, *kv);
    case AttentionKind::ulysses:
      LS_CHECK_MSG(st.comm != nullptr && !st.residual_offload, "sequence-parallel attention without its communicator");
      return attention_ulysses(st, specs, blk, slice, kv_tile);
  }
  return Status();
}

}  // namespace ls::exec
