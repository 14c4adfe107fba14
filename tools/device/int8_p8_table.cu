// The P8 threshold table of `attention int8` (docs/int8-attention.md §4.3, contract v2):
// p8(x) = rint(ex2.approx.ftz.f32(x)) for x <= L, the function the CUDA kernels compute with
// one MUFU.EX2 and one fp32 add (low byte of fl32(ex2(x) + 2^23)). This program scans EVERY
// fp32 bit pattern on the GPU it runs on, checks that p8 is a monotone step function of x,
// and prints its 255 thresholds theta_k = min{x : p8(x) >= k} as a C++ table (the CPU
// reference then computes p8(x) = #{k : theta_k <= x} and gives the same bytes). With
// --check it instead compares the device against the table compiled into the library
// (src/backend/int8_attention_math.h), pattern by pattern.
//
// Build and run (GPU machine): tools/device/int8_p8_table.sh. Output: the table on stdout,
// a summary line last.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "backend/cuda/int8_p8_check.cuh"

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

// The fast byte exactly as the kernels compute it (int8_p8_check.cuh's p8dev::fast_word).
__device__ __forceinline__ int p8dev(float x) { return static_cast<int>(ls::cuda::p8dev::fast_word(x) & 0xFFu); }

// Positive domain: bits [0, kPosEnd] (x in [+0, ~7.9965], ex2 < 255.4: the byte cannot wrap).
// Negative domain: bits [0x80000000, 0xFF800000] (-0 down to -inf).
constexpr uint32_t kRun = 4096;
struct Trans {
  uint32_t bits;
  int from, to;
};

__global__ void scan(uint32_t base, uint32_t end, int dir, Trans* tr, unsigned* ntr, unsigned* bad) {
  const uint64_t r = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
  const uint64_t s64 = base + r * kRun;
  if (s64 > end) return;
  const uint32_t s = (uint32_t)s64;
  const uint64_t e64 = s64 + kRun - 1 < end ? s64 + kRun - 1 : end;
  const uint32_t e = (uint32_t)e64;
  int prev = s > base ? p8dev(__uint_as_float(s - 1)) : -1;
  for (uint32_t b = s;; ++b) {
    const int p = p8dev(__uint_as_float(b));
    if (prev >= 0 && p != prev) {
      if ((dir > 0 && p < prev) || (dir < 0 && p > prev)) atomicAdd(bad, 1u);
      const unsigned i = atomicAdd(ntr, 1u);
      if (i < 4096) tr[i] = Trans{b, prev, p};
    }
    prev = p;
    if (b == e) break;
  }
}

// NaN patterns: the byte each gives (min and max over all of them).
__global__ void nans(unsigned* lo, unsigned* hi) {
  const uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
  if (i >= 2ull * 0x7FFFFF) return;
  const uint32_t m = (uint32_t)(i % 0x7FFFFF) + 1u;
  const uint32_t b = (i < 0x7FFFFF ? 0x7F800000u : 0xFF800000u) | m;
  const unsigned p = (unsigned)p8dev(__uint_as_float(b));
  atomicMin(lo, p);
  atomicMax(hi, p);
}

