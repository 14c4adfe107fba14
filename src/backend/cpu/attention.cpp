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
// No allocation: acc and o live in fixed stack arrays of kMaxHeadDim floats, scores in a
// stack array of kScoreChunk floats. A tile longer than kScoreChunk is walked twice
// (max first, then p and o), recomputing each s_j bit-identically, so the chunk size is
// not a numerics setting: only kv_tile is.
// Parallel over (head, query) pairs, head-major so neighbouring work items share the
// head's K and V in cache. A query's arithmetic never looks at other queries, so any
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

struct AttentionArgs {
  const TensorView* q;
  const TensorView* k;
  const TensorView* v;
  const TensorView* out;
  int64_t Mq, Mk, H, Dh, kv_tile;
  float scale;
};

// o[0..Dh) += p * v[0..Dh), lane by lane (no reduction, so vector width is irrelevant).
inline void axpy_bf16(float* o, float p, const uint16_t* v, int64_t Dh) {
  int64_t d = 0;
  const F8 pv = f8_set1(p);
  for (; d + 8 <= Dh; d += 8) f8_store(o + d, f8_add(f8_load(o + d), f8_mul(pv, f8_load(v + d))));
  for (; d < Dh; ++d) o[d] = o[d] + p * widen_scalar<uint16_t>(v[d]);
}

void attention_one(const AttentionArgs& a, int64_t i, int64_t h) {
  const int64_t Dh = a.Dh;
  const uint16_t* qr = static_cast<const uint16_t*>(a.q->at(i, h));  // bf16 [Dh]
  alignas(32) float acc[kMaxHeadDim];
  alignas(32) float o[kMaxHeadDim];
  float s[kScoreChunk];
  for (int64_t d = 0; d < Dh; ++d) acc[d] = 0.0f;
  float m = -std::numeric_limits<float>::infinity();
  float l = 0.0f;
  auto score = [&](int64_t j) {
    const uint16_t* kr = static_cast<const uint16_t*>(a.k->at(j, h));
    return a.scale * dot16(qr, kr, Dh);
  };
  for (int64_t t0 = 0; t0 < a.Mk; t0 += a.kv_tile) {
    const int64_t t1 = std::min(a.Mk, t0 + a.kv_tile);
    const bool one_chunk = t1 - t0 <= kScoreChunk;
    float tile_max = -std::numeric_limits<float>::infinity();
    for (int64_t j = t0; j < t1; ++j) {
      const float sj = score(j);
      if (one_chunk) s[j - t0] = sj;
      tile_max = sj > tile_max ? sj : tile_max;
    }
    const float m_new = tile_max > m ? tile_max : m;
    const float alpha = m == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(m - m_new);
    float rs = 0.0f;
    for (int64_t d = 0; d < Dh; ++d) o[d] = 0.0f;
    for (int64_t j = t0; j < t1; ++j) {
      const float sj = one_chunk ? s[j - t0] : score(j);
      const float pj = std::exp(sj - m_new);
      rs = rs + pj;
      axpy_bf16(o, round_bf16(pj), static_cast<const uint16_t*>(a.v->at(j, h)), Dh);
    }
    l = l * alpha + rs;
    for (int64_t d = 0; d < Dh; ++d) acc[d] = acc[d] * alpha + o[d];
    m = m_new;
  }
  uint16_t* out = static_cast<uint16_t*>(a.out->at(i, h));
  for (int64_t d = 0; d < Dh; ++d) out[d] = f32_to_bf16(acc[d] / l);
}

}  // namespace

Status cpu_op_attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                        const AttentionParams& p) {
  LS_TRY(require_host("attention", {&q, &k, &v, &out}));
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
  LS_CHECK_MSG(Mk > 0, "attention over zero keys");
  const float scale = p.scale != 0.0f ? p.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dh)));

  AttentionArgs a{&q, &k, &v, &out, Mq, Mk, H, Dh, p.kv_tile, scale};
  const int64_t work_per_item = std::max<int64_t>(1, 4 * Mk * Dh);
  parallel_for(H * Mq, std::max<int64_t>(1, (1 << 18) / work_per_item), [&](int64_t b, int64_t e) {
    for (int64_t idx = b; idx < e; ++idx) attention_one(a, idx % Mq, idx / Mq);
  });
  return Status();
}

}  // namespace ls::cpu
