// The element arithmetic of INT8 attention (AttentionAlgorithm::int8), written ONCE and
// compiled for the host (the CPU reference, src/backend/cpu/attention_int8.cpp) and for
// the device (the CUDA kernels). docs/int8-attention.md is the contract; every function
// here is a fixed sequence of correctly rounded IEEE fp32 operations (the ls::lq
// primitives of linear_quant_math.h: _rn intrinsics on the device, -ffp-contract=off on
// the host) and bit manipulation, so host and device give the same bits.
//
//   i8a::negative_sign(c)     the fixed sign vector of the rotation (§3)
//   i8a::rotate(x, Dh)        x <- R x: signs, then the unnormalised fast Walsh-Hadamard
//                             transform, strides 1, 2, ..., Dh/2 (§3)
//   i8a::row_scale(amax)      max(fl32(amax * fl32(1/127)), 1e-30)
//   i8a::quant(x, s)          clamp(rint(fl32(x / s)), -127, 127) (NaN -> 0)
//   i8a::recip_d(s, r0), div_rd(x, r), quant_rd(x, r)
//                             fl32(x / s) and quant(x, s) without a division instruction: the
//                             SAME bits, for the GPU kernels (below)
//   i8a::exp2e(t)             the defined exp2 for t <= 0 (§4.3, coefficients E): alpha, beta
//   i8a::exp2e_nb(t)          the same bits without a branch (the CUDA kernels)
//   i8a::fold_factors(m, sT, alpha, beta)  §4.4's alpha and beta by one exp2e_nb (the CUDA kernels)
//   i8a::score_factor(scale, Dh)  cs = fl32(fl32(scale * log2e) * (1/Dh))
//   i8a::p8_table(x)          contract v2's p8 (§4.3): #{k : theta_k <= x}, x <= kP8Top
//   i8a::scale_ok(scale)      the scales int8 attention takes (positive, finite; 0 = default)
#pragma once

#include <cstdint>
#include <string>

#include "backend/cpu/linear_quant_math.h"

