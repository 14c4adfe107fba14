// Eight fp32 lanes ("F8") and the fixed 16-lane reduction every CPU op uses.
//
// Why this exists: the CPU backend must give the same bits however rows are split
// over threads and whether or not the compiler vectorises. So every reduction in
// src/backend/cpu is written over explicit lanes, and each lane operation is one
// IEEE fp32 multiply or add (no FMA: -ffp-contract=off, and we never call an FMA
// intrinsic here). With AVX2 an F8 is one __m256; without it an F8 is a plain
// float[8] with the same per-lane arithmetic, so both builds give identical bits.
//
// The 16-lane reduction order (docs/numerics.md §1), used by GEMM, RMSNorm, the q/k
// norm and the attention dot products, for a sum over i in [0, n) of a_i * b_i:
//   1. lane accumulators acc[0..15] = +0; for i ascending: acc[i % 16] += fl(a_i * b_i)
//      (n is padded with zeros to a multiple of 16; a padded product is +0 * +0);
//   2. fixed pairwise tree: s8[l] = acc[l] + acc[l + 8]      (l < 8)
//                           s4[l] = s8[l] + s8[l + 4]        (l < 4)
//                           s2[l] = s4[l] + s4[l + 2]        (l < 2)
//                           sum   = s2[0] + s2[1]
// With AVX2, acc is two registers: lo = lanes 0..7 (i % 16 < 8), hi = lanes 8..15.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace ls::cpu {

#if defined(__AVX2__)
struct F8 {
  __m256 v;
};
inline F8 f8_zero() { return {_mm256_setzero_ps()}; }
inline F8 f8_set1(float a) { return {_mm256_set1_ps(a)}; }
inline F8 f8_load(const float* p) { return {_mm256_loadu_ps(p)}; }
// bf16 -> fp32 is exact: the bf16 bits become the upper half of the fp32 word.
inline F8 f8_load(const uint16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))};
}
inline F8 f8_add(F8 a, F8 b) { return {_mm256_add_ps(a.v, b.v)}; }
inline F8 f8_mul(F8 a, F8 b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline F8 f8_max(F8 a, F8 b) { return {_mm256_max_ps(a.v, b.v)}; }
inline void f8_store(float* p, F8 a) { _mm256_storeu_ps(p, a.v); }
// Steps 2-4 of the tree given s8 (already acc_lo + acc_hi).
inline float f8_tree8(F8 s8) {
  __m128 lo = _mm256_castps256_ps128(s8.v);
  __m128 hi = _mm256_extractf128_ps(s8.v, 1);
  __m128 s4 = _mm_add_ps(lo, hi);               // s4[l] = s8[l] + s8[l + 4]
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));  // s2[l] = s4[l] + s4[l + 2]
  __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));  // s2[0] + s2[1]
  return _mm_cvtss_f32(s1);
}
#else
struct F8 {
  float v[8];
};
inline F8 f8_zero() { return F8{{0, 0, 0, 0, 0, 0, 0, 0}}; }
inline F8 f8_set1(float a) { return F8{{a, a, a, a, a, a, a, a}}; }
inline F8 f8_load(const float* p) {
  F8 r;
  std::memcpy(r.v, p, sizeof r.v);
  return r;
}
inline F8 f8_load(const uint16_t* p) {
  F8 r;
  for (int l = 0; l < 8; ++l) {
    uint32_t u = static_cast<uint32_t>(p[l]) << 16;
    std::memcpy(&r.v[l], &u, 4);
  }
  return r;
}
inline F8 f8_add(F8 a, F8 b) {
  for (int l = 0; l < 8; ++l) a.v[l] = a.v[l] + b.v[l];
  return a;
}
inline F8 f8_mul(F8 a, F8 b) {
  for (int l = 0; l < 8; ++l) a.v[l] = a.v[l] * b.v[l];
  return a;
}
inline F8 f8_max(F8 a, F8 b) {
  // same NaN behaviour as _mm256_max_ps: returns b unless a > b
  for (int l = 0; l < 8; ++l) a.v[l] = a.v[l] > b.v[l] ? a.v[l] : b.v[l];
  return a;
}
inline void f8_store(float* p, F8 a) { std::memcpy(p, a.v, sizeof a.v); }
inline float f8_tree8(F8 s8) {
  float s4[4], s2[2];
  for (int l = 0; l < 4; ++l) s4[l] = s8.v[l] + s8.v[l + 4];
  for (int l = 0; l < 2; ++l) s2[l] = s4[l] + s4[l + 2];
  return s2[0] + s2[1];
}
#endif

// The whole tree from the two accumulator halves (lanes 0..7 and 8..15).
inline float f8_tree16(F8 lo, F8 hi) { return f8_tree8(f8_add(lo, hi)); }

