// CPU INT8 attention: the reference of AttentionAlgorithm::int8 (docs/int8-attention.md,
// the contract; backend.h, the interface). The element arithmetic is
// src/backend/int8_attention_math.h, shared with the CUDA kernels.
//
//   int8_key_stats  stats[0|1, h, c] = max k / min k over the keys of statistics block 0,
//                   stats[2 + b, h, c] = max |v| over the keys of block b (contract v3:
//                   blocks of kInt8StatBlock absolute keys), merged with max/min into the
//                   previous values unless reset.
//   int8_prepare    per key row and head: y = R(fl32(k - mu)) (mu from block 0); sk = the
//                   row_scale of the largest max |y| of the key's group (contract v4: the 16
//                   keys of its 128-key tile with the same j % 8), k8 = quant(y, sk);
//                   v8t[h, c, j] = quant(v, sv_b,c) with b the key's block; the blocks' sv_b and
//                   rho_b = sv_{b-1} / sv_b into vs. Calls start at a multiple of 128 keys.
//   attention_int8  per (query, head): y = R(q), sq = row_scale(max |y|), q8 = quant(y, sq),
//                   a = fl32(sq * cs); per tile of kv_tile keys P against the TILE's own
//                   maximum, x = fmaf(fl32(a sk), float(d), fl32(kP8Top - sT)) (contract v4;
//                   p8 by the threshold table, §4.3), integer tile sums (P.V and
//                   the row sum, both of p8), folded in fp32 (§4.4): acc is kept in units of
//                   the current block's sv, rescaled by rho_b where a tile starts block b.
// Every result element depends only on its own row (query, key) or channel, so any
// slicing of queries, any chunking of keys into calls (state carried) and any thread
// count give the same bytes. Parallel over (head, query) for attention, over keys for
// prepare; a tile's keys are walked in chunks of kChunk (a tile longer than kChunk
// recomputes its scores bit for bit in the second walk: not a numerics setting), the
// integer sums are exact in any order.
// No allocation: per item state lives on the stack (Dh <= kMaxHeadDim).
#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/simd.h"
#include "backend/int8_attention_math.h"
#include "core/thread_pool.h"

