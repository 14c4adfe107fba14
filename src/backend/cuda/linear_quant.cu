// Backend::linear on CUDA (backend.h; docs/numerics.md "Quantised linears"). Plain weights go
// to the bf16 GEMM (gemm.cu). The quantised formats, per chunk of rows:
//
//   int8_convrot (LS-int8), the CPU reference's bits (src/backend/cpu/linear_quant.cpp):
//     1. quant_int8_rows: one CTA per row. The row (or with swiglu_input lq_swiglu(g, u), the
//        shared fma-polynomial exp) goes to shared memory as fp32; the FHT runs in place, one
//        radix-4 quartet per thread per stage, strides 1, 4, 16 (, 64) ascending, with the
//        left-to-right sign sums of core/hadamard.h (every add/mul an _rn intrinsic); absmax
//        (max is exact in any order), sx = lq_int8_scale, q = lq_int8_quant (linear_quant_math.h,
//        the same code the CPU runs). Writes q int8 [rows, K] and sx f32 [rows].
//     2. the int32 GEMM acc = q * w^T on the int8 tensor cores: cuBLASLt IMMA
//        (CUBLAS_COMPUTE_32I, int8 A/B, int32 C/D, TN), one algorithm pinned per (K, alignment)
//        from the heuristic at a fixed 8192 x 8192 reference shape, split-K 1. Integer sums
//        are exact, so any algorithm gives the same acc; pinning keeps the speed predictable.
//        Where cuBLASLt has no algorithm for a shape or alignment, a dp4a SIMT kernel
//        computes the same int32 sums (slower; logged with Diagnostics::gemm_verbose).
//     3. epilogue_int8: y = bf16(lq_int8_epilogue(acc, sx[r], sw[n]) (+ bias)).
//   fp8_e4m3 on SM >= 8.9 (tensor cores):
//     1. quant_fp8_rows: s_a (static, or per row lq_fp8_dynamic_scale(max |x|)), q = lq_fp8_quant.
//     2. cuBLASLt FP8 GEMM (E4M3 A/B, fp32 C/D, CUBLAS_COMPUTE_32F, fast accumulation off,
//        alpha 1) with a pinned algorithm, split-K 1 and no reduction scheme: every output is
//        one CTA's fixed walk over K, so a row's sum does not depend on M or on which rows
//        are computed with it (tested: tests/cuda/test_linear_quant_cuda.cpp). The tensor
//        cores' internal order is not the CPU's dot16, so the bits differ from the CPU's
//        (the distance is measured in the same test).
//     3. epilogue_fp8: y = bf16(fl32(acc * fl32(s_a * s_w)) (+ bias)).
//   fp8_e4m3 below SM 8.9: the weight is dequantised column chunk by column chunk into the
//     workspace, w_bf16 = bf16(fl32(e4m3(w)) * s_w), and the pinned bf16 GEMM runs on x (other
//     bits: cuda_linear_fp8_path says which path runs).
//
// Scratch: the linear region of the backend workspace (after the GEMM's), a constant
// (linear_quant_workspace_bytes): a small cuBLASLt workspace, then per chunk of Mc rows the
// quantised rows (Mc * K bytes), their scales (Mc floats) and the 32-bit accumulators
// (Mc * ldc * 4 bytes, ldc = N rounded up to 4). Mc = the region over (K + 16 + 4 ldc), at most 32768, rounded down to a
// multiple of 128:
// a function of (K, N) only; rows are independent, so the chunking changes no bit.
// No op synchronises the device; every CUDA call is checked.
#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "backend/cpu/linear_quant.h"
#include "backend/cpu/linear_quant_math.h"
#include "backend/cuda/cuda_ext.h"
#include "backend/cuda/linear_quant_bench.cuh"
#include "backend/cuda/ops.cuh"

