// The element arithmetic of the quantised linears (Backend::linear, backend.h; docs/numerics.md
// "Quantised linears"), written ONCE and compiled for the host (the CPU reference,
// src/backend/cpu/linear_quant.cpp) and for the device (src/backend/cuda/linear_quant.cu).
// Every function is a fixed sequence of correctly rounded IEEE fp32 operations (add, sub,
// mul, div, fma, rint) and bit manipulation, so the host and the device produce the same
// bits: the host build has -ffp-contract=off and no -ffast-math; on the device each
// operation is spelled with its _rn intrinsic (and the CUDA build has -fmad=false), so
// nothing is contracted or approximated (no __expf, no div.approx).
//
// What is here:
//   lq_exp(x)          exp in fp32 from an explicit fma polynomial (not libm's expf, not
//                      CUDA's expf: those differ in rare last bits, and the fused swiglu
//                      input of the int8 linear must be the same on both backends).
//   lq_swiglu(g, u)    a = fl32(fl32(g / fl32(1 + lq_exp(-g))) * u), unrounded.
//   lq_int8_scale(m)   sx = max(fl32(min(m, bf16_max) * fl32(1/127)), 1e-30) from the row's absmax.
//   lq_int8_quant(v,d) q = clamp(rint(bf16(fl32(bf16(v) / d))), -128, 127), d = bf16(sx);
//                      NaN -> 0.
//   lq_int8_epilogue   y = fl32(fl32(float(acc) * sx) * sw) (+ fl32(. + bias)).
//   lq_f32_to_e4m3     e4m3fn, round to nearest even, saturating at +-448, NaN -> 0x7f: the
//                      same bits as ls::f32_to_f8e4m3 (core/dtype.h; tested over a sweep).
//   lq_e4m3_to_f32     exact decode.
#pragma once

#include <cstdint>

#include <cmath>
#include <cstring>

#if defined(__CUDACC__)
#define LQ_HD __host__ __device__ __forceinline__
#else
#define LQ_HD inline
#endif