namespace ls::cpu {
namespace {

constexpr int64_t kMaxHeadDim = 512;
constexpr int64_t kChunk = 256;

bool power_of_two(int64_t d) { return d >= 2 && (d & (d - 1)) == 0; }

Status check_head_dim(const char* op, int64_t Dh) {
  if (!power_of_two(Dh) || Dh > kMaxHeadDim)
    return make_error(ErrorCode::unsupported, std::string("cpu ") + op + ": int8 attention needs a power-of-two head dim in [2, " +
                                                  std::to_string(kMaxHeadDim) + "] (the Hadamard rotation); got " +
                                                  std::to_string(Dh));
  return Status();
}

Status check_bf16_keys(const char* op, const TensorView& k, const TensorView& v) {
  if (k.dtype != DType::bf16 || v.dtype != DType::bf16)
    return unsupported_dtypes(op, std::string("k=") + dtype_name(k.dtype) + " v=" + dtype_name(v.dtype), "k, v bf16");
  LS_CHECK_MSG(k.ndim == 3 && v.ndim == 3 && v.size(0) == k.size(0) && v.size(1) == k.size(1) &&
                   v.size(2) == k.size(2) && k.inner_contiguous() && v.inner_contiguous(),
               std::string(op) + ": k, v must be [n, H, Dh] with contiguous rows; got " + k.shape_str() + ", " +
                   v.shape_str());
  return check_head_dim(op, k.size(2));
}

void check_keys(const Int8Keys& keys, int64_t H, int64_t Dh) {
  const int64_t n = keys.keys();
  LS_CHECK_MSG(keys.k8.dtype == DType::i8 && keys.k8.ndim == 3 && keys.k8.size(1) == H && keys.k8.size(2) == Dh &&
                   keys.k8.inner_contiguous(),
               "int8 keys: k8 must be i8 [n, H, Dh]; got " + keys.k8.shape_str());
  LS_CHECK_MSG(keys.sk.dtype == DType::f32 && keys.sk.ndim == 2 && keys.sk.size(0) == n && keys.sk.size(1) == H &&
                   keys.sk.inner_contiguous(),
               "int8 keys: sk must be f32 [n, H]; got " + keys.sk.shape_str());
  LS_CHECK_MSG(keys.v8t.dtype == DType::i8 && keys.v8t.ndim == 3 && keys.v8t.size(0) == H && keys.v8t.size(1) == Dh &&
                   keys.v8t.size(2) == n && keys.v8t.stride[2] == 1 && keys.v8t.stride[1] >= n &&
                   keys.v8t.stride[1] % 16 == 0 && keys.v8t.stride[0] >= Dh * keys.v8t.stride[1],
               "int8 keys: v8t must be i8 [H, Dh, n] with keys contiguous and a row stride ld >= n, ld % 16 == 0; got " +
                   keys.v8t.shape_str() + " with ld " + std::to_string(keys.v8t.stride[1]));
  LS_CHECK_MSG(keys.vs.dtype == DType::f32 && keys.vs.ndim == 4 && keys.vs.size(1) == 2 && keys.vs.size(2) == H &&
                   keys.vs.size(3) == Dh && keys.vs.is_contiguous(),
               "int8 keys: vs must be a contiguous f32 [NB, 2, H, Dh]; got " + keys.vs.shape_str());
  LS_CHECK_MSG(keys.k0 >= 0 && (n == 0 || (keys.k0 + n - 1) / kInt8StatBlock < keys.vs.size(0)),
               "int8 keys [" + std::to_string(keys.k0) + ", " + std::to_string(keys.k0 + n) + ") lie past the " +
                   std::to_string(keys.vs.size(0)) + " statistics blocks of their V-scale table");
}

void check_stats(const char* op, const TensorView& stats, int64_t H, int64_t Dh) {
  LS_CHECK_MSG(stats.dtype == DType::f32 && stats.ndim == 3 && stats.size(0) >= 3 && stats.size(1) == H &&
                   stats.size(2) == Dh && stats.is_contiguous(),
               std::string(op) + ": stats must be a contiguous f32 [2 + NB, H, Dh]; got " + stats.shape_str());
}

inline float bf16_at(const TensorView& t, int64_t r, int64_t h, int64_t c) {
  return widen_scalar<uint16_t>(static_cast<const uint16_t*>(t.at(r, h))[c]);
}

// Per (query, head): q8, a (docs §4.1).
void quantise_query(const uint16_t* qr, int64_t Dh, float cs, int8_t* q8, float* a) {
  float y[kMaxHeadDim];
  for (int64_t c = 0; c < Dh; ++c) y[c] = widen_scalar<uint16_t>(qr[c]);
  i8a::rotate(y, static_cast<int>(Dh));
  float amax = 0.0f;
  for (int64_t c = 0; c < Dh; ++c) amax = lq::max_nan_ignoring(amax, lq::abs(y[c]));
  const float sq = i8a::row_scale(amax);
  for (int64_t c = 0; c < Dh; ++c) q8[c] = i8a::quant(y[c], sq);
  *a = lq::mul(sq, cs);
}

inline int32_t dot_i8(const int8_t* a, const int8_t* b, int64_t n) {
  int32_t s = 0;
  for (int64_t c = 0; c < n; ++c) s += static_cast<int32_t>(a[c]) * static_cast<int32_t>(b[c]);
  return s;
}

}  // namespace

Status cpu_op_int8_key_stats(const TensorView& k, const TensorView& v, const TensorView& stats, int64_t k0,
                             bool reset) {
  LS_TRY(require_host("int8_key_stats", {&k, &v, &stats}));
  LS_TRY(check_bf16_keys("int8_key_stats", k, v));
  const int64_t n = k.size(0), H = k.size(1), Dh = k.size(2);
  check_stats("int8_key_stats", stats, H, Dh);
  const int64_t NB = stats.size(0) - 2;
  LS_CHECK_MSG(k0 >= 0 && (n == 0 || (k0 + n - 1) / kInt8StatBlock < NB),
               "int8_key_stats: keys [" + std::to_string(k0) + ", " + std::to_string(k0 + n) + ") lie past the " +
                   std::to_string(NB) + " statistics blocks of stats " + stats.shape_str());
  float* st = stats.ptr<float>();
  const int64_t HD = H * Dh;
  const float inf = std::numeric_limits<float>::infinity();
  if (reset) {
    for (int64_t i = 0; i < HD; ++i) {
      st[i] = -inf;
      st[HD + i] = inf;
    }
    for (int64_t i = 2 * HD; i < (2 + NB) * HD; ++i) st[i] = 0.0f;
  }
  // K's extremes over the keys of block 0 only; V's max |v| per block (max/min: exact, order-free).
  const int64_t n0 = std::clamp<int64_t>(kInt8StatBlock - k0, 0, n);
  parallel_for(H, 1, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t c = 0; c < Dh; ++c) {
        float kmax = st[h * Dh + c], kmin = st[HD + h * Dh + c];
        for (int64_t j = 0; j < n0; ++j) {
          const float kv = bf16_at(k, j, h, c);
          kmax = kv > kmax ? kv : kmax;
          kmin = kv < kmin ? kv : kmin;
        }
        st[h * Dh + c] = kmax;
        st[HD + h * Dh + c] = kmin;
        for (int64_t j = 0; j < n; ++j) {
          float& vabs = st[(2 + (k0 + j) / kInt8StatBlock) * HD + h * Dh + c];
          const float vv = lq::abs(bf16_at(v, j, h, c));
          vabs = vv > vabs ? vv : vabs;
        }
      }
  });
  return Status();
}