namespace ls::cuda {

namespace {

constexpr size_t kLtBytes = 4ull << 20;       // cuBLASLt workspace of the quantised GEMMs
// 4 + 160 MiB after the GEMM's 64: inside the cuDNN attention scratch (290 MiB at H3 width,
// q chunk 2048) that a build with cuDNN reserves anyway, so that workspace does not grow.
constexpr size_t kChunkBytes = 160ull << 20;  // quantised rows, scales, accumulators / dequantised weight
constexpr int64_t kRefDim = 8192;             // the heuristic's fixed reference shape
constexpr int kThreads = 256;

size_t align_up(size_t v) { return (v + 255) & ~size_t{255}; }
// The accumulators' row stride: N rounded up to 4 elements (16-byte rows, as cuBLASLt's
// fp8 and int8 kernels want for C/D).
int64_t ld_acc(int64_t N) { return (N + 3) / 4 * 4; }

// ---- kernels ------------------------------------------------------------------------------
// Bytes each stage moves at S = 111,274 rows (the H3 shapes; M·K = activations in, M·N out):
//                      x in (bf16)   q out   | GEMM: acc out   | epilogue: acc in + y out
//   qkv   K 5376  N 21504  1.20 GB  0.60 GB  |  9.57 GB (i32)  |  9.57 + 4.79 GB
//   out   K 7168  N  5376  1.60 GB  0.80 GB  |  2.39 GB        |  2.39 + 1.20 GB
//   fc1   K 5376  N 28672  1.20 GB  0.60 GB  | 12.76 GB        | 12.76 + 6.38 GB
//   fc2   K 14336 N  5376  6.38 GB  1.60 GB  |  2.39 GB        |  2.39 + 1.20 GB   (x = swiglu's u [M, 2F])
// At ~4 TB/s the activation stage is 0.4-2 ms per linear and the epilogue 1-5 ms, against
// 6-25 ms of int8 GEMM: memory traffic alone would cost the whole int8 linear about 25 %
// over its GEMM. The session-5 kernels cost 60-170 % (bench_linear_quant, H200): the
// quantiser was bound by its instruction stream (64-bit index divisions in every FHT
// butterfly, one bf16 per load, 256 threads for K / 4 quartets), not by its bytes. So:
//   - the quantiser reads each row once with 16-byte loads, does the FHT's first two
//     radix-4 stages (strides 1 and 4) in registers on 16 contiguous values per thread,
//     the remaining stages (16, 64, ...) in shared memory with 32-bit shift/mask indices,
//     takes the row's absmax in the last stage's pass, and writes 16 int8 per store;
//   - the fp8 quantiser does 8 values per thread with 16-byte loads;
//   - the epilogue does 4 outputs per thread (16-byte accumulator loads, 8-byte stores).
// The arithmetic of every element is unchanged (the same lq:: operations in the same order
// on the same values: which thread does a butterfly cannot change its result), so the
// bytes are the session-5 kernels' and the CPU reference's.
// What remains beyond the GEMM is the int32 accumulator round trip (GEMM out, epilogue in):
// removing it needs the epilogue in the GEMM's registers (a custom IMMA / wgmma kernel;
// cuBLASLt's int8 epilogues round acc to fp32 with one alpha, not this epilogue).
__device__ __forceinline__ float block_max(float m, float* red) {
  for (int o = 16; o > 0; o /= 2) m = lq::max_nan_ignoring(m, __shfl_xor_sync(0xffffffffu, m, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) red[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < static_cast<int>(blockDim.x / 32) ? red[lane] : 0.0f;
    for (int o = 16; o > 0; o /= 2) m = lq::max_nan_ignoring(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) red[0] = m;
  }
  __syncthreads();
  return red[0];
}

// One radix-4 butterfly of the fp32 FHT (core/hadamard.h: output digit d uses h4 row d,
// left-to-right sign sums, then * 0.5), in place.
__device__ __forceinline__ void fht_quartet(float& x0, float& x1, float& x2, float& x3) {
  const float t0 = lq::sub(lq::add(lq::add(x0, x1), x2), x3);
  const float t1 = lq::add(lq::sub(lq::add(x0, x1), x2), x3);
  const float t2 = lq::add(lq::add(lq::sub(x0, x1), x2), x3);
  const float t3 = lq::add(lq::add(lq::add(-x0, x1), x2), x3);
  x0 = lq::mul(0.5f, t0);
  x1 = lq::mul(0.5f, t1);
  x2 = lq::mul(0.5f, t2);
  x3 = lq::mul(0.5f, t3);
}

// n bf16 values (n = 4, 8 or 16) at p widened to fp32; VEC: p is aligned to 8 (n = 4) or
// 16 bytes and read with vector loads.
template <int N, bool VEC>
__device__ __forceinline__ void load_bf16(const uint16_t* __restrict__ p, float* a) {
  if constexpr (VEC && N == 4) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const uint32_t w[2] = {u.x, u.y};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      a[2 * i] = lq::bf16_widen(static_cast<uint16_t>(w[i] & 0xffffu));
      a[2 * i + 1] = lq::bf16_widen(static_cast<uint16_t>(w[i] >> 16));
    }
  } else if constexpr (VEC) {
#pragma unroll
    for (int h = 0; h < N / 8; ++h) {
      const uint4 u = reinterpret_cast<const uint4*>(p)[h];
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        a[8 * h + 2 * i] = lq::bf16_widen(static_cast<uint16_t>(w[i] & 0xffffu));
        a[8 * h + 2 * i + 1] = lq::bf16_widen(static_cast<uint16_t>(w[i] >> 16));
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) a[i] = lq::bf16_widen(p[i]);
  }
}

// Threads for a row kernel with `items` work items per row: at most kThreads, the fewest
// rounds, whole warps (block_max shuffles full warps).
int row_threads(int64_t items) {
  const int64_t rounds = std::max<int64_t>(1, div_up(items, kThreads));
  return static_cast<int>(std::max<int64_t>(32, div_up(div_up(items, rounds), 32) * 32));
}

// x: bf16 rows (ldx elements apart; [K] or, with SWIGLU, gate [K] then up [K]); q: int8
// [rows, K]; sx: f32 [rows]. One CTA per row, dynamic shared memory K floats. C = the
// values per thread chunk: 16 when G >= 16 (FHT strides 1 and 4 in registers), else 4
// (G = 4: stride 1 only). log_g = log2 G. VEC: 16-byte (C = 16) / 8-byte (C = 4) loads.
template <bool SWIGLU, int C, bool VEC>
__global__ void __launch_bounds__(kThreads) quant_int8_rows(const uint16_t* __restrict__ x, int64_t ldx, int K,
                                                            int log_g, int8_t* __restrict__ q, float* __restrict__ sx) {
  extern __shared__ float v[];
  __shared__ float red[kThreads / 32];
  const int64_t r = blockIdx.x;
  const uint16_t* xr = x + r * ldx;
  const int chunks = K / C;
  const bool smem_stages = (1 << log_g) > C;
  float m = 0.0f;
  for (int j = threadIdx.x; j < chunks; j += blockDim.x) {
    float a[C];
    load_bf16<C, VEC>(xr + j * C, a);
    if constexpr (SWIGLU) {
      float u[C];
      load_bf16<C, VEC>(xr + K + j * C, u);
#pragma unroll
      for (int i = 0; i < C; ++i) a[i] = lq::lq_swiglu(a[i], u[i]);
    }
#pragma unroll
    for (int i = 0; i < C; i += 4) fht_quartet(a[i], a[i + 1], a[i + 2], a[i + 3]);  // stride 1
    if constexpr (C == 16) {
#pragma unroll
      for (int i = 0; i < 4; ++i) fht_quartet(a[i], a[i + 4], a[i + 8], a[i + 12]);  // stride 4
    }
    if (!smem_stages) {
#pragma unroll
      for (int i = 0; i < C; ++i) m = lq::max_nan_ignoring(m, lq::abs(a[i]));
    }
    float4* vs = reinterpret_cast<float4*>(v + j * C);
#pragma unroll
    for (int i = 0; i < C / 4; ++i) vs[i] = make_float4(a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3]);
  }
  __syncthreads();
  if (smem_stages) {
    // Strides 16, 64, ... < G: quartet j of group g = j >> (log_g - 2) starts at
    // g G + (jj >> log_s) 4s + (jj & (s - 1)), jj = j & (G/4 - 1) (the CPU's loop order).
    const int quartets = K / 4, log_pg = log_g - 2;
    for (int log_s = 4; log_s < log_g; log_s += 2) {
      const bool last = log_s + 2 == log_g;
      const int s = 1 << log_s;
      for (int j = threadIdx.x; j < quartets; j += blockDim.x) {
        const int g = j >> log_pg, jj = j & ((1 << log_pg) - 1);
        const int b = (g << log_g) + ((jj >> log_s) << (log_s + 2)) + (jj & (s - 1));
        float x0 = v[b], x1 = v[b + s], x2 = v[b + 2 * s], x3 = v[b + 3 * s];
        fht_quartet(x0, x1, x2, x3);
        v[b] = x0;
        v[b + s] = x1;
        v[b + 2 * s] = x2;
        v[b + 3 * s] = x3;
        if (last) {  // absmax over the final values (max is exact in any order)
          m = lq::max_nan_ignoring(m, lq::abs(x0));
          m = lq::max_nan_ignoring(m, lq::abs(x1));
          m = lq::max_nan_ignoring(m, lq::abs(x2));
          m = lq::max_nan_ignoring(m, lq::abs(x3));
        }
      }
      __syncthreads();
    }
  }
  m = block_max(m, red);
  const float scale = lq::lq_int8_scale(m);
  const float d = lq::round_bf16(scale);
  int8_t* qr = q + r * K;
  for (int j = threadIdx.x; j < chunks; j += blockDim.x) {
    const float4* vs = reinterpret_cast<const float4*>(v + j * C);
    uint32_t packed[C / 4];
#pragma unroll
    for (int i = 0; i < C / 4; ++i) {
      const float4 f = vs[i];
      const float e[4] = {f.x, f.y, f.z, f.w};
      uint32_t w = 0;
#pragma unroll
      for (int t = 0; t < 4; ++t)
        w |= static_cast<uint32_t>(static_cast<uint8_t>(lq::lq_int8_quant(e[t], d))) << (8 * t);
      packed[i] = w;
    }
    if constexpr (C == 16) *reinterpret_cast<uint4*>(qr + j * C) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    else *reinterpret_cast<uint32_t*>(qr + j * C) = packed[0];
  }
  if (threadIdx.x == 0) sx[r] = scale;
}

