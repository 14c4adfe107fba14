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
//   i8a::exp2e(t), exp2p255(t) the defined exp2 for t <= 0 (§4.3): coefficients E, and 255 E
//   i8a::p8(t)                clamp(rint(exp2p255(t)), 0, 255)
//   i8a::score_factor(scale, Dh)  cs = fl32(fl32(scale * log2e) * (1/Dh))
#pragma once

#include <cstdint>

#include "backend/cpu/linear_quant_math.h"

namespace ls::i8a {

constexpr float kInv127 = 0x1.020408p-7f;  // fl32(1/127)
constexpr float kTiny = 1e-30f;
constexpr float kLog2e = 0x1.715476p+0f;   // fl32(log2(e))
constexpr float kExp2Min = -125.0f;         // exp2c(t) = 0 below this

// exp2 polynomial coefficients c0..c5 (Horner from c5), as literals so device code needs
// no host object: E (exp2e) = fl32(ln2^k / k!); P255 (exp2p255) = fl32(255 * E_k) (one
// rounding of the product of 255 and the float E_k).

// The coefficients as named scalars (the Hopper kernel evaluates the same polynomial inline).
constexpr float kE0 = 0x1p+0f, kE1 = 0x1.62e430p-1f, kE2 = 0x1.ebfbe0p-3f, kE3 = 0x1.c6b08ep-5f,
                kE4 = 0x1.3b2ab6p-7f, kE5 = 0x1.5d87fep-10f;
constexpr float kP0 = 0x1.fe0000p+7f, kP1 = 0x1.61814cp+7f, kP2 = 0x1.ea0fe4p+5f, kP3 = 0x1.c4e9dep+3f,
                kP4 = 0x1.39ef8cp+1f, kP5 = 0x1.5c2a76p-2f;

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

LQ_HD int8_t quant(float x, float s) {
  const float r = lq::rint(lq::div(x, s));
  if (!(r == r)) return 0;
  return static_cast<int8_t>(r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r);
}

LQ_HD float exp2c(float t, float c0, float c1, float c2, float c3, float c4, float c5) {
  if (t < kExp2Min) return 0.0f;
  const float nf = lq::rint(t);
  const float f = lq::sub(t, nf);  // exact
  float p = c5;
  p = lq::fma(p, f, c4);
  p = lq::fma(p, f, c3);
  p = lq::fma(p, f, c2);
  p = lq::fma(p, f, c1);
  p = lq::fma(p, f, c0);
  return lq::mul(p, lq::pow2i(static_cast<int>(nf)));  // exact: the result is normal
}
// alpha = exp2e(m - m_new)
LQ_HD float exp2e(float t) { return exp2c(t, kE0, kE1, kE2, kE3, kE4, kE5); }
// 255 * 2^t (before p8's rounding)
LQ_HD float exp2p255(float t) { return exp2c(t, kP0, kP1, kP2, kP3, kP4, kP5); }

LQ_HD int p8(float t) {
  const float r = lq::rint(exp2p255(t));
  return static_cast<int>(r > 255.0f ? 255.0f : r);
}
// The row-sum term of a score (docs §4.4): pl = rint(fl32(exp2p255(t) * 2^14)), an integer in
// [0, 255 * 2^14] (the same 255 * 2^t as p8 with 14 more bits: the denominator must not be
// the sum of the coarse p8, whose rounding loses the mass of the many small p of a peaked row).
constexpr float kPlScale = 16384.0f;          // 2^14
constexpr float kPlInvScale = 0x1p-14f;       // exact
LQ_HD void p8_pl(float t, int* p8v, int* plv) {
  const float e = exp2p255(t);
  const float r = lq::rint(e);
  *p8v = static_cast<int>(r > 255.0f ? 255.0f : r);
  *plv = static_cast<int>(lq::rint(lq::mul(e, kPlScale)));
}

LQ_HD float score_factor(float scale, int Dh) {
  return lq::mul(lq::mul(scale, kLog2e), lq::div(1.0f, static_cast<float>(Dh)));  // 1/Dh exact
}

}  // namespace ls::i8a