// Widen 8 elements of a tail (n < 8 valid, rest zero) to fp32.
template <typename T>
inline float widen_scalar(T v);
template <>
inline float widen_scalar<float>(float v) { return v; }
template <>
inline float widen_scalar<uint16_t>(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Copies a[i0 .. i0 + count) widened to fp32 into buf[0..16), zero-padding the rest.
template <typename T>
inline void widen_tail16(const T* a, int64_t count, float* buf) {
  for (int64_t l = 0; l < 16; ++l) buf[l] = l < count ? widen_scalar<T>(a[l]) : 0.0f;
}

// sum_i a_i * b_i, i in [0, n), in the fixed 16-lane order above. A, B: float or
// uint16_t (bf16 bits).
template <typename A, typename B>
inline float dot16(const A* a, const B* b, int64_t n) {
  F8 lo = f8_zero(), hi = f8_zero();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    lo = f8_add(lo, f8_mul(f8_load(a + i), f8_load(b + i)));
    hi = f8_add(hi, f8_mul(f8_load(a + i + 8), f8_load(b + i + 8)));
  }
  if (i < n) {
    alignas(32) float ta[16], tb[16];
    widen_tail16(a + i, n - i, ta);
    widen_tail16(b + i, n - i, tb);
    lo = f8_add(lo, f8_mul(f8_load(ta), f8_load(tb)));
    hi = f8_add(hi, f8_mul(f8_load(ta + 8), f8_load(tb + 8)));
  }
  return f8_tree16(lo, hi);
}

// The same order over an RT x CT register tile of dot products, the one home of the
// tiled form (the GEMM's bf16 / f32 operands, the quantised linears' fp8 codes):
//   res[r * CT + c] = sum_k x_r[k] * w_c[k], k in [0, K), in the 16-lane order above.
// Each of the RT + CT operand rows is read through its loader (X for x, W for w):
//   F8 load8(int i, int64_t k) const           elements k .. k + 7 of row i as fp32 lanes
//   void tail16(int i, int64_t k, int64_t n, float* buf) const
//                                              elements k .. k + n - 1 (n < 16) widened,
//                                              buf[n .. 15] = +0 (the zero padding)
// Loaders only widen exactly (bf16, f32, e4m3 -> fp32): every product and sum is the
// lane operation above, so any loader gives the bits of dot16 over the widened values.
template <int RT, int CT, typename X, typename W>
inline void dot16_tile(const X& x, const W& w, int64_t K, float* res) {
  F8 lo[RT][CT], hi[RT][CT];
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < CT; ++c) lo[r][c] = hi[r][c] = f8_zero();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    F8 wv[CT];
    for (int c = 0; c < CT; ++c) wv[c] = w.load8(c, k);
    for (int r = 0; r < RT; ++r) {
      const F8 xv = x.load8(r, k);
      for (int c = 0; c < CT; ++c) lo[r][c] = f8_add(lo[r][c], f8_mul(xv, wv[c]));
    }
    for (int c = 0; c < CT; ++c) wv[c] = w.load8(c, k + 8);
    for (int r = 0; r < RT; ++r) {
      const F8 xv = x.load8(r, k + 8);
      for (int c = 0; c < CT; ++c) hi[r][c] = f8_add(hi[r][c], f8_mul(xv, wv[c]));
    }
  }
  if (k < K) {  // the last K % 16 terms, zero-padded to 16 lanes
    alignas(32) float xt[RT][16];
    alignas(32) float wt[CT][16];
    for (int r = 0; r < RT; ++r) x.tail16(r, k, K - k, xt[r]);
    for (int c = 0; c < CT; ++c) w.tail16(c, k, K - k, wt[c]);
    for (int r = 0; r < RT; ++r)
      for (int c = 0; c < CT; ++c) {
        lo[r][c] = f8_add(lo[r][c], f8_mul(f8_load(xt[r]), f8_load(wt[c])));
        hi[r][c] = f8_add(hi[r][c], f8_mul(f8_load(xt[r] + 8), f8_load(wt[c] + 8)));
      }
  }
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < CT; ++c) res[r * CT + c] = f8_tree16(lo[r][c], hi[r][c]);
}

// The loader of rows of float or bf16 bits (uint16_t), widened exactly.
template <typename T>
struct WidenRows {
  const T* const* rows;
  F8 load8(int i, int64_t k) const { return f8_load(rows[i] + k); }
  void tail16(int i, int64_t k, int64_t n, float* buf) const { widen_tail16(rows[i] + k, n, buf); }
};

// Plain scalar statement of the same order, for tests ("use_ref" of style-lessons §4).
template <typename A, typename B>
inline float dot16_reference(const A* a, const B* b, int64_t n) {
  float acc[16] = {};
  int64_t padded = (n + 15) / 16 * 16;
  for (int64_t i = 0; i < padded; ++i) {
    float x = i < n ? widen_scalar<A>(a[i]) : 0.0f;
    float y = i < n ? widen_scalar<B>(b[i]) : 0.0f;
    float p = x * y;
    acc[i % 16] = acc[i % 16] + p;
  }
  float s8[8], s4[4], s2[2];
  for (int l = 0; l < 8; ++l) s8[l] = acc[l] + acc[l + 8];
  for (int l = 0; l < 4; ++l) s4[l] = s8[l] + s8[l + 4];
  for (int l = 0; l < 2; ++l) s2[l] = s4[l] + s4[l + 2];
  return s2[0] + s2[1];
}

}  // namespace ls::cpu