// x: bf16 rows; q: e4m3 [rows, K]; sa: f32 [rows] (the activation scale used per row).
// 8 values per thread (K a multiple of 16 on this path); VEC: 16-byte loads.
template <bool VEC>
__global__ void __launch_bounds__(kThreads) quant_fp8_rows(const uint16_t* __restrict__ x, int64_t ldx, int K,
                                                           float input_scale, bool dynamic, uint8_t* __restrict__ q,
                                                           float* __restrict__ sa) {
  __shared__ float red[kThreads / 32];
  const int64_t r = blockIdx.x;
  const uint16_t* xr = x + r * ldx;
  const int chunks = K / 8;
  float s = input_scale;
  if (dynamic) {
    float m = 0.0f;
    for (int j = threadIdx.x; j < chunks; j += blockDim.x) {
      float a[8];
      load_bf16<8, VEC>(xr + j * 8, a);
#pragma unroll
      for (int i = 0; i < 8; ++i) m = lq::max_nan_ignoring(m, lq::abs(a[i]));
    }
    s = lq::lq_fp8_dynamic_scale(block_max(m, red));
  }
  uint8_t* qr = q + r * K;
  for (int j = threadIdx.x; j < chunks; j += blockDim.x) {
    float a[8];
    load_bf16<8, VEC>(xr + j * 8, a);  // (dynamic: the second read of the row, from L1 / L2)
    uint32_t w[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i / 4] |= static_cast<uint32_t>(lq::lq_fp8_quant(a[i], s)) << (8 * (i % 4));
    *reinterpret_cast<uint2*>(qr + j * 8) = make_uint2(w[0], w[1]);
  }
  if (threadIdx.x == 0) sa[r] = s;
}

