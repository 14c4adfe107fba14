// The sm_90a pipeline primitives shared by the Hopper attention kernels (attention_hopper.cu,
// bf16; attention_hopper_int8.cu, int8): mbarriers, the TMA tensor copy, wgmma fences and
// waits, the shared-memory matrix descriptor, the consumer warpgroups' ping-pong barriers, and
// on the host the driver's cuTensorMapEncodeTiled. Inline wrappers of single PTX
// instructions: including this header changes no instruction of either kernel.
// Device part compiled for sm_90a only (LS_HOPPER_PIPELINE_DEVICE).
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (the encoder is fetched from the runtime)
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <string>

namespace ls::cuda::hopper {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LS_HOPPER_PIPELINE_DEVICE 1
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// One TMA box of a 3-D map at coordinates (c0, c1, c2) into shared memory, completing on bar
// (elements outside the tensor are zero-filled and still count as bytes).
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses to the accumulators across a wgmma boundary.
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(int32_t (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(d[i])::"memory");
}
// Shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address,
// leading and stride byte offsets (all >> 4), 128-byte swizzle (mode 1 in bits 62-63).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((addr >> 4) & 0x3FFF);
  d |= static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16;
  d |= static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32;
  d |= static_cast<uint64_t>(1) << 62;
  return d;
}
// Named barriers 1 and 2 order the two consumer warpgroups' GEMM issues (ping-pong):
// warpgroup w waits on barrier 1 + w before it issues, then arrives on the other's, so
// one warpgroup's softmax runs while the other's GEMMs hold the tensor cores
// (FlashAttention-3's inter-warpgroup ping-pong). Scheduling only: the same arithmetic.
__device__ __forceinline__ void sched_wait(int cw) { asm volatile("bar.sync %0, 256;\n" ::"r"(1 + cw) : "memory"); }
__device__ __forceinline__ void sched_arrive(int cw) {
  asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - cw) : "memory");
}
#endif  // sm_90a

// ---- host ----
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled from the driver through the runtime (no link to libcuda); null
// with *why set where the driver has none.
inline EncodeTiled tensor_map_encoder(std::string* why) {
  static std::once_flag once;
  static EncodeTiled fn = nullptr;
  static std::string err;
  std::call_once(once, [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || f == nullptr)
      err = std::string("the driver has no cuTensorMapEncodeTiled (") + cudaGetErrorString(e) + ")";
    else
      fn = reinterpret_cast<EncodeTiled>(f);
  });
  if (fn == nullptr && why != nullptr) *why = err;
  return fn;
}

}  // namespace ls::cuda::hopper
