// The LoRA side path of a quantised linear on CUDA (backend.h, Backend::lora_side;
// docs/numerics.md "LoRA side path"): the same bits as the CPU reference
// (src/backend/cpu/lora_side.cpp), tested by memcmp (tests/cuda/test_lora_side_cuda.cpp).
//
// One row block of kBM rows per CTA, no scratch outside the chip:
//   stage 1: t [kBM, R] = a . down in shared memory; each thread owns up to kAcc (m, r)
//            outputs and adds k = 0, 1, ..., K-1 in order (k tiles of kBK staged in shared
//            memory: the inputs a [kBM, kBK] (bf16 widened, or lq_swiglu of the fused fc2
//            input) and down [kBK, R]).
//   stage 2: for column tiles of kBN, y [kBM, kBN] = t . up^T; each thread owns kBM*kBN/256
//            outputs and adds r = 0, 1, ..., R-1 in order (r tiles of kRC staged in shared
//            memory); then out = bf16(out + y).
// Every product and sum is __fmul_rn / __fadd_rn (lq::mul / lq::add): no FMA, no
// reassociation, so each output is the CPU's fp32 sequence exactly. Shared memory:
// (kBM*R + kBM*kBK + kBK*R + kBN*(kRC+1)) floats, 76 KiB at R = 256 (opted in above 48 KiB).
#include "backend/cpu/linear_quant_math.h"
#include "backend/cuda/ops.cuh"

namespace ls::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBM = 32;   // rows per CTA
constexpr int kBK = 32;   // k per stage-1 tile
constexpr int kBN = 64;   // output columns per stage-2 tile
constexpr int kRC = 32;   // r per stage-2 tile
constexpr int kAcc = kBM * static_cast<int>(kLoraSideMaxRank) / kThreads;  // stage-1 outputs per thread (32)
constexpr int kAcc2 = kBM * kBN / kThreads;                                 // stage-2 outputs per thread (8)
static_assert(kBM * kLoraSideMaxRank % kThreads == 0 && kBM * kBN % kThreads == 0, "tiles");

size_t smem_bytes(int R) {
  return sizeof(float) * (static_cast<size_t>(kBM) * R + kBM * kBK + static_cast<size_t>(kBK) * R + kBN * (kRC + 1));
}

template <bool kSwiglu>
__global__ void __launch_bounds__(kThreads)
    lora_side_kernel(const uint16_t* __restrict__ x, int64_t x_ld, int64_t M, int K, const float* __restrict__ down,
                     int R, const float* __restrict__ up, int64_t up_ld, int64_t N, uint16_t* __restrict__ out,
                     int64_t o_ld) {
  extern __shared__ float sm[];
  float* t = sm;                  // [kBM][R]
  float* xs = t + kBM * R;        // [kBM][kBK]
  float* ds = xs + kBM * kBK;     // [kBK][R]
  float* us = ds + kBK * R;       // [kBN][kRC + 1] (padded: no bank conflicts)
  const int tid = threadIdx.x;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * kBM;
  const int rows = static_cast<int>(M - m0 < kBM ? M - m0 : kBM);
  const int outs = kBM * R;  // stage-1 outputs of the block (rows past M computed on zeros, never stored)

  // ---- stage 1: t = a . down, k ascending ---------------------------------------------
  float acc[kAcc];
#pragma unroll
  for (int j = 0; j < kAcc; ++j) acc[j] = 0.0f;
  for (int k0 = 0; k0 < K; k0 += kBK) {
    const int kn = K - k0 < kBK ? K - k0 : kBK;
    for (int i = tid; i < kBM * kBK; i += kThreads) {
      const int m = i / kBK, kk = i % kBK;
      float a = 0.0f;
      if (m < rows && kk < kn) {
        const uint16_t* xr = x + (m0 + m) * x_ld;
        if (kSwiglu) a = lq::lq_swiglu(lq::bf16_widen(xr[k0 + kk]), lq::bf16_widen(xr[K + k0 + kk]));
        else a = lq::bf16_widen(xr[k0 + kk]);
      }
      xs[i] = a;
    }
    for (int i = tid; i < kn * R; i += kThreads) ds[i] = down[static_cast<int64_t>(k0) * R + i];
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kAcc; ++j) {
      const int o = tid + j * kThreads;
      if (o < outs) {
        const int m = o / R, r = o % R;
        float s = acc[j];
        for (int kk = 0; kk < kn; ++kk) s = lq::add(s, lq::mul(xs[m * kBK + kk], ds[kk * R + r]));
        acc[j] = s;
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < kAcc; ++j) {
    const int o = tid + j * kThreads;
    if (o < outs) t[o] = acc[j];  // o = m * R + r
  }
  __syncthreads();

  // ---- stage 2: y = t . up^T, r ascending; out = bf16(out + y) --------------------------
  for (int64_t n0 = 0; n0 < N; n0 += kBN) {
    const int nn_max = static_cast<int>(N - n0 < kBN ? N - n0 : kBN);
    float y[kAcc2];
#pragma unroll
    for (int j = 0; j < kAcc2; ++j) y[j] = 0.0f;
    for (int r0 = 0; r0 < R; r0 += kRC) {
      const int rc = R - r0 < kRC ? R - r0 : kRC;
      for (int i = tid; i < kBN * kRC; i += kThreads) {
        const int nn = i / kRC, rr = i % kRC;
        us[nn * (kRC + 1) + rr] = (nn < nn_max && rr < rc) ? up[(n0 + nn) * up_ld + r0 + rr] : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int j = 0; j < kAcc2; ++j) {
        const int o = tid + j * kThreads;
        const int m = o / kBN, nn = o % kBN;
        float s = y[j];
        for (int rr = 0; rr < rc; ++rr) s = lq::add(s, lq::mul(t[m * R + r0 + rr], us[nn * (kRC + 1) + rr]));
        y[j] = s;
      }
      __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < kAcc2; ++j) {
      const int o = tid + j * kThreads;
      const int m = o / kBN, nn = o % kBN;
      if (m < rows && nn < nn_max) {
        uint16_t* p = out + (m0 + m) * o_ld + n0 + nn;
        *p = lq::bf16_bits(lq::add(lq::bf16_widen(*p), y[j]));
      }
    }
  }
}

}  // namespace

Status cuda_op_lora_side(CudaContext& ctx, const TensorView& x, const LoraSide& side, const TensorView& out,
                         const LinearOptions& opts) {
  LS_TRY(check_lora_side_args("cuda", x, side, out, opts));
  const int64_t M = x.size(0), K = side.down.size(0), R = side.down.size(1), N = side.up.size(0);
  if (M == 0 || N == 0) return Status();
  if (K > (int64_t{1} << 30)) return unsupported("lora_side", "K = " + std::to_string(K) + " input features");
  const size_t smem = smem_bytes(static_cast<int>(R));
  const unsigned grid = static_cast<unsigned>((M + kBM - 1) / kBM);
  auto launch = [&](auto kernel) {
    LS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    kernel<<<grid, kThreads, smem, ctx.stream>>>(x.ptr<const uint16_t>(), x.stride[0], M, static_cast<int>(K),
                                                side.down.ptr<const float>(), static_cast<int>(R),
                                                side.up.ptr<const float>(), side.up.stride[0], N, out.ptr<uint16_t>(),
                                                out.stride[0]);
  };
  if (opts.swiglu_input) launch(lora_side_kernel<true>);
  else launch(lora_side_kernel<false>);
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

}  // namespace ls::cuda
