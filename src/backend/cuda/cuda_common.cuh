// Shared pieces of the CUDA backend: error checks, the per-backend context the op
// entries receive, and device-side dtype helpers.
//
// Numerics: every rounding to bf16 goes through f32_to_bf16_bits below, which is the
// same bit recipe as core/dtype.h (round to nearest even, quiet NaN keeps its payload),
// so an elementwise op with the same rounding points as the CPU reference produces the
// same bytes. -fmad=false is set for all CUDA sources: nothing contracts a*b+c unless
// the code calls fmaf().
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "backend/numerics.h"
#include "core/status.h"
#include "core/tensor.h"

namespace ls::cuda {

[[noreturn]] void cuda_check_failed(const char* call, const char* func, const char* file, int line, const char* what);
// An expected failure (out of memory, a device refusing a call) as a Status.
Error cuda_error(cudaError_t e, const std::string& what);
Error cublas_error(cublasStatus_t s, const std::string& what);

}  // namespace ls::cuda

// Bugs: a CUDA call that must not fail (launch with valid arguments, stream sync on a
// healthy device) aborts with the call, function, file, line and CUDA's message.
#define LS_CUDA_CHECK(call)                                                                  \
  do {                                                                                       \
    cudaError_t ls_cuda_e_ = (call);                                                         \
    if (ls_cuda_e_ != cudaSuccess)                                                           \
      ::ls::cuda::cuda_check_failed(#call, __func__, __FILE__, __LINE__, cudaGetErrorString(ls_cuda_e_)); \
  } while (0)
#define LS_CUBLAS_CHECK(call)                                                                \
  do {                                                                                       \
    cublasStatus_t ls_cublas_s_ = (call);                                                    \
    if (ls_cublas_s_ != CUBLAS_STATUS_SUCCESS)                                               \
      ::ls::cuda::cuda_check_failed(#call, __func__, __FILE__, __LINE__, cublasLtGetStatusString(ls_cublas_s_)); \
  } while (0)
// After a kernel launch: a launch error is a bug (bad configuration).
#define LS_CUDA_CHECK_LAUNCH() LS_CUDA_CHECK(cudaGetLastError())

namespace ls::cuda {

struct GemmAlgoCache;  // gemm.cu

// What every op entry receives: the device, its compute stream, the cuBLASLt handle,
// the caller's GEMM workspace, the pinned-algorithm cache and the numerics.
struct CudaContext {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;      // from Backend::set_workspace (an arena piece)
  size_t workspace_bytes = 0;
  int sm_count = 0;
  size_t max_smem_optin = 0;
  GemmAlgoCache* gemm_cache = nullptr;
  // count_nonfinite's result on the device: one counter made with the backend (see
  // nonfinite.cu for why it is not a workspace piece).
  unsigned long long* nonfinite_counter = nullptr;
  // The backend's RESOLVED numerics (Backend::set_numerics / numerics()): the op entries
  // read the attention path, the kernel variant, the cuDNN chunk and form, the fp32 GEMM
  // order and the cuBLASLt candidates from here, never from the environment.
  Numerics numerics;
  Diagnostics diagnostics;
};

// Host-side helpers for views.
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
inline int64_t div_up(int64_t a, int64_t b) { return (a + b - 1) / b; }
Status unsupported(const char* op, const std::string& detail);

// ---- device-side dtype helpers ---------------------------------------------------
__host__ __device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
#else
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
#endif
}

// Same recipe as ls::f32_to_bf16 (core/dtype.h): RNE, quiet NaN with payload kept.
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return static_cast<uint16_t>(u >> 16);
}
__device__ __forceinline__ float round_bf16(float f) { return bf16_bits_to_f32(f32_to_bf16_bits(f)); }
// prmt.b32: byte i of the result is the byte of {b, a} (a = bytes 0-3, b = 4-7) that nibble i
// of sel names.
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// Load element i of a bf16 or f32 table as float (the table dtype is uniform per launch).
__device__ __forceinline__ float load_bf16_or_f32(const void* p, bool is_f32, int64_t i) {
  return is_f32 ? static_cast<const float*>(p)[i] : bf16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
}

// Eight consecutive bf16 values starting at p (one 16-byte load when `vec`), n valid.
__device__ __forceinline__ void load8_bf16(const uint16_t* p, bool vec, int n, float out[8]) {
  if (vec && n == 8) {
    uint4 v = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = bf16_bits_to_f32(static_cast<uint16_t>(w[i] & 0xffffu));
      out[2 * i + 1] = bf16_bits_to_f32(static_cast<uint16_t>(w[i] >> 16));
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = i < n ? bf16_bits_to_f32(p[i]) : 0.0f;
  }
}
__device__ __forceinline__ void store8_bf16(uint16_t* p, bool vec, int n, const float in[8]) {
  if (vec && n == 8) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      w[i] = static_cast<uint32_t>(f32_to_bf16_bits(in[2 * i])) | (static_cast<uint32_t>(f32_to_bf16_bits(in[2 * i + 1])) << 16);
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (i < n) p[i] = f32_to_bf16_bits(in[i]);
  }
}

}  // namespace ls::cuda