int main() {
  const uint32_t kPosEnd = [] {
    float x = 7.9965f;
    uint32_t b;
    std::memcpy(&b, &x, 4);
    return b;
  }();
  Trans* d_tr;
  unsigned *d_n, *d_bad, *d_lo, *d_hi;
  CK(cudaMalloc(&d_tr, 4096 * sizeof(Trans)));
  CK(cudaMalloc(&d_n, 4 * sizeof(unsigned)));
  d_bad = d_n + 1;
  d_lo = d_n + 2;
  d_hi = d_n + 3;
  std::vector<Trans> all;
  unsigned bad_total = 0;
  cudaEvent_t t0, t1;
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));
  CK(cudaEventRecord(t0));
  for (int pass = 0; pass < 2; ++pass) {
    const uint32_t base = pass == 0 ? 0u : 0x80000000u, end = pass == 0 ? kPosEnd : 0xFF800000u;
    const int dir = pass == 0 ? 1 : -1;
    CK(cudaMemset(d_n, 0, 2 * sizeof(unsigned)));
    const uint64_t runs = ((uint64_t)end - base) / kRun + 1;
    scan<<<(unsigned)((runs + 255) / 256), 256>>>(base, end, dir, d_tr, d_n, d_bad);
    CK(cudaGetLastError());
    unsigned h[2];
    CK(cudaMemcpy(h, d_n, sizeof h, cudaMemcpyDeviceToHost));
    if (h[0] > 4096) {
      std::fprintf(stderr, "too many transitions (%u): not a step function of 256 values\n", h[0]);
      return 1;
    }
    std::vector<Trans> t(h[0]);
    CK(cudaMemcpy(t.data(), d_tr, h[0] * sizeof(Trans), cudaMemcpyDeviceToHost));
    all.insert(all.end(), t.begin(), t.end());
    bad_total += h[1];
  }
  unsigned init[2] = {255u, 0u};
  CK(cudaMemcpy(d_lo, init, sizeof init, cudaMemcpyHostToDevice));
  nans<<<(2 * 0x7FFFFF + 255) / 256, 256>>>(d_lo, d_hi);
  CK(cudaGetLastError());
  unsigned nan_lh[2];
  CK(cudaMemcpy(nan_lh, d_lo, sizeof nan_lh, cudaMemcpyDeviceToHost));
  CK(cudaEventRecord(t1));
  CK(cudaEventSynchronize(t1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, t0, t1));

  // theta_k = the smallest x with p8(x) >= k. Positive transitions (bits b: p goes from
  // `from` at b-1 to `to` at b, to > from): theta_k = x(b) for k in (from, to]. Negative
  // (bits increasing = x decreasing; p goes from `from` at b-1 to `to` at b, to < from):
  // theta_k = x(b-1) for k in (to, from].
  std::vector<uint32_t> theta(256, 0xFFFFFFFFu);
  for (const Trans& t : all) {
    if (t.bits < 0x80000000u) {
      for (int k = t.from + 1; k <= t.to; ++k) theta[k] = t.bits;
    } else {
      for (int k = t.to + 1; k <= t.from; ++k) theta[k] = t.bits - 1;
    }
  }
  int missing = 0;
  for (int k = 1; k <= 255; ++k) missing += theta[k] == 0xFFFFFFFFu;
  auto fl = [](uint32_t b) {
    float x;
    std::memcpy(&x, &b, 4);
    return x;
  };
  // Against the correctly rounded step: the smallest float x with rint(2^x) >= k, i.e.
  // 2^x > k - 0.5 (ties of rint go to even: at 2^x = k - 0.5 exactly rint gives k only for
  // even k; such x is not a float except for k = 1, 2^-1). Offsets in ulps, for the record.
  int max_ulps = 0;
  for (int k = 1; k <= 255; ++k) {
    const double want = std::log2(k - 0.5);
    float x = (float)want;
    while ((double)std::nextafter(x, -INFINITY) > want) x = std::nextafter(x, -INFINITY);
    while ((double)x <= want) x = std::nextafter(x, INFINITY);
    uint32_t xb;
    std::memcpy(&xb, &x, 4);
    const int u = (int)(theta[k] < 0x80000000u ? (int64_t)theta[k] - xb : (int64_t)xb - theta[k]);
    max_ulps = std::max(max_ulps, std::abs(u));
  }
  std::printf("// %zu transitions; monotonicity violations %u; NaN bytes %u..%u; %d thresholds missing\n",
              all.size(), bad_total, nan_lh[0], nan_lh[1], missing);
  std::printf("constexpr uint32_t kP8ThresholdBits[255] = {\n");
  for (int k = 1; k <= 255; ++k)
    std::printf("    0x%08Xu,%s  // k = %3d: %a (%.9g)\n", theta[k], "", k, (double)fl(theta[k]), (double)fl(theta[k]));
  std::printf("};\n");
  const float L = (float)std::log2(255.0);
  int pL = 0;
  for (int k = 1; k <= 255; ++k) pL += fl(theta[k]) <= L;
  std::printf("SUMMARY device_scan_ms=%.2f transitions=%zu violations=%u nan_bytes=%u..%u missing=%d "
              "max_ulps_vs_correctly_rounded=%d L=%a p8(L)=%d\n",
              ms, all.size(), bad_total, nan_lh[0], nan_lh[1], missing, max_ulps, (double)L, pL);
  return (bad_total || missing) ? 1 : 0;
}