namespace ls::i8a {

constexpr float kInv127 = 0x1.020408p-7f;  // fl32(1/127)
constexpr float kTiny = 1e-30f;
constexpr float kLog2e = 0x1.715476p+0f;   // fl32(log2(e))
constexpr float kExp2Min = -125.0f;         // exp2c(t) = 0 below this

// exp2 polynomial coefficients c0..c5 (Horner from c5), as literals so device code needs
// no host object: E (exp2e) = fl32(ln2^k / k!). (Contract v1 also had P255 = fl32(255 E_k)
// for p8 and its 22-bit row-sum term pl; v2 takes p8 from the threshold table below.)
constexpr float kE0 = 0x1p+0f, kE1 = 0x1.62e430p-1f, kE2 = 0x1.ebfbe0p-3f, kE3 = 0x1.c6b08ep-5f,
                kE4 = 0x1.3b2ab6p-7f, kE5 = 0x1.5d87fep-10f;

LQ_HD bool negative_sign(int c) { return ((static_cast<uint32_t>(c) * 2654435761u) >> 31) != 0; }

// x[0..Dh) <- R x (Dh a power of two). In place.
LQ_HD void rotate(float* x, int Dh) {
  for (int c = 0; c < Dh; ++c)
    if (negative_sign(c)) x[c] = -x[c];
  for (int s = 1; s < Dh; s <<= 1)
    for (int i = 0; i < Dh; ++i)
      if ((i & s) == 0) {
        const float a = x[i], b = x[i + s];
        x[i] = lq::add(a, b);
        x[i + s] = lq::sub(a, b);
      }
}

LQ_HD float row_scale(float amax) {
  const float s = lq::mul(amax, kInv127);
  return s > kTiny ? s : kTiny;
}

LQ_HD int8_t clamp127(float r) {  // r = rint(...); NaN -> 0
  if (!(r == r)) return 0;
  return static_cast<int8_t>(r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r);
}
LQ_HD int8_t quant(float x, float s) { return clamp127(lq::rint(lq::div(x, s))); }

// ---- fl32(x / s) without a division (session 14) ----------------------------------------
// CUDA's correctly rounded fp32 division (__fdiv_rn) is a fast path plus a range check that
// branches to a slow-path subroutine; each division is its own basic block, so a warp
// quantising 16 rows cannot interleave them, and the Hopper kernel spent ~10 us per (query
// tile, head) quantising Q (bench/results/issue26/run12, the per-item trace). This computes
// the same bits with no branch, from one reciprocal per divisor:
//   r = 1/s to within 2^-52 relative: two Newton steps in fp64, e = fma(-s, r, 1), r =
//       fma(r, e, r), from a seed r0 within 2^-22 of 1/s (on the GPU rcp.approx.f32, at most
//       1 ulp off: 2^-23); the first step leaves ~2^-44, the second the rounding, <= 2^-53
//       (1 + 2^-35) (e is computed with one rounding of a value ~2^-44, r + r e with one);
//   fl32(x / s) = fl32(fl64(x * r)) wherever x / s is in fp32's NORMAL range: fl64(x r) is
//       within 2^-52 (1 + 2^-34) of x / s, and no fp32 rounding boundary (a midpoint
//       between adjacent floats) lies that close: for floats x = X 2^a, s = S 2^b (X, S odd,
//       < 2^24) and a normal-range midpoint m = M 2^c (M odd, 2^24 < M < 2^25), x - s m is
//       2^min(a, b + c) times a nonzero integer (by parity; where a = b + c, X = S M is
//       impossible as S M >= M > X), so |x/s - m| >= |x/s| / (1.5 S M) > 2^-50 |x/s|: both
//       round to the same float. (A SUBNORMAL quotient can be a midpoint exactly, e.g. 9 2^-149
//       / 6, where fl64(x r) may fall on either side: there the bits may differ. quant_rd
//       rounds such quotients, |x/s| < 2^-126, to 0 either way; the output division of the
//       kernels takes the IEEE division for its rare tiny numerators.)
//       x = 0, +-inf, NaN: the IEEE division's result (r finite and > 0).
// Valid for s in [2^-126, 2^126] (1/s normal: the row scale is at least kTiny = 1e-30 and a
// finite rotated bf16 row's amax / 127 is far below 2^126; the output's divisor l is >= 255)
// and s = +inf (r = 0: x / inf = 0, inf / inf = NaN, as IEEE). tests/test_attention_int8.cpp
// checks it against the IEEE division on adversarial quotients (within ulps of half-integers
// and of midpoints); the CUDA tests compare the kernels' bytes with the CPU's.
LQ_HD double recip_d(float s, float r0) {
  const double sd = static_cast<double>(s);
  double r = static_cast<double>(r0);
#if defined(__CUDA_ARCH__)
  double e = __fma_rn(-sd, r, 1.0);
  r = __fma_rn(r, e, r);
  e = __fma_rn(-sd, r, 1.0);
  r = __fma_rn(r, e, r);
#else
  double e = std::fma(-sd, r, 1.0);
  r = std::fma(r, e, r);
  e = std::fma(-sd, r, 1.0);
  r = std::fma(r, e, r);
#endif
  return s > 3.4028234663852886e38f ? 0.0 : r;  // s = +inf: the Newton steps would give NaN
}
LQ_HD float div_rd(float x, double r) {
#if defined(__CUDA_ARCH__)
  return __double2float_rn(__dmul_rn(static_cast<double>(x), r));
#else
  return static_cast<float>(static_cast<double>(x) * r);
#endif
}
LQ_HD int8_t quant_rd(float x, double r) { return clamp127(lq::rint(div_rd(x, r))); }
#if defined(__CUDACC__)
// The device seed: rcp.approx.f32 (at most 1 ulp off, PTX ISA), no branch. (Declared in
// nvcc's host pass too, where device code is parsed.)
__device__ __forceinline__ double recip_d(float s) {
  float r0;
#if defined(__CUDA_ARCH__)
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(s));
#else
  r0 = 1.0f / s;
#endif
  return recip_d(s, r0);
}
#endif

