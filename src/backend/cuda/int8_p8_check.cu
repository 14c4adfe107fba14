// The once-per-device check of attention int8's fast p8 path (int8_p8_check.cuh): a kernel
// compares, for EVERY fp32 pattern the kernels can meet, the fast byte (low byte of
// fl32(ex2.approx.ftz(x) + 2^23)) with the table's p8 (a binary search of the thresholds),
// and counts the patterns where they differ; it also checks the table path (the fast byte
// corrected against the thresholds) against the same binary search. The patterns: x in
// [+0, kP8Top + 2^-9] (bits [0, bits(kCheckTop)]), x in [-inf, -0] (bits [0x80000000,
// 0xFF800000]) and every NaN (bits 0x7F800001.. 0x7FFFFFFF and 0xFF800001.. 0xFFFFFFFF):
// 3,246,383,550 patterns. x > kP8Top + 9.8e-4 never occurs (§4.4; v3's form fmaf(a_i, w,
// kP8Top) with a_i > 0, w <= 0 is <= kP8Top). Zero mismatches: the kernels use the fast path
// on this device (bit-identical to the CPU's table); else the table path.
#include "backend/cuda/int8_p8_check.cuh"

#include <cuda_runtime.h>

#include <bit>
#include <cstring>
#include <map>
#include <mutex>

namespace ls::cuda {
namespace {

// The largest x the kernels form is kP8Top + 9.8e-4 (contract v4's one-FFMA form, §4.4), so
// the scan goes 2^-9 past kP8Top. (Until session 20 it stopped at the bits 0x40FFA37C =
// 7.98871, short of even kP8Top = 0x40FFD1BE: x in (7.98871, 7.99631], where p8 steps from 254
// to 255, went unscanned.)
constexpr float kCheckTop = i8a::kP8Top + 0x1p-9f;
constexpr uint32_t kTopBits = std::bit_cast<uint32_t>(kCheckTop);
constexpr uint64_t kSegA = uint64_t{kTopBits} + 1;         // [0, kCheckTop]
constexpr uint64_t kSegB = 0xFF800000ull - 0x80000000ull + 1;  // [-0, -inf]
constexpr uint64_t kSegN = 0x7FFFFFull;                    // NaN mantissas 1 .. 2^23 - 1, each sign
constexpr uint64_t kPatterns = kSegA + kSegB + 2 * kSegN;

__device__ __forceinline__ uint32_t pattern(uint64_t i) {
  if (i < kSegA) return static_cast<uint32_t>(i);
  i -= kSegA;
  if (i < kSegB) return 0x80000000u + static_cast<uint32_t>(i);
  i -= kSegB;
  if (i < kSegN) return 0x7F800001u + static_cast<uint32_t>(i);
  return 0xFF800001u + static_cast<uint32_t>(i - kSegN);
}

// The counters, in static device memory (the backend allocates nothing here): [0] the fast
// path's mismatches, [1] the table path's (the correction from the fast byte, and from the
// fast byte moved 3 steps down and up, against the binary search: the correction must be
// exact from any guess; on the H200 the fast byte is never off, so the moved guesses are
// what exercises it).
__device__ unsigned long long g_p8_mismatches[2];

// Grid-stride, consecutive patterns on consecutive lanes (so the table's constant loads of a
// warp mostly hit one address: a broadcast). One atomic per warp and counter.
__global__ void p8_scan_kernel() {
  uint32_t bad = 0, bad_table = 0;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < kPatterns; i += stride) {
    const float x = __uint_as_float(pattern(i));
    const uint32_t want = p8dev::table_search_p8(x), fast = p8dev::fast_word(x) & 0xFFu;
    bad += fast != want;
    bad_table += p8dev::table_p8(x) != want;
    bad_table += p8dev::table_p8_from(x, fast >= 3 ? fast - 3 : 0) != want;
    bad_table += p8dev::table_p8_from(x, fast <= 252 ? fast + 3 : 255) != want;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    bad += __shfl_xor_sync(0xffffffffu, bad, o);
    bad_table += __shfl_xor_sync(0xffffffffu, bad_table, o);
  }
  if ((threadIdx.x & 31u) == 0 && bad != 0) atomicAdd(&g_p8_mismatches[0], static_cast<unsigned long long>(bad));
  if ((threadIdx.x & 31u) == 0 && bad_table != 0)
    atomicAdd(&g_p8_mismatches[1], static_cast<unsigned long long>(bad_table));
}

Int8P8Check run_check(int device) {
  Int8P8Check r;
  int prev = -1;
  if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
  cudaStream_t s = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  const auto fail = [&](cudaError_t e) {
    if (r.error.empty()) r.error = std::string("attention int8 p8 check: ") + cudaGetErrorString(e);
  };
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreate(&e0);
  if (e == cudaSuccess) e = cudaEventCreate(&e1);
  const unsigned long long zero[2] = {0, 0};
  if (e == cudaSuccess) e = cudaMemcpyToSymbolAsync(g_p8_mismatches, zero, sizeof(zero), 0, cudaMemcpyHostToDevice, s);
  if (e == cudaSuccess) {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    cudaEventRecord(e0, s);
    p8_scan_kernel<<<static_cast<unsigned>(sms > 0 ? 8 * sms : 1024), 256, 0, s>>>();
    e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaEventRecord(e1, s);
  }
  unsigned long long bad[2] = {0, 0};
  if (e == cudaSuccess) e = cudaMemcpyFromSymbolAsync(bad, g_p8_mismatches, sizeof(bad), 0, cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e == cudaSuccess) {
    cudaEventElapsedTime(&r.ms, e0, e1);
    r.mismatches = bad[0];
    r.table_mismatches = bad[1];
    r.patterns = kPatterns;
    r.ex2 = bad[0] == 0;
  } else {
    fail(e);
  }
  if (s != nullptr) cudaStreamSynchronize(s), cudaStreamDestroy(s);
  if (e0 != nullptr) cudaEventDestroy(e0);
  if (e1 != nullptr) cudaEventDestroy(e1);
  if (prev >= 0) cudaSetDevice(prev);
  return r;
}

}  // namespace

const Int8P8Check& int8_p8_check(int device) {
  static std::mutex mu;
  static std::map<int, Int8P8Check> done;  // node-based: references stay valid
  std::lock_guard<std::mutex> lock(mu);
  auto it = done.find(device);
  if (it == done.end()) it = done.emplace(device, run_check(device)).first;
  return it->second;
}

}  // namespace ls::cuda
