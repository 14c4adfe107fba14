// p8 of attention int8, contract v2 (docs/int8-attention.md §4.3; the table
// i8a::kP8ThresholdBits of backend/int8_attention_math.h), on the device: the two ways the
// CUDA kernels compute it, and the once-per-device check that picks between them.
//
//   fast  p8 = low byte of fl32(ex2.approx.ftz.f32(x) + 2^23): one MUFU.EX2 and one FADD.
//         x <= kP8Top gives ex2(x) < 255.5, so fl32(ex2 + 2^23) = 2^23 + rint(ex2) (the
//         spacing of fp32 in [2^23, 2^24) is 1, ties to even) and its bits are
//         0x4B000000 | p8: byte 0 is p8, bytes 1-2 are 0. NaN gives the canonical NaN
//         0x7FFFFFFF: byte 0 = 255 = kP8NaN. Equal to the table only where the device's ex2
//         steps exactly at the table's thresholds: int8_p8_check() scans every x to know.
//   table p8 = #{k : theta_k <= x}, the CPU's i8a::p8_table, on any device: the fast byte k
//         as a first guess, then corrected against the thresholds (theta_0 = -inf,
//         theta_256 = +inf sentinels; up while theta_{k+1} <= x, down while theta_k > x).
//         Exact from ANY guess; on a device whose ex2 is off by a few ulps near a step the
//         guess is at most one step off, so it costs two L1-cached loads and two compares
//         per score, no loop trip (global memory: a warp's 32 different thresholds are a few
//         cache lines, where __constant__ memory would serialise them). The binary search
//         (table_search_p8, 8 compares in __constant__ memory) is the check's reference.
//
// The kernels take the path as a template parameter (kTable); both return a word whose
// byte 0 is p8 and whose bytes 1-3 the packing ignores (the table path returns p8 alone).
#pragma once

#include <cstdint>
#include <string>

#include "backend/int8_attention_math.h"
#ifdef __CUDACC__
#include "backend/cuda/cuda_common.cuh"  // prmt
#endif

namespace ls::cuda {

// The result of scanning one device (host).
struct Int8P8Check {
  bool ex2 = false;          // every pattern x <= kP8Top and every NaN: fast byte == table p8
  uint64_t mismatches = 0;   // patterns where they differ (0 when ex2)
  uint64_t table_mismatches = 0;  // the table path's correction against the binary search, from
                                  // three guesses per pattern (0: the table path is exact)
  uint64_t patterns = 0;     // patterns compared
  float ms = 0.0f;           // the scan's GPU time
  std::string error;         // a CUDA error that stopped the scan ("" when it ran; then ex2 false)
};

// Runs the scan on `device` the first time it is asked for that device (thread-safe: a mutex
// around a per-device cache), on a private stream, synchronously (a few milliseconds on an
// H200); later calls return the cached result. Restores the caller's current device.
const Int8P8Check& int8_p8_check(int device);

#ifdef __CUDACC__
namespace p8dev {

// One copy per translation unit (static), from the one macro the host table also uses.
static __constant__ uint32_t kTheta[255] = {LS_I8A_P8_THRESHOLD_BITS};
// The same thresholds with sentinels for the table path's correction: [0] = -inf,
// [1..255] = theta_1..theta_255, [256] = +inf (global memory, read through L1).
static __device__ const uint32_t kThetaS[257] = {0xFF800000u, LS_I8A_P8_THRESHOLD_BITS, 0x7F800000u};

__device__ __forceinline__ float ex2_approx_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// The fast path's word: 0x4B000000 | p8 (x <= kP8Top), 0x7FFFFFFF for NaN.
__device__ __forceinline__ uint32_t fast_word(float x) {
  return __float_as_uint(__fadd_rn(ex2_approx_ftz(x), 8388608.0f));
}
// The count of thresholds <= x by binary search (thresholds ascending), kP8NaN for NaN: the
// check's reference. Steps 128, 64, .., 1 (sum 255): lo + step - 1 <= 254, no bound test.
__device__ __forceinline__ uint32_t table_search_p8(float x) {
  uint32_t lo = 0;
#pragma unroll
  for (uint32_t step = 128; step != 0; step >>= 1)
    if (__uint_as_float(kTheta[lo + step - 1]) <= x) lo += step;
  return x == x ? lo : static_cast<uint32_t>(i8a::kP8NaN);
}
// The table path: the largest k with kThetaS[k] <= x, corrected from `guess` (any 0..255):
// the loops end at the sentinels (-inf <= x for every non-NaN x, +inf > x).
__device__ __forceinline__ uint32_t table_p8_from(float x, uint32_t guess) {
  if (!(x == x)) return static_cast<uint32_t>(i8a::kP8NaN);
  uint32_t k = guess;
  while (__uint_as_float(__ldg(&kThetaS[k + 1])) <= x) ++k;
  while (__uint_as_float(__ldg(&kThetaS[k])) > x) --k;
  return k;
}
__device__ __forceinline__ uint32_t table_p8(float x) { return table_p8_from(x, fast_word(x) & 0xFFu); }
// Byte 0 (the p8) of four words, in order, as one word: 4 keys' bytes of P's A fragment
// register (3 PRMT; both kernels).
__device__ __forceinline__ uint32_t pack_p8(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
  return prmt(prmt(w0, w1, 0x0040u), prmt(w2, w3, 0x0040u), 0x5410u);
}
template <bool kTable>
__device__ __forceinline__ uint32_t p8_word(float x) {
  if constexpr (kTable) return table_p8(x);
  else return fast_word(x);
}

}  // namespace p8dev
#endif

}  // namespace ls::cuda