// The degree-5 polynomial of exp2c / exp2e_nb: Horner from c5, one fmaf per step.
LQ_HD float exp2_horner(float f, float c0, float c1, float c2, float c3, float c4, float c5) {
  float p = c5;
  p = lq::fma(p, f, c4);
  p = lq::fma(p, f, c3);
  p = lq::fma(p, f, c2);
  p = lq::fma(p, f, c1);
  return lq::fma(p, f, c0);
}
LQ_HD float exp2c(float t, float c0, float c1, float c2, float c3, float c4, float c5) {
  if (t < kExp2Min) return 0.0f;
  const float nf = lq::rint(t);
  const float f = lq::sub(t, nf);  // exact
  const float p = exp2_horner(f, c0, c1, c2, c3, c4, c5);
  return lq::mul(p, lq::pow2i(static_cast<int>(nf)));  // exact: the result is normal
}
// alpha = exp2e(m - m_new)
LQ_HD float exp2e(float t) { return exp2c(t, kE0, kE1, kE2, kE3, kE4, kE5); }
// exp2e with the same bits and no branch (the CUDA kernels' per-row form, session 18): rint by
// the shift kShift = 1.5 2^23 (fl32(t + kShift) = kShift + rint(t), ties to even, for |t| <
// 2^22: the sum lies in [2^23, 2^24), whose spacing is 1), and 2^n from the shifted sum's bits
// (bits(t + kShift) = 0x4B400000 + n, and 0x4B400000 << 23 wraps to 0, so (bits << 23) +
// 0x3f800000 is the fp32 2^n, normal for n >= -126). Below kExp2Min the polynomial's value is
// computed and discarded (a select, not a branch). t = -0 gives f = -0 where exp2c has +0: the
// polynomial's first fmaf makes both c4. tests/test_attention_int8.cpp compares it with exp2e
// (every fp32 t in [-130, -0] was compared once: 1,124,204,554 patterns, 0 differ).
// Why: exp2e's `t < kExp2Min` test compiled to a branch in the Hopper kernel's per-row head,
// which split the two rows' chains (max, shuffles, exp2e) into blocks that could not overlap.
LQ_HD float exp2e_nb(float t) {
  constexpr float kShift = 0x1.8p23f;
  const float sh = lq::add(t, kShift);
  const float f = lq::sub(t, lq::sub(sh, kShift));  // exact
  const float p = exp2_horner(f, kE0, kE1, kE2, kE3, kE4, kE5);
  const float r = lq::mul(p, lq::from_bits((lq::bits(sh) << 23) + 0x3f800000u));
  return t < kExp2Min ? 0.0f : r;
}
// The fold's factors of §4.4 for a row with running maximum m and tile maximum sT (m_new =
// max(m, sT)): alpha = exp2e(fl32(m - m_new)) (0 when m = -inf), beta = exp2e(fl32(sT - m_new)),
// with one exp2e_nb instead of two: one of them is exp2e(0) = 1, the other's argument is
// -|m - sT| (fl32(m - sT) where the tile raises the maximum, else fl32(sT - m)), and m = -inf
// raises it and gives exp2e(-inf) = 0 = alpha. The same bits as the CPU reference's two exp2e
// (tests/test_attention_int8.cpp); the CUDA kernels' per-row form.
LQ_HD void fold_factors(float m, float sT, float& alpha, float& beta) {
  const bool rise = sT > m;
  const float e = exp2e_nb(rise ? lq::sub(m, sT) : lq::sub(sT, m));
  alpha = rise ? e : 1.0f;
  beta = rise ? 1.0f : e;
}

// The attention scale of int8: AttentionParams::scale, 0 meaning 1/sqrt(Dh). It must be
// positive and finite (0 included as "the default"): x = fmaf(a, w, kP8Top) <= kP8Top needs
// a > 0 (a negative scale would put x above kP8Top, where the GPU's fast p8 byte wraps and
// the table saturates), so every backend refuses others (scale_error).
inline bool scale_ok(float scale) { return scale >= 0.0f && scale <= 3.4028234663852886e38f; }
inline std::string scale_error(float scale) {
  return "attention_int8: the scale must be positive and finite (0 = 1/sqrt(head dim)); got " + std::to_string(scale);
}

LQ_HD float score_factor(float scale, int Dh) {
  return lq::mul(lq::mul(scale, kLog2e), lq::div(1.0f, static_cast<float>(Dh)));  // 1/Dh exact
}

