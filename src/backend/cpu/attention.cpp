// CPU attention: full, unmasked, key tiles of kv_tile keys walked in order
// (src/backend/backend.h; DESIGN.md §1.2; docs/numerics.md §9).
//
// Per (query i, head h), with q = q[i, h, :], k_j = k[j, h, :], v_j = v[j, h, :]:
//   state: m = -inf, l = 0, acc[Dh] = 0                       (fp32)
//   for each tile T = keys [t0, t1), t1 = min(t0 + kv_tile, Mk), t0 ascending:
//     s_j   = fl32(scale * dot16(q, k_j))    dot16: the fixed 16-lane order of simd.h
//     m_new = max(m, max_{j in T} s_j)
//     alpha = (m == -inf) ? 0 : expf(m - m_new)
//     p_j   = expf(s_j - m_new)
//     rs    = sum_{j in T} p_j                   j ascending, from +0, fp32
//     o_d   = sum_{j in T} bf16(p_j) * v_j[d]    j ascending, from +0, fp32 (each product
//                                                is exact: two 8-bit significands)
//     l     = fl32(l * alpha) + rs
//     acc_d = fl32(acc_d * alpha) + o_d
//     m     = m_new
//   out[i, h, d] = bf16(acc_d / l)
// scale = p.scale, or fl32(1 / sqrt((double)Dh)) when p.scale == 0 (PyTorch's default).
//
// Partials layout and merge rule (style-lessons §10). A backend that splits the keys
// over workers produces, per (head, query, tile) the tile partial
//   (m_T = max_j s_j, rs_T = sum_j exp(s_j - m_new), o_T[Dh])
// but rs_T and o_T are taken relative to m_new = max(m_prev, m_T) of the running state,
// so the only merge that reproduces these bits is the ordered left fold above, tile by
// tile: state <- (m_new, l * alpha + rs_T, acc * alpha + o_T). Here the fold is done by
// one thread per (query, head), so no partials are ever stored.
//
// No allocation: per query, q (widened), acc and o live in fixed stack arrays of
// kMaxHeadDim floats, scores in a stack array of kScoreChunk floats (about 26 KiB of
// stack for a block of kQueryBlock queries). A tile longer than kScoreChunk is walked twice
// (max first, then p and o), recomputing each s_j bit-identically, so the chunk size is
// not a numerics setting: only kv_tile is.
// Streamed keys (AttentionParams::state): the fold above is cut at a tile boundary and
// resumed. The CPU's state of (query i, head h) is exactly the fold's variables at that
// boundary, stored as fp32 in state[i, h, :] (f32 [Mq, H, Dh + 8], contiguous):
//   [0, Dh): acc_d    [Dh]: m    [Dh + 1]: l    [Dh + 2, Dh + 8): unused (never read)
// Loading them back gives the same floats, and the next chunk's tiles are the same
// key ranges as in one call (every non-final chunk is a multiple of kv_tile keys), so
// any chunking gives the bytes of one call over all keys.
// Parallel over (head, block of 4 queries), head-major so neighbouring work items share
// the head's K and V in cache; within a block each K and V row is loaded once for the
// 4 queries, each of which keeps its own lanes and state. A query's arithmetic never looks at other queries, so any
// query slicing and any thread count give identical bytes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/simd.h"
#include "core/thread_pool.h"

