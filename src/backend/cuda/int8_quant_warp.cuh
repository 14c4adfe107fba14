// The INT8 attention quantiser of one 128-channel row held by a warp (docs/int8-attention.md
// §3-4.1), shared by the portable kernel (attention_int8.cu: Q rows and the prepare's K rows)
// and the Hopper kernel (attention_hopper_int8.cu: Q rows). Lane l holds channels 4l..4l+3.
// The adds are i8a::rotate's, in its stage order (strides 1, 2 in registers, 4..64 across
// lanes by shuffles), so the bytes are the CPU reference's (tests/cuda/test_attention_int8_cuda).
#pragma once

#include <cstdint>

#include "backend/int8_attention_math.h"

namespace ls::cuda::i8w {

// x[e] is channel 4 * lane + e of a 128-vector held by the warp: x <- R x (docs §3).
__device__ __forceinline__ void rotate_warp(float x[4], int lane) {
#pragma unroll
  for (int e = 0; e < 4; ++e)
    if (i8a::negative_sign(4 * lane + e)) x[e] = -x[e];
  {  // stride 1: (0, 1), (2, 3)
    const float a0 = x[0], b0 = x[1], a1 = x[2], b1 = x[3];
    x[0] = lq::add(a0, b0), x[1] = lq::sub(a0, b0), x[2] = lq::add(a1, b1), x[3] = lq::sub(a1, b1);
  }
  {  // stride 2: (0, 2), (1, 3)
    const float a0 = x[0], b0 = x[2], a1 = x[1], b1 = x[3];
    x[0] = lq::add(a0, b0), x[2] = lq::sub(a0, b0), x[1] = lq::add(a1, b1), x[3] = lq::sub(a1, b1);
  }
#pragma unroll
  for (int m = 1; m < 32; m <<= 1) {  // strides 4, 8, ..., 64: lane bit m
    const bool upper = (lane & m) != 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float p = __shfl_xor_sync(0xffffffffu, x[e], m);
      x[e] = upper ? lq::sub(p, x[e]) : lq::add(x[e], p);
    }
  }
}

// The largest |y| of the warp's rotated row, every lane holding it (fmaxf is
// lq::max_nan_ignoring on these operands: non-negative or NaN, a NaN is skipped, two NaN give a
// NaN, which row_scale maps to kTiny whatever its payload): one FMNMX per value and step.
__device__ __forceinline__ float row_amax_warp(const float y[4]) {
  float amax = 0.0f;
#pragma unroll
  for (int e = 0; e < 4; ++e) amax = fmaxf(amax, lq::abs(y[e]));
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
  return amax;
}

// This lane's 4 values quantised with the scale s (channel 4 lane + e in byte e): i8a::quant's
// bits without a division instruction (i8a::quant_rd: one fp64 reciprocal of s, then a
// multiply per value).
__device__ __forceinline__ uint32_t quant_lane(const float y[4], float s) {
  const double r = i8a::recip_d(s);
  uint32_t w = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) w |= static_cast<uint32_t>(static_cast<uint8_t>(i8a::quant_rd(y[e], r))) << (8 * e);
  return w;
}

// Quantise the warp's rotated row with its own row scale: returns the scale, writes this
// lane's 4 int8 packed (channel 4 lane + e in byte e). Straight-line code, so a warp's 16 rows
// are code the scheduler can interleave. (Q rows; K's rows take their group's scale, contract
// v4, attention_int8.cu's prepare.)
__device__ __forceinline__ float quant_row_warp(const float y[4], uint32_t* packed) {
  const float s = i8a::row_scale(row_amax_warp(y));
  *packed = quant_lane(y, s);
  return s;
}

// The output division fl32(y / l) (docs §4.4) of a thread's 64 values, value i in row
// (i / 2) % 2 (the accumulator layout of both kernels: F[64] / acc[16][4]), l[row] the row
// sums. By i8a::div_rd (one fp64 reciprocal per row), exact for every y except a nonzero
// |y| < 2^-87 (a quotient that may be subnormal, l < 2^38): the whole warp takes the IEEE
// division when any lane has one (never in practice).
__device__ __forceinline__ bool out_needs_ieee(float y) { return y != 0.0f && lq::abs(y) < 0x1p-87f; }
__device__ __forceinline__ void divide_by_row_sums(float* y, const float (&l)[2], bool ieee) {
  if (__any_sync(0xffffffffu, ieee)) {
#pragma unroll
    for (int i = 0; i < 64; ++i) y[i] = lq::div(y[i], l[(i / 2) % 2]);
  } else {
    const double rl[2] = {i8a::recip_d(l[0]), i8a::recip_d(l[1])};
#pragma unroll
    for (int i = 0; i < 64; ++i) y[i] = i8a::div_rd(y[i], rl[(i / 2) % 2]);
  }
}

}  // namespace ls::cuda::i8w