// ---- contract v2 (docs/int8-attention.md §4.3): p8 by a threshold table ----------------
// p8(x) = #{k in 1..255 : theta_k <= x} for x <= kP8Top, where theta_k (fp32 bit patterns
// below) are the points where rint(ex2.approx.ftz.f32(x)) steps on the NVIDIA H200
// (sm_90), measured over every fp32 pattern by tools/device/int8_p8_table.cu. So a CUDA
// kernel computes p8 with one MUFU.EX2 and one fp32 add (the low byte of
// fl32(ex2(x) + 2^23)) on any GPU whose ex2 gives this table (checked exhaustively at run
// time by the CUDA backend), and the CPU gives the same bytes by a binary search.
// Measured 2026-12-02 on the H200 (bench/results/issue26/p8_table/p8_table.txt: 255 steps,
// monotone, NaN gives 255; each theta_k within 2 ulps of the step of correctly rounded 2^x).
// The list is a macro so host (constexpr) and device (__constant__) copies come from one text.
#define LS_I8A_P8_THRESHOLD_BITS \
  0xBF7FFFFDu, 0x3F15C01Au, 0x3FA934F1u, 0x3FE75767u, 0x400AE00Eu, 0x401D6754u, \
  0x402CD402u, 0x403A0A7Fu, 0x404598FEu, 0x404FDE0Bu, 0x40591BBBu, 0x4061820Au, \
  0x406934F1u, 0x40705014u, 0x4076E92Au, 0x407D118Eu, 0x40816BAEu, 0x40842316u, \
  0x4086B3D8u, 0x40892204u, 0x408B7111u, 0x408DA3F6u, 0x408FBD43u, 0x4091BF31u, \
  0x4093ABB4u, 0x40958482u, 0x40974B20u, 0x409900E6u, 0x409AA709u, 0x409C3E9Du, \
  0x409DC89Au, 0x409F45E1u, 0x40A0B73Du, 0x40A21D67u, 0x40A37909u, 0x40A4CABBu, \
  0x40A6130Cu, 0x40A7527Cu, 0x40A88984u, 0x40A9B893u, 0x40AAE00Eu, 0x40AC0053u, \
  0x40AD19BCu, 0x40AE2C98u, 0x40AF3936u, 0x40B03FDBu, 0x40B140CBu, 0x40B23C42u, \
  0x40B3327Du, 0x40B423B1u, 0x40B51012u, 0x40B5F7D0u, 0x40B6DB1Au, 0x40B7BA19u, \
  0x40B894F8u, 0x40B96BDBu, 0x40BA3EE9u, 0x40BB0E41u, 0x40BBDA08u, 0x40BCA259u, \
  0x40BD6754u, 0x40BE2914u, 0x40BEE7B5u, 0x40BFA34Eu, 0x40C05BFAu, 0x40C111CDu, \
  0x40C1C4E0u, 0x40C27546u, 0x40C32315u, 0x40C3CE5Eu, 0x40C47735u, 0x40C51DABu, \
  0x40C5C1D1u, 0x40C663B7u, 0x40C7036Eu, 0x40C7A103u, 0x40C83C86u, 0x40C8D603u, \
  0x40C96D89u, 0x40CA0323u, 0x40CA96E0u, 0x40CB28C8u, 0x40CBB8EAu, 0x40CC474Eu, \
  0x40CCD402u, 0x40CD5F0Cu, 0x40CDE87Au, 0x40CE7053u, 0x40CEF6A0u, 0x40CF7B6Cu, \
  0x40CFFEBDu, 0x40D0809Du, 0x40D10114u, 0x40D18029u, 0x40D1FDE4u, 0x40D27A4Cu, \
  0x40D2F569u, 0x40D36F40u, 0x40D3E7DAu, 0x40D45F3Bu, 0x40D4D56Bu, 0x40D54A6Fu, \
  0x40D5BE4Eu, 0x40D6310Cu, 0x40D6A2B0u, 0x40D7133Fu, 0x40D782BEu, 0x40D7F132u, \
  0x40D85EA1u, 0x40D8CB0Fu, 0x40D93680u, 0x40D9A0F9u, 0x40DA0A7Fu, 0x40DA7316u, \
  0x40DADAC2u, 0x40DB4188u, 0x40DBA76Au, 0x40DC0C6Eu, 0x40DC7096u, 0x40DCD3E7u, \
  0x40DD3664u, 0x40DD9811u, 0x40DDF8F1u, 0x40DE5907u, 0x40DEB857u, 0x40DF16E3u, \
  0x40DF74AFu, 0x40DFD1BFu, 0x40E02E14u, 0x40E089B2u, 0x40E0E49Cu, 0x40E13ED3u, \
  0x40E1985Du, 0x40E1F139u, 0x40E2496Cu, 0x40E2A0F7u, 0x40E2F7DEu, 0x40E34E22u, \
  0x40E3A3C7u, 0x40E3F8CEu, 0x40E44D39u, 0x40E4A10Bu, 0x40E4F446u, 0x40E546EBu, \
  0x40E598FEu, 0x40E5EA80u, 0x40E63B73u, 0x40E68BD9u, 0x40E6DBB4u, 0x40E72B06u, \
  0x40E779D1u, 0x40E7C815u, 0x40E815D6u, 0x40E86315u, 0x40E8AFD4u, 0x40E8FC13u, \
  0x40E947D6u, 0x40E9931Du, 0x40E9DDEAu, 0x40EA283Fu, 0x40EA721Du, 0x40EABB85u, \
  0x40EB0479u, 0x40EB4CFBu, 0x40EB950Cu, 0x40EBDCACu, 0x40EC23DFu, 0x40EC6AA3u, \
  0x40ECB0FDu, 0x40ECF6ECu, 0x40ED3C71u, 0x40ED818Eu, 0x40EDC645u, 0x40EE0A96u, \
  0x40EE4E82u, 0x40EE920Bu, 0x40EED532u, 0x40EF17F7u, 0x40EF5A5Du, 0x40EF9C63u, \
  0x40EFDE0Cu, 0x40F01F57u, 0x40F06048u, 0x40F0A0DCu, 0x40F0E118u, 0x40F120FAu, \
  0x40F16085u, 0x40F19FB8u, 0x40F1DE96u, 0x40F21D1Eu, 0x40F25B52u, 0x40F29932u, \
  0x40F2D6C1u, 0x40F313FDu, 0x40F350E9u, 0x40F38D84u, 0x40F3C9D1u, 0x40F405CFu, \
  0x40F44180u, 0x40F47CE3u, 0x40F4B7FBu, 0x40F4F2C8u, 0x40F52D4Au, 0x40F56782u, \
  0x40F5A171u, 0x40F5DB18u, 0x40F61477u, 0x40F64D8Fu, 0x40F68661u, 0x40F6BEEDu, \
  0x40F6F735u, 0x40F72F38u, 0x40F766F8u, 0x40F79E74u, 0x40F7D5AEu, 0x40F80CA6u, \
  0x40F8435Eu, 0x40F879D4u, 0x40F8B00Bu, 0x40F8E602u, 0x40F91BBBu, 0x40F95135u, \
  0x40F98672u, 0x40F9BB71u, 0x40F9F034u, 0x40FA24BBu, 0x40FA5907u, 0x40FA8D17u, \
  0x40FAC0EDu, 0x40FAF489u, 0x40FB27ECu, 0x40FB5B15u, 0x40FB8E07u, 0x40FBC0C0u, \
  0x40FBF342u, 0x40FC258Cu, 0x40FC57A0u, 0x40FC897Eu, 0x40FCBB27u, 0x40FCEC9Au, \
  0x40FD1DD9u, 0x40FD4EE3u, 0x40FD7FB9u, 0x40FDB05Cu, 0x40FDE0CCu, 0x40FE1109u, \
  0x40FE4114u, 0x40FE70EDu, 0x40FEA095u, 0x40FED00Cu, 0x40FEFF52u, 0x40FF2E68u, \
  0x40FF5D4Eu, 0x40FF8C05u, 0x40FFBA8Du