__device__ __forceinline__ float bias_at(const void* bias, bool bias_f32, int64_t n) {
  return bias_f32 ? static_cast<const float*>(bias)[n] : lq::bf16_widen(static_cast<const uint16_t*>(bias)[n]);
}

// out[r, n] = bf16(epilogue(acc[r, n]) (+ bias[n])); acc: [rows, ldc] (int32 | f32).
// FP8: s_w = sw[0], y = fl32(acc * fl32(s_a[r] * s_w)). INT8: y = fl32(fl32(acc * sx[r]) * sw[n]).
// V outputs per thread: V = 4 (N % 4 == 0, out rows 8-byte aligned: 16-byte accumulator
// loads, one 8-byte store) or 1.
template <bool FP8, int V>
__global__ void __launch_bounds__(kThreads) epilogue_rows(const void* __restrict__ acc, const float* __restrict__ rs,
                                                          const float* __restrict__ sw, bool sw_scalar,
                                                          const void* bias, bool bias_f32, uint16_t* __restrict__ out,
                                                          int64_t ldo, int64_t N, int64_t ldc) {
  const int64_t r = blockIdx.y;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * V;
  if (n0 >= N) return;
  float a[V];
  if constexpr (V == 4) {
    if constexpr (FP8) {
      const float4 t = *reinterpret_cast<const float4*>(static_cast<const float*>(acc) + r * ldc + n0);
      a[0] = t.x, a[1] = t.y, a[2] = t.z, a[3] = t.w;
    } else {
      const int4 t = *reinterpret_cast<const int4*>(static_cast<const int32_t*>(acc) + r * ldc + n0);
      const int32_t e[4] = {t.x, t.y, t.z, t.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = lq::lq_i32_to_f32(e[i]);
    }
  } else {
    a[0] = FP8 ? static_cast<const float*>(acc)[r * ldc + n0]
               : lq::lq_i32_to_f32(static_cast<const int32_t*>(acc)[r * ldc + n0]);
  }
  const float sr = rs[r];
  const float sf = FP8 ? lq::mul(sr, sw[0]) : 0.0f;
  uint16_t y16[V];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int64_t n = n0 + i;
    // lq_int8_epilogue(acc, sx, sw) = fl32(fl32(fl32(acc) * sx) * sw), spelled out on the widened acc
    float y = FP8 ? lq::mul(a[i], sf) : lq::mul(lq::mul(a[i], sr), sw_scalar ? sw[0] : sw[n]);
    if (bias) y = lq::add(y, bias_at(bias, bias_f32, n));
    y16[i] = lq::bf16_bits(y);
  }
  if constexpr (V == 4) {
    *reinterpret_cast<uint2*>(out + r * ldo + n0) =
        make_uint2(static_cast<uint32_t>(y16[0]) | (static_cast<uint32_t>(y16[1]) << 16),
                   static_cast<uint32_t>(y16[2]) | (static_cast<uint32_t>(y16[3]) << 16));
  } else {
    out[r * ldo + n0] = y16[0];
  }
}

// w_bf16[n, k] = bf16(fl32(e4m3(w[n, k])) * s_w), s_w = sw[0] (read on the device).
__global__ void dequant_fp8(const uint8_t* __restrict__ w, int64_t ldw, int64_t K, const float* __restrict__ sw,
                            uint16_t* __restrict__ out, int64_t rows) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= rows * K) return;
  const int64_t n = i / K, k = i % K;
  out[i] = lq::bf16_bits(lq::mul(lq::lq_e4m3_to_f32(w[n * ldw + k]), sw[0]));
}

// acc[m, n] = sum_k q[m, k] * w[n, k] in int32 with dp4a (K a multiple of 4, rows 4-byte
// aligned): the fallback where cuBLASLt has no IMMA algorithm for a shape or alignment.
// Integer sums are exact, so its bits are the tensor-core path's.
__global__ void gemm_i8_simt(const int8_t* __restrict__ q, int64_t K, const int8_t* __restrict__ w, int64_t ldw,
                             int32_t* __restrict__ acc, int64_t M, int64_t N, int64_t ldc) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t m = static_cast<int64_t>(blockIdx.y) * 8 + threadIdx.y;
  if (n >= N || m >= M) return;
  const int* qr = reinterpret_cast<const int*>(q + m * K);
  const int* wr = reinterpret_cast<const int*>(w + n * ldw);
  int32_t a = 0;
  for (int64_t k = 0; k < K / 4; ++k) a = __dp4a(qr[k], wr[k], a);
  acc[m * ldc + n] = a;
}

// ---- cuBLASLt: the pinned quantised GEMMs ---------------------------------------------------
struct QKey {
  int device;
  bool fp8;
  int64_t K;
  int align;
  auto tie() const { return std::tie(device, fp8, K, align); }
  bool operator<(const QKey& o) const { return tie() < o.tie(); }
};
struct QPlan {
  bool ok = false;
  cublasLtMatmulAlgo_t algo{};
  std::string desc, error;
};
std::mutex g_plans_mu;
std::map<QKey, QPlan>& plans() {
  static std::map<QKey, QPlan> m;
  return m;
}

struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  ~Descs() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// Column-major view of acc[M, N] = q[M, K] * w[N, K]^T: D (N x M, ld N) = op(A) B with
// A = w stored K x N (ld ldw, transposed) and B = q stored K x M (ld K).
cublasStatus_t make_descs(Descs& d, bool fp8, int64_t M, int64_t N, int64_t K, int64_t ldw, int64_t ldc) {
  const cublasComputeType_t compute = fp8 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32I;
  const cudaDataType_t scale_t = fp8 ? CUDA_R_32F : CUDA_R_32I;
  const cudaDataType_t ab = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_8I, cd = fp8 ? CUDA_R_32F : CUDA_R_32I;
  cublasStatus_t s = cublasLtMatmulDescCreate(&d.op, compute, scale_t);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
  cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
  if (fp8) {
    const int8_t fast = 0;  // partial sums promoted to fp32 (no fast accumulation)
    cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast));
  }
  s = cublasLtMatrixLayoutCreate(&d.a, ab, static_cast<uint64_t>(K), static_cast<uint64_t>(N), ldw);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  s = cublasLtMatrixLayoutCreate(&d.b, ab, static_cast<uint64_t>(K), static_cast<uint64_t>(M), K);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  return cublasLtMatrixLayoutCreate(&d.c, cd, static_cast<uint64_t>(N), static_cast<uint64_t>(M), ldc);
}

template <typename T>
T algo_attr(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t what) {
  T v{};
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&a, what, &v, sizeof(v), &written);
  return v;
}

QPlan choose(CudaContext& ctx, const QKey& key) {
  QPlan p;
  Descs d;
  cublasStatus_t s = make_descs(d, key.fp8, kRefDim, kRefDim, key.K, key.K, kRefDim);
  if (s != CUBLAS_STATUS_SUCCESS) {
    p.error = std::string("cublasLt descriptors: ") + cublasLtGetStatusString(s);
    return p;
  }
  cublasLtMatmulPreference_t pref = nullptr;
  LS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kLtBytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  const uint32_t al = static_cast<uint32_t>(key.align);
  for (auto a : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES})
    cublasLtMatmulPreferenceSetAttribute(pref, a, &al, sizeof(al));
  constexpr int kRequested = 32;
  cublasLtMatmulHeuristicResult_t res[kRequested] = {};
  int found = 0;
  s = cublasLtMatmulAlgoGetHeuristic(ctx.lt, d.op, d.a, d.b, d.c, d.c, pref, kRequested, res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
    p.error = std::string("no cuBLASLt ") + (key.fp8 ? "fp8" : "int8") + " algorithm for K = " + std::to_string(key.K) +
              " (" + cublasLtGetStatusString(s) + ")";
    return p;
  }
  for (int i = 0; i < found; ++i) {
    if (res[i].state != CUBLAS_STATUS_SUCCESS || res[i].workspaceSize > kLtBytes) continue;
    if (algo_attr<uint32_t>(res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) > 1) continue;
    if (algo_attr<uint32_t>(res[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) != CUBLASLT_REDUCTION_SCHEME_NONE)
      continue;
    p.ok = true;
    p.algo = res[i].algo;
    p.desc = std::string(key.fp8 ? "fp8" : "int8") + " algo " +
             std::to_string(algo_attr<int32_t>(res[i].algo, CUBLASLT_ALGO_CONFIG_ID)) + " tile " +
             std::to_string(algo_attr<uint32_t>(res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID)) + " stages " +
             std::to_string(algo_attr<uint32_t>(res[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID)) + " candidate " +
             std::to_string(i);
    if (ctx.diagnostics.gemm_verbose) std::fprintf(stderr, "linear pin: K %lld %s\n", static_cast<long long>(key.K), p.desc.c_str());
    return p;
  }
  p.error = std::string("no ") + (key.fp8 ? "fp8" : "int8") + " cuBLASLt candidate with split-K 1 and no reduction scheme";
  return p;
}

int align_of(const void* p, int64_t ld_bytes) {
  const uint64_t v = reinterpret_cast<uintptr_t>(p) | static_cast<uint64_t>(ld_bytes) | 16u;
  return static_cast<int>(v & (~v + 1));
}

const QPlan& plan_for(CudaContext& ctx, bool fp8, int64_t K, const void* w, int64_t ldw) {
  const QKey key{ctx.device, fp8, K, align_of(w, ldw)};
  std::lock_guard<std::mutex> lock(g_plans_mu);
  auto it = plans().find(key);
  if (it == plans().end()) it = plans().emplace(key, choose(ctx, key)).first;
  return it->second;
}

// acc[M, N] (int32 or f32, contiguous) = q[M, K] * w[N, K]^T with the pinned algorithm.
Status quant_gemm(CudaContext& ctx, bool fp8, const void* q, int64_t M, const TensorView& w, void* acc, int64_t ldc,
                  void* lt_ws) {
  const int64_t N = w.shape[0], K = w.shape[1];
  const QPlan& p = plan_for(ctx, fp8, K, w.data, w.stride[0]);
  auto simt = [&](const std::string& why) -> Status {
    if (ctx.diagnostics.gemm_verbose)
      std::fprintf(stderr, "linear: int8 GEMM M %lld N %lld K %lld on the SIMT kernel (%s)\n",
                   static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K), why.c_str());
    dim3 grid(static_cast<unsigned>(div_up(N, 32)), static_cast<unsigned>(div_up(M, 8)));
    gemm_i8_simt<<<grid, dim3(32, 8), 0, ctx.stream>>>(static_cast<const int8_t*>(q), K, w.ptr<const int8_t>(),
                                                       w.stride[0], static_cast<int32_t*>(acc), M, N, ldc);
    LS_CUDA_CHECK_LAUNCH();
    return Status();
  };
  if (!p.ok) {
    if (!fp8) return simt(p.error);
    return unsupported("linear", p.error);
  }
  Descs d;
  cublasStatus_t s = make_descs(d, fp8, M, N, K, w.stride[0], ldc);
  if (s != CUBLAS_STATUS_SUCCESS) return cublas_error(s, "cuda linear: cublasLt descriptors");
  const int32_t one_i = 1, zero_i = 0;
  const float one_f = 1.0f, zero_f = 0.0f;
  const void* alpha = fp8 ? static_cast<const void*>(&one_f) : &one_i;
  const void* beta = fp8 ? static_cast<const void*>(&zero_f) : &zero_i;
  s = cublasLtMatmul(ctx.lt, d.op, alpha, w.data, d.a, q, d.b, beta, acc, d.c, acc, d.c, &p.algo, lt_ws, kLtBytes,
                     ctx.stream);
  if ((s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) && !fp8)
    return simt(p.desc + ": " + cublasLtGetStatusString(s) + " for this shape");
  if (s != CUBLAS_STATUS_SUCCESS)
    return cublas_error(s, std::string("cuda linear: ") + (fp8 ? "fp8" : "int8") + " GEMM (" + p.desc + ") M " +
                               std::to_string(M) + " N " + std::to_string(N) + " K " + std::to_string(K));
  return Status();
}