namespace ls::lq {

// ---- one IEEE fp32 operation each ----------------------------------------------------
LQ_HD float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
LQ_HD float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
LQ_HD float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
LQ_HD float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
LQ_HD float fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
LQ_HD float rint(float a) {  // round half to even (the default rounding mode on the host)
#if defined(__CUDA_ARCH__)
  return rintf(a);
#else
  return std::nearbyint(a);
#endif
}
LQ_HD uint32_t bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
LQ_HD float from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
// |a| and max ignoring NaN (fmaxf semantics: max(NaN, b) = b), by comparison only.
LQ_HD float abs(float a) { return from_bits(bits(a) & 0x7fffffffu); }
LQ_HD float max_nan_ignoring(float m, float a) { return (a > m || m != m) ? a : m; }
LQ_HD bool is_nan(float a) { return (bits(a) & 0x7fffffffu) > 0x7f800000u; }

// bf16 round to nearest even (the recipe of core/dtype.h f32_to_bf16; quiet NaN kept).
LQ_HD uint16_t bf16_bits(float f) {
  uint32_t u = bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
LQ_HD float bf16_widen(uint16_t h) { return from_bits(static_cast<uint32_t>(h) << 16); }
LQ_HD float round_bf16(float f) { return bf16_widen(bf16_bits(f)); }

// ---- exp ---------------------------------------------------------------------------------
// exp(x) = 2^n * p(r): n = the integer nearest x * log2(e) (by adding and subtracting
// 1.5 * 2^23 after one fma), r = x - n * ln2 in two fma steps (ln2 split into a high part
// with 16 significant bits and a low part), p(r) = 1 + r + r^2 * P(r) with the degree-5
// Cephes expf coefficients (|r| <= 0.35), Horner with fma. Then 2^n is applied by
// multiplying with exact powers of two (two steps below 2^-125 so the one rounding into
// the subnormal range is the last multiply). Max error about 1 ulp (tested against
// double exp). x >= 88.7228394 gives +inf, x < -103.972084 gives +0, NaN stays NaN.
LQ_HD float pow2i(int n) { return from_bits(static_cast<uint32_t>(n + 127) << 23); }  // n in [-126, 127]
LQ_HD float lq_exp(float x) {
  if (is_nan(x)) return add(x, x);
  if (!(x < 88.7228394f)) return from_bits(0x7f800000u);
  if (x < -103.972084f) return 0.0f;
  constexpr float kShift = 12582912.0f;  // 1.5 * 2^23
  const float t = fma(x, 1.44269504088896341f, kShift);
  const float nf = sub(t, kShift);  // exact: an integer in [-150, 128]
  int n = static_cast<int>(nf);
  float r = fma(nf, -0.693145751953125f, x);   // ln2 high part (exact product with nf)
  r = fma(nf, -1.42860682030941723e-6f, r);    // ln2 low part
  float p = 1.9875691500e-4f;
  p = fma(p, r, 1.3981999507e-3f);
  p = fma(p, r, 8.3334519073e-3f);
  p = fma(p, r, 4.1665795894e-2f);
  p = fma(p, r, 1.6666665459e-1f);
  p = fma(p, r, 5.0000001201e-1f);
  p = fma(p, mul(r, r), r);
  p = add(p, 1.0f);
  if (n > 127) {  // n = 128: p < 1 there, so 2 * 2^127 * p is the finite result or inf
    p = mul(p, 2.0f);
    n -= 1;
  }
  if (n < -125) {
    p = mul(p, pow2i(-64));  // exact (p ~ 1, the product stays normal)
    n += 64;
  }
  return mul(p, pow2i(n));
}

// The fused swiglu input of the int8 linear: gate g, up u (bf16 values widened), unrounded.
LQ_HD float lq_swiglu(float g, float u) {
  const float e = lq_exp(sub(0.0f, g));  // -g exactly (0 - g: -0 for g = +0, as exp only sees |0|)
  const float s = div(g, add(1.0f, e));
  return mul(s, u);
}

// ---- LS-int8 ---------------------------------------------------------------------------
constexpr float kBf16Max = 3.38953139e38f;  // the largest finite bf16 (0x7f7f)
LQ_HD float lq_int8_scale(float absmax) {
  const float m = absmax < kBf16Max ? absmax : kBf16Max;  // also clamps +inf
  const float s = mul(m, 1.0f / 127.0f);                  // fl32(1/127), folded exactly
  return s > 1e-30f ? s : 1e-30f;
}
// d = bf16(sx) (the divisor, a bf16 value in fp32). Returns the int8 value.
LQ_HD int8_t lq_int8_quant(float v, float d) {
  float q = rint(round_bf16(div(round_bf16(v), d)));
  if (is_nan(q)) return 0;
  q = q > 127.0f ? 127.0f : q;
  q = q < -128.0f ? -128.0f : q;
  return static_cast<int8_t>(static_cast<int>(q));
}
LQ_HD float lq_i32_to_f32(int32_t a) {  // round to nearest even (exact below 2^24)
#if defined(__CUDA_ARCH__)
  return __int2float_rn(a);
#else
  return static_cast<float>(a);
#endif
}
LQ_HD float lq_int8_epilogue(int32_t acc, float sx, float sw) { return mul(mul(lq_i32_to_f32(acc), sx), sw); }

// ---- fp8 e4m3fn ------------------------------------------------------------------------
// Integer-only, the algorithm of core/dtype.cpp f32_to_f8e4m3.
LQ_HD uint8_t lq_f32_to_e4m3(float f) {
  const uint32_t u = bits(f);
  const auto sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;
  if (a >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);
  if (a < 0x3c800000u) {
    if (a <= 0x3a800000u) return sign;
    const uint32_t e = a >> 23;
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 141 - e;
    uint32_t q = mant >> shift;
    const uint32_t rest = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (q & 1u))) ++q;
    return static_cast<uint8_t>(sign | q);
  }
  uint32_t code = (a >> 20) - (120u << 3);
  const uint32_t rest = a & 0xfffffu;
  if (rest > 0x80000u || (rest == 0x80000u && (code & 1u))) ++code;
  return static_cast<uint8_t>(sign | code);
}
// Exact: subnormal man * 2^-9, normal (8 + man) * 2^(exp - 10); 0x7f / 0xff NaN.
LQ_HD float lq_e4m3_to_f32(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t e = (v >> 3) & 0xfu, man = v & 0x7u;
  if (e == 15 && man == 7) return from_bits(sign | 0x7fc00000u);
  if (e == 0) return from_bits(sign | bits(mul(static_cast<float>(man), 1.0f / 512.0f)));
  // (8 + man) * 2^(e - 10) = (1 + man/8) * 2^(e - 7): biased fp32 exponent e - 7 + 127.
  return from_bits(sign | ((e + 120u) << 23) | (man << 20));
}
// The fp8 activation quantiser: q = e4m3_rn_sat(s_a == 1 ? x : fl32(x / s_a)).
LQ_HD uint8_t lq_fp8_quant(float x, float sa) { return lq_f32_to_e4m3(sa == 1.0f ? x : div(x, sa)); }
// The dynamic per-row activation scale (LinearWeight::dynamic_act): fl32(amax / 448), or 1
// for an all-zero row (so nothing divides by 0; every q is 0 then).
LQ_HD float lq_fp8_dynamic_scale(float absmax) {
  const float s = div(absmax, 448.0f);
  return s > 0.0f ? s : 1.0f;
}

}  // namespace ls::lq