constexpr uint32_t kP8ThresholdBits[255] = {LS_I8A_P8_THRESHOLD_BITS};
// x's ceiling: fl32(log2(255)); p8(kP8Top) = 255 (the tile's maximum key), ex2(kP8Top) < 255.5.
constexpr float kP8Top = 0x1.ffa37cp+2f;
// p8 of a NaN x (x is never NaN for finite inputs): the byte the device's ex2 path gives.
constexpr int kP8NaN = 255;

// Contract v4 (docs/int8-attention.md §4.4): P's argument of a (row, tile) whose largest
// score sT (log2 units) has |sT| < kScoreFmaLimit is the one-FFMA form fmaf(fl32(a sk),
// float(d), fl32(kP8Top - sT)): there it lies within 2^-24 (8 + 4 |sT|) + 2^-21 < 9.8e-4 of
// kP8Top at the tile's maximum, inside (theta_255, log2(255.5)), so the maximum's p8 is 255
// and a GPU's fast byte (ex2 < 255.5) is right. Larger |sT| (never in a model's attention:
// 4096 log2 units is a softmax ratio of 2^4096) take v3's fmaf(a, fl32(u - mu_T), kP8Top),
// exactly kP8Top at the maximum.
constexpr float kScoreFmaLimit = 4096.0f;
LQ_HD bool score_fma_form(float sT) { return sT < kScoreFmaLimit && sT > -kScoreFmaLimit; }

// Host: p8(x) by binary search over the thresholds (as floats; ordered).
inline int p8_table(float x) {
  if (!(x == x)) return kP8NaN;
  int lo = 0, hi = 255;  // count of thresholds <= x lies in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;  // is theta_mid <= x ?  (theta_1 .. theta_255 at index 0 .. 254)
    const uint32_t b = kP8ThresholdBits[mid - 1];
    float t;
    __builtin_memcpy(&t, &b, 4);
    if (t <= x) lo = mid; else hi = mid - 1;
  }
  return lo;
}

}  // namespace ls::i8a