Status cpu_op_int8_prepare(const TensorView& k, const TensorView& v, const TensorView& stats, const Int8Keys& keys) {
  LS_TRY(require_host("int8_prepare", {&k, &v, &stats, &keys.k8, &keys.sk, &keys.v8t, &keys.vs}));
  LS_TRY(check_bf16_keys("int8_prepare", k, v));
  const int64_t n = k.size(0), H = k.size(1), Dh = k.size(2), HD = H * Dh;
  check_stats("int8_prepare", stats, H, Dh);
  LS_CHECK_MSG(keys.keys() == n, "int8_prepare: " + std::to_string(n) + " keys into prepared keys of " +
                                     std::to_string(keys.keys()));
  check_keys(keys, H, Dh);
  LS_CHECK_MSG(keys.vs.size(0) == stats.size(0) - 2,
               "int8_prepare: the V-scale table " + keys.vs.shape_str() + " and stats " + stats.shape_str() +
                   " must have the same number of statistics blocks");
  LS_TRY(check_int8_prepare_start(keys));
  if (n == 0) return Status();
  const float* st = stats.ptr<float>();
  // The blocks of these keys: sv_b = row_scale(max |v| of block b), rho_b = fl32(sv_{b-1} / sv_b)
  // (rho_0 = 1), each a function of the statistics alone (docs §3; idempotent per block).
  const int64_t k0 = keys.k0, b0 = k0 / kInt8StatBlock, b1 = (k0 + n - 1) / kInt8StatBlock;
  float* vs = keys.vs.ptr<float>();
  for (int64_t b = b0; b <= b1; ++b)
    for (int64_t i = 0; i < HD; ++i) {
      const float sv = i8a::row_scale(st[(2 + b) * HD + i]);
      vs[(2 * b) * HD + i] = sv;
      vs[(2 * b + 1) * HD + i] = b == 0 ? 1.0f : lq::div(i8a::row_scale(st[(1 + b) * HD + i]), sv);
    }
  const int64_t ld = keys.v8t.stride[1], hs = keys.v8t.stride[0];
  int8_t* v8t = keys.v8t.ptr<int8_t>();
  // y = R(fl32(k - mu)) of key j, head h (the same bits in both walks below).
  const auto centred_rotated = [&](int64_t j, int64_t h, float* y) {
    for (int64_t c = 0; c < Dh; ++c) {
      const float mu = lq::mul(0.5f, lq::add(st[h * Dh + c], st[HD + h * Dh + c]));
      y[c] = lq::sub(bf16_at(k, j, h, c), mu);
    }
    i8a::rotate(y, static_cast<int>(Dh));
  };
  // Walk 1, per key: V, and each key's own row scale row_scale(max |y|) into sk.
  parallel_for(n, std::max<int64_t>(1, 4096 / HD), [&](int64_t j0, int64_t j1) {
    float y[kMaxHeadDim];
    for (int64_t j = j0; j < j1; ++j) {
      const float* sv = vs + 2 * ((k0 + j) / kInt8StatBlock) * HD;
      for (int64_t h = 0; h < H; ++h) {
        centred_rotated(j, h, y);
        float amax = 0.0f;
        for (int64_t c = 0; c < Dh; ++c) amax = lq::max_nan_ignoring(amax, lq::abs(y[c]));
        static_cast<float*>(keys.sk.at(j))[h] = i8a::row_scale(amax);
        for (int64_t c = 0; c < Dh; ++c) v8t[h * hs + c * ld + j] = i8a::quant(bf16_at(v, j, h, c), sv[h * Dh + c]);
      }
    }
  });
  // Walk 2, per 128-key tile (k0 is a multiple of 128, so local tiles are absolute tiles and a
  // group never leaves its task): the group scale = the largest of its keys' row scales
  // (row_scale is monotone: = row_scale of the group's largest max |y|; a max, exact), k8 =
  // quant(y, group scale), then every key of the group holds the group scale in sk.
  constexpr int64_t kG = kInt8KeyGroupStride;
  const int64_t tiles = (n + kInt8KeyGroupTile - 1) / kInt8KeyGroupTile;
  parallel_for(tiles, 1, [&](int64_t t0, int64_t t1) {
    float y[kMaxHeadDim];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t j0 = t * kInt8KeyGroupTile, j1 = std::min(n, j0 + kInt8KeyGroupTile);
      for (int64_t h = 0; h < H; ++h) {
        float gs[kG];
        for (int64_t g = 0; g < kG; ++g) gs[g] = 0.0f;
        for (int64_t j = j0; j < j1; ++j) {
          const float s = static_cast<const float*>(keys.sk.at(j))[h];
          gs[j % kG] = s > gs[j % kG] ? s : gs[j % kG];
        }
        for (int64_t j = j0; j < j1; ++j) {
          centred_rotated(j, h, y);
          int8_t* k8 = static_cast<int8_t*>(keys.k8.at(j, h));
          for (int64_t c = 0; c < Dh; ++c) k8[c] = i8a::quant(y[c], gs[j % kG]);
          static_cast<float*>(keys.sk.at(j))[h] = gs[j % kG];
        }
      }
    }
  });
  return Status();
}