int compute_capability(int device) {
  static std::mutex mu;
  static std::map<int, int> cc;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cc.find(device);
  if (it != cc.end()) return it->second;
  int major = 0, minor = 0;
  LS_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  LS_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return cc[device] = major * 10 + minor;
}
bool fp8_tensor_cores(int device) { return compute_capability(device) >= 89; }

struct Region {
  void* lt = nullptr;
  char* chunk = nullptr;
};
Status linear_region(const CudaContext& ctx, Region* r) {
  const size_t need = gemm_workspace_bytes() + linear_quant_workspace_bytes();
  if (ctx.workspace == nullptr || ctx.workspace_bytes < need)
    return make_error(ErrorCode::invalid_argument,
                      "cuda linear: no workspace for the quantised linears; call Backend::set_workspace with "
                      "workspace_bytes() (at least " + std::to_string(need) + " bytes) from the device arena first");
  char* base = static_cast<char*>(ctx.workspace) + gemm_workspace_bytes();
  r->lt = base;
  r->chunk = base + kLtBytes;
  return Status();
}

// Rows per chunk for (K, N): what fits the chunk region, a multiple of 128 when >= 128.
int64_t chunk_rows(int64_t K, int64_t N) {
  const int64_t per_row = K + 16 + 4 * ld_acc(N);
  int64_t rows = static_cast<int64_t>((kChunkBytes - 3 * 256) / static_cast<size_t>(per_row));
  rows = std::min<int64_t>(rows, 32768);  // the epilogue's grid.y (<= 65535)
  if (rows >= 128) rows = rows / 128 * 128;
  return std::max<int64_t>(rows, 1);
}