namespace ls::cpu {
namespace {

constexpr int64_t kMaxHeadDim = 512;
constexpr int64_t kScoreChunk = 256;

constexpr int kQueryBlock = 4;  // queries of one head sharing each K/V row load

struct AttentionArgs {
  const TensorView* q;
  const TensorView* k;
  const TensorView* v;
  const TensorView* out;
  int64_t Mq, Mk, H, Dh, kv_tile;
  float scale;
  float* state;     // f32 [Mq, H, Dh + kAttentionStateExtra] or null (one call over all keys)
  bool state_in;    // start from state instead of (-inf, 0, 0)
  bool finalize;    // write out; else save the running state to `state`
};

// State of (query i, head h): acc at [0, Dh), m at Dh, l at Dh + 1.
inline float* state_row(const AttentionArgs& a, int64_t i, int64_t h) {
  return a.state + (i * a.H + h) * (a.Dh + kAttentionStateExtra);
}

// Scores s[qi] = scale * dot16(q[qi], k_j) for QB queries against one key. Each query
// keeps its own 16 lanes, so the result is dot16's, bit for bit; sharing only saves
// loading and widening k_j once per query block.
template <int QB>
inline void scores_for_key(const float (*qf)[kMaxHeadDim], const uint16_t* kr, int64_t Dh, float scale,
                           float* s) {
  F8 lo[QB], hi[QB];
  for (int qi = 0; qi < QB; ++qi) lo[qi] = hi[qi] = f8_zero();
  int64_t d = 0;
  for (; d + 16 <= Dh; d += 16) {
    const F8 k0 = f8_load(kr + d), k1 = f8_load(kr + d + 8);
    for (int qi = 0; qi < QB; ++qi) {
      lo[qi] = f8_add(lo[qi], f8_mul(f8_load(qf[qi] + d), k0));
      hi[qi] = f8_add(hi[qi], f8_mul(f8_load(qf[qi] + d + 8), k1));
    }
  }
  if (d < Dh) {  // zero-padded tail (qf is zero beyond Dh up to a multiple of 16)
    alignas(32) float kt[16];
    widen_tail16(kr + d, Dh - d, kt);
    const F8 k0 = f8_load(kt), k1 = f8_load(kt + 8);
    for (int qi = 0; qi < QB; ++qi) {
      lo[qi] = f8_add(lo[qi], f8_mul(f8_load(qf[qi] + d), k0));
      hi[qi] = f8_add(hi[qi], f8_mul(f8_load(qf[qi] + d + 8), k1));
    }
  }
  for (int qi = 0; qi < QB; ++qi) s[qi] = scale * f8_tree16(lo[qi], hi[qi]);
}

// o[qi][0..Dh) += pb[qi] * v[0..Dh), lane by lane (no reduction: width is irrelevant).
template <int QB>
inline void accumulate_value(float (*o)[kMaxHeadDim], const float* pb, const uint16_t* vr, int64_t Dh) {
  F8 p[QB];
  for (int qi = 0; qi < QB; ++qi) p[qi] = f8_set1(pb[qi]);
  int64_t d = 0;
  for (; d + 8 <= Dh; d += 8) {
    const F8 vv = f8_load(vr + d);
    for (int qi = 0; qi < QB; ++qi) f8_store(o[qi] + d, f8_add(f8_load(o[qi] + d), f8_mul(p[qi], vv)));
  }
  for (; d < Dh; ++d) {
    const float vv = widen_scalar<uint16_t>(vr[d]);
    for (int qi = 0; qi < QB; ++qi) o[qi][d] = o[qi][d] + pb[qi] * vv;
  }
}

// Queries [i0, i0 + QB) of head h, each with its own state (m, l, acc); the fold over
// tiles is the one documented at the top of this file, per query.
template <int QB>
void attention_query_block(const AttentionArgs& a, int64_t i0, int64_t h) {
  const int64_t Dh = a.Dh;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  alignas(32) float qf[QB][kMaxHeadDim];   // q widened to fp32 (exact), zero-padded to 16
  alignas(32) float acc[QB][kMaxHeadDim];  // running numerator
  alignas(32) float o[QB][kMaxHeadDim];    // this tile's sum_j bf16(p_j) v_j
  float s[kScoreChunk][QB];                // scores of the tile (when it fits)
  float m[QB], l[QB], m_new[QB], alpha[QB], rs[QB], tile_max[QB], sj[QB], pj[QB], pb[QB];
  const int64_t padded = (Dh + 15) / 16 * 16;
  for (int qi = 0; qi < QB; ++qi) {
    const uint16_t* qr = static_cast<const uint16_t*>(a.q->at(i0 + qi, h));  // bf16 [Dh]
    for (int64_t d = 0; d < padded; ++d) qf[qi][d] = d < Dh ? widen_scalar<uint16_t>(qr[d]) : 0.0f;
    if (a.state_in) {
      const float* st = state_row(a, i0 + qi, h);
      for (int64_t d = 0; d < Dh; ++d) acc[qi][d] = st[d];
      m[qi] = st[Dh];
      l[qi] = st[Dh + 1];
    } else {
      for (int64_t d = 0; d < Dh; ++d) acc[qi][d] = 0.0f;
      m[qi] = neg_inf;
      l[qi] = 0.0f;
    }
  }
  for (int64_t t0 = 0; t0 < a.Mk; t0 += a.kv_tile) {
    const int64_t t1 = std::min(a.Mk, t0 + a.kv_tile);
    const bool one_chunk = t1 - t0 <= kScoreChunk;
    for (int qi = 0; qi < QB; ++qi) tile_max[qi] = neg_inf;
    for (int64_t j = t0; j < t1; ++j) {
      scores_for_key<QB>(qf, static_cast<const uint16_t*>(a.k->at(j, h)), Dh, a.scale, sj);
      for (int qi = 0; qi < QB; ++qi) {
        if (one_chunk) s[j - t0][qi] = sj[qi];
        tile_max[qi] = sj[qi] > tile_max[qi] ? sj[qi] : tile_max[qi];
      }
    }
    for (int qi = 0; qi < QB; ++qi) {
      m_new[qi] = tile_max[qi] > m[qi] ? tile_max[qi] : m[qi];
      alpha[qi] = m[qi] == neg_inf ? 0.0f : std::exp(m[qi] - m_new[qi]);
      rs[qi] = 0.0f;
      for (int64_t d = 0; d < Dh; ++d) o[qi][d] = 0.0f;
    }
    for (int64_t j = t0; j < t1; ++j) {
      if (one_chunk) {
        for (int qi = 0; qi < QB; ++qi) sj[qi] = s[j - t0][qi];
      } else {
        scores_for_key<QB>(qf, static_cast<const uint16_t*>(a.k->at(j, h)), Dh, a.scale, sj);
      }
      for (int qi = 0; qi < QB; ++qi) {
        pj[qi] = std::exp(sj[qi] - m_new[qi]);
        rs[qi] = rs[qi] + pj[qi];
        pb[qi] = round_bf16(pj[qi]);
      }
      accumulate_value<QB>(o, pb, static_cast<const uint16_t*>(a.v->at(j, h)), Dh);
    }
    for (int qi = 0; qi < QB; ++qi) {
      l[qi] = l[qi] * alpha[qi] + rs[qi];
      for (int64_t d = 0; d < Dh; ++d) acc[qi][d] = acc[qi][d] * alpha[qi] + o[qi][d];
      m[qi] = m_new[qi];
    }
  }
  if (!a.finalize) {  // a non-final chunk: keep the state at this tile boundary
    for (int qi = 0; qi < QB; ++qi) {
      float* st = state_row(a, i0 + qi, h);
      for (int64_t d = 0; d < Dh; ++d) st[d] = acc[qi][d];
      st[Dh] = m[qi];
      st[Dh + 1] = l[qi];
    }
    return;
  }
  for (int qi = 0; qi < QB; ++qi) {
    uint16_t* out = static_cast<uint16_t*>(a.out->at(i0 + qi, h));
    for (int64_t d = 0; d < Dh; ++d) out[d] = f32_to_bf16(acc[qi][d] / l[qi]);
  }
}

void attention_queries(const AttentionArgs& a, int64_t i0, int64_t count, int64_t h) {
  static_assert(kQueryBlock == 4, "extend the switch");
  switch (count) {
    case 1: attention_query_block<1>(a, i0, h); return;
    case 2: attention_query_block<2>(a, i0, h); return;
    case 3: attention_query_block<3>(a, i0, h); return;
    case 4: attention_query_block<4>(a, i0, h); return;
    default: LS_CHECK_MSG(false, "attention query block out of range");
  }
}

}  // namespace


Status cpu_op_attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                        const AttentionParams& p) {
  LS_TRY(require_host("attention", {&q, &k, &v, &out, &p.state}));
  if (q.dtype != DType::bf16 || k.dtype != DType::bf16 || v.dtype != DType::bf16 || out.dtype != DType::bf16)
    return unsupported_dtypes("attention",
                              std::string("q=") + dtype_name(q.dtype) + " k=" + dtype_name(k.dtype) +
                                  " v=" + dtype_name(v.dtype) + " out=" + dtype_name(out.dtype),
                              "q, k, v, out all bf16");
  LS_CHECK_MSG(q.ndim == 3 && k.ndim == 3 && v.ndim == 3 && out.ndim == 3,
               "attention wants q, out [Mq, H, Dh] and k, v [Mk, H, Dh]; got " + q.shape_str() + ", " +
                   k.shape_str() + ", " + v.shape_str() + ", " + out.shape_str());
  const int64_t Mq = q.size(0), H = q.size(1), Dh = q.size(2), Mk = k.size(0);
  LS_CHECK_MSG(k.size(1) == H && k.size(2) == Dh && v.size(0) == Mk && v.size(1) == H && v.size(2) == Dh &&
                   out.size(0) == Mq && out.size(1) == H && out.size(2) == Dh,
               "attention shape mismatch: q " + q.shape_str() + ", k " + k.shape_str() + ", v " + v.shape_str() +
                   ", out " + out.shape_str());
  LS_CHECK(q.inner_contiguous() && k.inner_contiguous() && v.inner_contiguous() && out.inner_contiguous());
  if (Dh > kMaxHeadDim)
    return make_error(ErrorCode::unsupported, "cpu attention: head dim " + std::to_string(Dh) + " exceeds " +
                                                  std::to_string(kMaxHeadDim));
  if (p.kv_tile <= 0)
    return make_error(ErrorCode::invalid_argument,
                      "attention: kv_tile must be positive; got " + std::to_string(p.kv_tile));
  LS_TRY(check_attention_state(p, Mq, Mk, H, Dh));
  LS_CHECK_MSG(Mk > 0, "attention over zero keys");
  const float scale = attention_scale(p, Dh);

  AttentionArgs a{&q, &k, &v, &out, Mq, Mk, H, Dh, p.kv_tile, scale,
                  p.state.empty() ? nullptr : p.state.ptr<float>(), p.state_in, p.finalize};
  // Work items: (head, block of kQueryBlock queries), head-major. Which queries share
  // a block changes nothing in any query's arithmetic.
  const int64_t blocks = (Mq + kQueryBlock - 1) / kQueryBlock;
  const int64_t work_per_item = std::max<int64_t>(1, 4 * kQueryBlock * Mk * Dh);
  parallel_for(H * blocks, std::max<int64_t>(1, (1 << 18) / work_per_item), [&](int64_t b, int64_t e) {
    for (int64_t idx = b; idx < e; ++idx) {
      const int64_t h = idx / blocks, i0 = (idx % blocks) * kQueryBlock;
      attention_queries(a, i0, std::min<int64_t>(kQueryBlock, Mq - i0), h);
    }
  });
  return Status();
}

}  // namespace ls::cpu