Status cpu_op_attention_int8(const TensorView& q, const Int8Keys& keys, const TensorView& out, const AttentionParams& p) {
  LS_TRY(require_host("attention_int8", {&q, &out, &p.state, &keys.k8, &keys.sk, &keys.v8t, &keys.vs}));
  if (q.dtype != DType::bf16 || out.dtype != DType::bf16)
    return unsupported_dtypes("attention_int8",
                              std::string("q=") + dtype_name(q.dtype) + " out=" + dtype_name(out.dtype),
                              "q, out bf16");
  LS_CHECK_MSG(q.ndim == 3 && out.ndim == 3 && out.size(0) == q.size(0) && out.size(1) == q.size(1) &&
                   out.size(2) == q.size(2) && q.inner_contiguous() && out.inner_contiguous(),
               "attention_int8 wants q, out [Mq, H, Dh]; got " + q.shape_str() + ", " + out.shape_str());
  const int64_t Mq = q.size(0), H = q.size(1), Dh = q.size(2), Mk = keys.keys();
  LS_TRY(check_head_dim("attention_int8", Dh));
  check_keys(keys, H, Dh);
  if (p.kv_tile <= 0 || p.kv_tile > kInt8MaxKvTile)
    return make_error(ErrorCode::invalid_argument, "attention_int8: kv_tile must be in [1, " +
                                                       std::to_string(kInt8MaxKvTile) + "]; got " +
                                                       std::to_string(p.kv_tile));
  if (!i8a::scale_ok(p.scale)) return make_error(ErrorCode::invalid_argument, i8a::scale_error(p.scale));
  LS_TRY(check_attention_state(p, Mq, Mk, H, Dh));
  LS_CHECK_MSG(Mk > 0, "attention_int8 over zero keys");
  // Keys [k0, k0 + Mk) of the sequence; tiles never straddle a statistics block.
  const int64_t k0 = keys.k0, HD = H * Dh;
  if (k0 / kInt8StatBlock != (k0 + Mk - 1) / kInt8StatBlock &&
      (kInt8StatBlock % p.kv_tile != 0 || k0 % p.kv_tile != 0))
    return make_error(ErrorCode::invalid_argument,
                      "attention_int8: keys [" + std::to_string(k0) + ", " + std::to_string(k0 + Mk) +
                          ") cross a statistics block boundary (every " + std::to_string(kInt8StatBlock) +
                          " keys): kv_tile " + std::to_string(p.kv_tile) + " must divide " +
                          std::to_string(kInt8StatBlock) + " and the first key");
  const float scale = attention_scale(p, Dh);
  const float cs = i8a::score_factor(scale, static_cast<int>(Dh));
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int64_t ld = keys.v8t.stride[1], hs = keys.v8t.stride[0];
  const int8_t* v8t = keys.v8t.ptr<int8_t>();
  const float* vs = keys.vs.ptr<float>();
  float* state = p.state.empty() ? nullptr : p.state.ptr<float>();
  const int64_t work = std::max<int64_t>(1, 2 * Mk * Dh);
  parallel_for(H * Mq, std::max<int64_t>(1, (1 << 18) / work), [&](int64_t b, int64_t e) {
    int8_t q8[kMaxHeadDim];
    float acc[kMaxHeadDim];
    int32_t ot[kMaxHeadDim];
    uint8_t p8[kChunk];
    int32_t dkept[kChunk];
    for (int64_t idx = b; idx < e; ++idx) {
      const int64_t h = idx / Mq, i = idx % Mq;
      float a = 0.0f;
      quantise_query(static_cast<const uint16_t*>(q.at(i, h)), Dh, cs, q8, &a);
      float* st = state ? state + (i * H + h) * (Dh + kAttentionStateExtra) : nullptr;
      float m = neg_inf, l = 0.0f;
      if (p.state_in) {
        for (int64_t c = 0; c < Dh; ++c) acc[c] = st[c];
        m = st[Dh];
        l = st[Dh + 1];
      } else {
        for (int64_t c = 0; c < Dh; ++c) acc[c] = 0.0f;
      }
      // d_j = q8 . k8_j (int32, exact); u_j = fl32(sk_j * float(d_j)) (docs §4.2: float(d)
      // exact, |d| < 2^24) only for the tile's maximum mu_T; sT = fl32(a * mu_T).
      auto score_d = [&](int64_t j) { return dot_i8(q8, static_cast<const int8_t*>(keys.k8.at(j, h)), Dh); };
      auto sk_of = [&](int64_t j) { return static_cast<const float*>(keys.sk.at(j))[h]; };
      for (int64_t t0 = 0; t0 < Mk; t0 += p.kv_tile) {
        const int64_t t1 = std::min(Mk, t0 + p.kv_tile);
        // A tile of at most kChunk keys (the default kv_tile 128) keeps its d for the second
        // walk; a longer one recomputes them (the same bits: d is a fixed function of j).
        const bool kept = t1 - t0 <= kChunk;
        float mu = neg_inf;  // mu_T: a max of floats, exact and order-free
        for (int64_t j = t0; j < t1; ++j) {
          const int32_t dj = score_d(j);
          if (kept) dkept[j - t0] = dj;
          const float uj = lq::mul(sk_of(j), static_cast<float>(dj));
          mu = uj > mu ? uj : mu;
        }
        const float sT = lq::mul(a, mu);  // the tile's largest score (log2 units)
        const bool v4_form = i8a::score_fma_form(sT);
        const float bT = lq::sub(i8a::kP8Top, sT);
        int64_t lt = 0;  // sum of p8 (<= 255 * kv_tile: float(lt) exact up to kv_tile 65536)
        for (int64_t c = 0; c < Dh; ++c) ot[c] = 0;
        for (int64_t c0 = t0; c0 < t1; c0 += kChunk) {
          const int64_t c1 = std::min(t1, c0 + kChunk);
          for (int64_t j = c0; j < c1; ++j) {
            // Contract v4 (§4.4): x = fmaf(fl32(a * sk_j), float(d_j), fl32(kP8Top - sT)) where
            // |sT| < 4096 (within 9.8e-4 of kP8Top at the tile's maximum), else v3's
            // fmaf(a, fl32(u_j - mu_T), kP8Top); p8 = #{k : theta_k <= x} (the H200's ex2
            // steps, §4.3), saturating: 255 for every x >= theta_255.
            const int32_t dj = kept ? dkept[j - t0] : score_d(j);
            const float x = v4_form ? lq::fma(lq::mul(a, sk_of(j)), static_cast<float>(dj), bT)
                                    : lq::fma(a, lq::sub(lq::mul(sk_of(j), static_cast<float>(dj)), mu), i8a::kP8Top);
            const int pj = i8a::p8_table(x);
            p8[j - c0] = static_cast<uint8_t>(pj);
            lt += pj;
          }
          for (int64_t c = 0; c < Dh; ++c) {
            const int8_t* vr = v8t + h * hs + c * ld + c0;
            int32_t sum = 0;
            for (int64_t j = 0; j < c1 - c0; ++j) sum += static_cast<int32_t>(p8[j]) * static_cast<int32_t>(vr[j]);
            ot[c] += sum;
          }
        }
        // A tile that starts statistics block b > 0 first moves acc from block b - 1's units of
        // V to block b's: acc_c = fl32(acc_c * rho_b,c) (§4.4, contract v3).
        const int64_t ta = k0 + t0;
        if (ta > 0 && ta % kInt8StatBlock == 0) {
          const float* rho = vs + (2 * (ta / kInt8StatBlock) + 1) * HD + h * Dh;
          for (int64_t c = 0; c < Dh; ++c) acc[c] = lq::mul(acc[c], rho[c]);
        }
        // The fold (§4.4): the tile's integer partials scaled by beta = 2^(sT - m_new), the
        // state by alpha = 2^(m - m_new); both by the defined exp2e (exp2e(0) = 1 exactly).
        const float m_new = sT > m ? sT : m;
        const float alpha = m == neg_inf ? 0.0f : i8a::exp2e(lq::sub(m, m_new));
        const float beta = i8a::exp2e(lq::sub(sT, m_new));
        l = lq::fma(static_cast<float>(lt), beta, lq::mul(l, alpha));
        for (int64_t c = 0; c < Dh; ++c) acc[c] = lq::fma(static_cast<float>(ot[c]), beta, lq::mul(acc[c], alpha));
        m = m_new;
      }
      if (!p.finalize) {
        for (int64_t c = 0; c < Dh; ++c) st[c] = acc[c];
        st[Dh] = m;
        st[Dh + 1] = l;
        continue;
      }
      // acc is in the units of the last key's block: out = fl32(fl32(acc * sv_bL) / l).
      const float* sv = vs + 2 * ((k0 + Mk - 1) / kInt8StatBlock) * HD + h * Dh;
      uint16_t* o = static_cast<uint16_t*>(out.at(i, h));
      for (int64_t c = 0; c < Dh; ++c) o[c] = f32_to_bf16(lq::div(lq::mul(acc[c], sv[c]), l));
    }
  });
  return Status();
}

}  // namespace ls::cpu