Status launch_int8_quant(CudaContext& ctx, const TensorView& x, int64_t rows, int64_t K, int64_t G, bool swiglu,
                         int8_t* q, float* sx) {
  const size_t smem = static_cast<size_t>(K) * sizeof(float);
  if (smem + 256 > ctx.max_smem_optin)  // + the kernel's static reduction array
    return unsupported("linear", "int8_convrot with K = " + std::to_string(K) + " needs " + std::to_string(smem) +
                                     " bytes of shared memory per row; the device has " +
                                     std::to_string(ctx.max_smem_optin));
  int log_g = 0;
  while ((int64_t{1} << log_g) < G) ++log_g;
  const int C = G >= 16 ? 16 : 4;
  // 16-byte (C = 16) or 8-byte (C = 4) loads: the rows (and the up half at + K) aligned so.
  const int64_t vec_elems = C == 16 ? 8 : 4;
  const bool vec = reinterpret_cast<uintptr_t>(x.data) % static_cast<uintptr_t>(vec_elems * 2) == 0 &&
                   x.stride[0] % vec_elems == 0;
  using Kernel = void (*)(const uint16_t*, int64_t, int, int, int8_t*, float*);
  Kernel kernel = nullptr;
  if (C == 16) {
    if (swiglu) kernel = vec ? quant_int8_rows<true, 16, true> : quant_int8_rows<true, 16, false>;
    else kernel = vec ? quant_int8_rows<false, 16, true> : quant_int8_rows<false, 16, false>;
  } else {
    if (swiglu) kernel = vec ? quant_int8_rows<true, 4, true> : quant_int8_rows<true, 4, false>;
    else kernel = vec ? quant_int8_rows<false, 4, true> : quant_int8_rows<false, 4, false>;
  }
  if (smem > 48 * 1024)
    LS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<static_cast<unsigned>(rows), row_threads(K / C), smem, ctx.stream>>>(
      x.ptr<const uint16_t>(), x.stride[0], static_cast<int>(K), log_g, q, sx);
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

Status launch_fp8_quant(CudaContext& ctx, const TensorView& x, int64_t rows, int64_t K, float input_scale, bool dynamic,
                        uint8_t* q, float* sa) {
  LS_CHECK(K % 16 == 0);
  const bool vec = aligned16(x.data) && x.stride[0] % 8 == 0;
  auto kernel = vec ? quant_fp8_rows<true> : quant_fp8_rows<false>;
  kernel<<<static_cast<unsigned>(rows), row_threads(K / 8), 0, ctx.stream>>>(x.ptr<const uint16_t>(), x.stride[0],
                                                                            static_cast<int>(K), input_scale, dynamic, q, sa);
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

Status launch_epilogue(CudaContext& ctx, bool fp8, const void* acc, const float* rs, const TensorView& w_scale,
                       const TensorView* bias, const TensorView& out_rows, int64_t rows, int64_t N) {
  const void* b = bias ? bias->data : nullptr;
  const bool bf32 = bias && bias->dtype == DType::f32;
  const bool scalar = w_scale.numel() == 1;
  // 4 outputs per thread where the rows allow 8-byte stores (acc rows are 16-byte aligned:
  // ld_acc(N) = N when N % 4 == 0, the region 256-aligned).
  const bool v4 = N % 4 == 0 && out_rows.stride[0] % 4 == 0 && reinterpret_cast<uintptr_t>(out_rows.data) % 8 == 0 &&
                  reinterpret_cast<uintptr_t>(acc) % 16 == 0;
  const int V = v4 ? 4 : 1;
  dim3 grid(static_cast<unsigned>(div_up(div_up(N, V), kThreads)), static_cast<unsigned>(rows));
  auto* o = out_rows.ptr<uint16_t>();
  const float* sw = w_scale.ptr<const float>();
  const int64_t ldo = out_rows.stride[0], ldc = ld_acc(N);
  if (fp8 && v4) epilogue_rows<true, 4><<<grid, kThreads, 0, ctx.stream>>>(acc, rs, sw, scalar, b, bf32, o, ldo, N, ldc);
  else if (fp8) epilogue_rows<true, 1><<<grid, kThreads, 0, ctx.stream>>>(acc, rs, sw, scalar, b, bf32, o, ldo, N, ldc);
  else if (v4) epilogue_rows<false, 4><<<grid, kThreads, 0, ctx.stream>>>(acc, rs, sw, scalar, b, bf32, o, ldo, N, ldc);
  else epilogue_rows<false, 1><<<grid, kThreads, 0, ctx.stream>>>(acc, rs, sw, scalar, b, bf32, o, ldo, N, ldc);
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

// The dequantise-to-bf16 path (fp8 below SM 8.9): column chunks of the weight, bf16 GEMM.
Status fp8_dequant_linear(CudaContext& ctx, const TensorView& x, const LinearWeight& w, const TensorView* bias,
                          const TensorView& out, char* chunk) {
  const int64_t N = w.w.shape[0], K = w.w.shape[1];
  int64_t cols = static_cast<int64_t>(kChunkBytes / (static_cast<size_t>(K) * 2)) / 8 * 8;  // 16-byte column starts
  cols = std::max<int64_t>(1, std::min(cols, N));
  auto* wb = reinterpret_cast<uint16_t*>(chunk);
  for (int64_t n0 = 0; n0 < N; n0 += cols) {
    const int64_t n1 = std::min(N, n0 + cols);
    const int64_t cnt = (n1 - n0) * K;
    dequant_fp8<<<static_cast<unsigned>(div_up(cnt, kThreads)), kThreads, 0, ctx.stream>>>(
        w.w.ptr<const uint8_t>() + n0 * w.w.stride[0], w.w.stride[0], K, w.scale.ptr<const float>(), wb, n1 - n0);
    LS_CUDA_CHECK_LAUNCH();
    TensorView wv(wb, DType::bf16, {n1 - n0, K}, out.device);
    TensorView bv;
    if (bias) bv = bias->slice_rows(n0, n1);
    LS_TRY(cuda_op_gemm(ctx, x, wv, bias ? &bv : nullptr, out.cols(n0, n1)));
  }
  return Status();
}

}  // namespace

size_t linear_quant_workspace_bytes() { return kLtBytes + kChunkBytes; }

std::string cuda_linear_fp8_path(const CudaContext& ctx) {
  const int cc = compute_capability(ctx.device);
  return fp8_tensor_cores(ctx.device)
             ? "fp8 tensor cores (cuBLASLt E4M3, fp32 accumulation, pinned, SM " + std::to_string(cc) + ")"
             : "fp8 dequantised to bf16 + bf16 GEMM (SM " + std::to_string(cc) + " < 8.9)";
}

Status cuda_op_linear(CudaContext& ctx, const TensorView& x, const LinearWeight& w, const TensorView* bias,
                      const TensorView& out, const LinearOptions& opts) {
  if (w.format == WeightFormat::bf16) {
    if (opts.swiglu_input)
      return make_error(ErrorCode::unsupported,
                        "cuda linear: a fused swiglu input is implemented for int8_convrot only; for bf16 weights run "
                        "swiglu first");
    return cuda_op_gemm(ctx, x, w.w, bias, out);
  }
  const Device dev{DeviceKind::cuda, ctx.device};
  for (const TensorView* v : {&x, &w.w, &w.scale, bias, &out})
    if (v && !v->empty() && v->device != dev)
      return unsupported("linear", "a view lives on " + v->device.str() + ", not on cuda:" + std::to_string(ctx.device));
  int64_t K = 0;
  LS_TRY(check_linear_quant_args("cuda", x, w, bias, out, opts, &K));
  const int64_t M = x.shape[0], N = w.w.shape[0];
  if (M == 0 || N == 0) return Status();
  Region reg;
  LS_TRY(linear_region(ctx, &reg));
  const bool fp8 = w.format == WeightFormat::fp8_e4m3;
  if (fp8 && !fp8_tensor_cores(ctx.device)) return fp8_dequant_linear(ctx, x, w, bias, out, reg.chunk);
  if (fp8 && K % 16 != 0)
    return unsupported("linear", "fp8_e4m3 on the tensor cores needs K to be a multiple of 16 (K = " +
                                     std::to_string(K) + ")");
  const int64_t Mc = chunk_rows(K, N);
  auto* q = reinterpret_cast<uint8_t*>(reg.chunk);
  auto* rs = reinterpret_cast<float*>(reg.chunk + align_up(static_cast<size_t>(Mc * K)));
  void* acc = reg.chunk + align_up(static_cast<size_t>(Mc * K)) + align_up(static_cast<size_t>(Mc) * 4);
  for (int64_t m0 = 0; m0 < M; m0 += Mc) {
    const int64_t rows = std::min(Mc, M - m0);
    const TensorView xr = x.slice_rows(m0, m0 + rows);
    if (fp8) {
      LS_TRY(launch_fp8_quant(ctx, xr, rows, K, w.input_scale, w.dynamic_act, q, rs));
    } else {
      LS_TRY(launch_int8_quant(ctx, xr, rows, K, w.group, opts.swiglu_input, reinterpret_cast<int8_t*>(q), rs));
    }
    LS_TRY(quant_gemm(ctx, fp8, q, rows, w.w, acc, ld_acc(N), reg.lt));
    LS_TRY(launch_epilogue(ctx, fp8, acc, rs, w.scale, bias, out.slice_rows(m0, m0 + rows), rows, N));
  }
  return Status();
}

// ---- benchmark entries (linear_quant_bench.cuh) -------------------------------------------------
namespace {
Status bench_ctx(Backend& b, CudaContext* ctx) {
  const int dev = device_index(b);
  if (dev < 0) return make_error(ErrorCode::unsupported, "bench_quant: not a CUDA backend");
  ctx->device = dev;
  ctx->stream = compute_stream(b);
  int smem = 0;
  LS_CUDA_CHECK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  ctx->max_smem_optin = static_cast<size_t>(smem);
  return Status();
}
}  // namespace

Status bench_quant_activations(Backend& b, const TensorView& x, const LinearWeight& w, bool swiglu, const TensorView& q,
                               const TensorView& rs) {
  CudaContext ctx;
  LS_TRY(bench_ctx(b, &ctx));
  const int64_t K = w.w.shape[1], rows = x.shape[0];
  LS_CHECK_MSG(q.shape[0] == rows && q.shape[1] == K && q.is_contiguous() && rs.numel() >= rows &&
                   x.shape[1] == (swiglu ? 2 * K : K),
               "bench_quant_activations: shapes");
  if (w.format == WeightFormat::fp8_e4m3)
    return launch_fp8_quant(ctx, x, rows, K, w.input_scale, w.dynamic_act, static_cast<uint8_t*>(q.data),
                            rs.ptr<float>());
  return launch_int8_quant(ctx, x, rows, K, w.group, swiglu, static_cast<int8_t*>(q.data), rs.ptr<float>());
}

Status bench_quant_epilogue(Backend& b, const TensorView& acc, const TensorView& rs, const LinearWeight& w,
                            const TensorView& out) {
  CudaContext ctx;
  LS_TRY(bench_ctx(b, &ctx));
  const int64_t rows = out.shape[0], N = out.shape[1];
  LS_CHECK_MSG(acc.shape[0] == rows && acc.shape[1] == ld_acc(N) && acc.is_contiguous() && rs.numel() >= rows,
               "bench_quant_epilogue: shapes");
  return launch_epilogue(ctx, w.format == WeightFormat::fp8_e4m3, acc.data, rs.ptr<const float>(), w.scale, nullptr,
                         out, rows, N);
}

Status bench_quant_gemm_only(Backend& b, bool fp8, const TensorView& q, const TensorView& w, const TensorView& acc) {
  const int dev = device_index(b);
  if (dev < 0) return make_error(ErrorCode::unsupported, "bench_quant_gemm_only: not a CUDA backend");
  static std::mutex mu;
  static std::map<int, cublasLtHandle_t> handles;
  static std::map<int, void*> lt_ws;
  CudaContext ctx;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!handles.count(dev)) {
      LS_CUDA_CHECK(cudaSetDevice(dev));
      cublasLtHandle_t h = nullptr;
      LS_CUBLAS_CHECK(cublasLtCreate(&h));
      handles[dev] = h;
      void* p = nullptr;
      const cudaError_t e = cudaMalloc(&p, kLtBytes);
      if (e != cudaSuccess) return cuda_error(e, "bench_quant_gemm_only: cuBLASLt workspace");
      lt_ws[dev] = p;
    }
    ctx.lt = handles[dev];
  }
  ctx.device = dev;
  ctx.stream = compute_stream(b);
  LS_CHECK_MSG(q.shape[1] == w.shape[1] && acc.shape[0] == q.shape[0] && acc.shape[1] == w.shape[0] &&
                   q.is_contiguous() && acc.is_contiguous(),
               "bench_quant_gemm_only: shapes");
  return quant_gemm(ctx, fp8, q.data, q.shape[0], w, acc.data, acc.shape[1], lt_ws[dev]);
}

}  // namespace ls::cuda
