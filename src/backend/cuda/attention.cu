// Attention with the kv_tile contract (backend.h, DESIGN.md §1.2): a FlashAttention-2
// style kernel on mma.sync m16n8k16 (bf16 in, fp32 accumulate), head_dim 32, 64 or 128.
//
// Work split: one CTA = 16 x NW x MT queries x 1 head, NW warps of MT m-tiles of 16
// queries (variants below: a speed knob only, a row's arithmetic is the same). The keys are
// walked in order in blocks of at most 64 keys that never straddle a kv_tile boundary
// (block = [b, min(b + 64, end of b's kv_tile, Mk))). Per (query, head) the state is
// fp32 (m, l, acc[Dh]) carried across the whole key range:
//   d_j   = dot(q, k_j)                               (tensor-core fp32 accumulation)
//   m_new = max(m, max_j d_j * c), c = scale * log2 e (c > 0, so max commutes with c)
//   alpha = 2^(m - m_new) (0 when m = -inf)
//   p_j   = 2^(fma(d_j, c, -m_new))                   (ex2.approx, ~2 ulp)
//   l     = l * alpha + sum_j p_j                     (per thread over its 16 keys of
//                                                      the block, then the 4 threads of
//                                                      a quad added by xor-shuffle 1, 2 at the end)
//   acc   = acc * alpha + sum_j bf16(p_j) * v_j       (P rounded to bf16, as FA-2)
//   out   = bf16(acc / l)
// This is the contract's math in the log2 domain with the running max refreshed every
// 64 keys instead of every kv_tile keys: equal up to fp32 rounding of the exponent
// arguments and of the bf16(P) rounding points, which the parity test bounds
// (relative L2 vs fp64 <= 2x the CPU reference's). It is bitwise query-slice
// invariant: a query's arithmetic uses its own row of Q and the same key blocks in
// the same order whatever Mq is or which other queries share its CTA.
// Two-pass / streamed K/V: since blocks never straddle a kv_tile, a caller that feeds
// the same tiles in the same order through this state gets the same bits.
//
// Streamed keys (AttentionParams::state, kState = true instantiations): every non-final
// chunk holds whole kv_tiles, so the chunk starts at a block boundary of the one-call
// walk and its blocks are the same key ranges. The state of (query i, head h) is
// exactly what the threads hold at a block boundary, stored fp32 in the contiguous
// state f32 [Mq, H, Dh + 8] at row (i * H + h):
//   [0, Dh)        acc[d]; quad lane t holds d = 8j + 2t, 8j + 2t + 1 (float2 stores)
//   [Dh]           m, log2 domain (equal in the 4 lanes of the quad after the max)
//   [Dh + 1 + t]   lane t's partial l, unreduced: the quad sum happens only at the
//                  end, so the resumed sum keeps the one-call order
//   [Dh + 5, +8)   unused (never written or read)
// state_in loads these instead of (-inf, 0, 0) before the key loop; !finalize stores
// them after it instead of writing out. Rows past Mq (zero-filled Q rows of the last
// CTA) neither load nor store. The no-state instantiations (kState = false) compile
// none of this, so their code and speed are those of the one-call kernel.
#include <cuda_bf16.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>

#include "backend/cuda/attention_args.cuh"
#include "backend/cuda/attention_cudnn.cuh"  // cuDNN path hook (see cuda_op_attention)
#include "backend/cuda/attention_hopper.cuh"  // Hopper kernel hook (numerics attention hopper)
#include "backend/cuda/ops.cuh"

namespace ls::cuda {
namespace {

constexpr int kBc = 64;  // keys per inner block
// 4 warps x 2 m-tiles per warp: 303-314 TFLOP/s against 240 for 4x1 on the H200
// (bench/results/h200_final_*), bitwise equal to 4x1 (CudaOps.AttentionVariantsAgree).
constexpr const char* kDefaultVariant = "4x2";
constexpr int kMaxDevices = 64;

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int n = valid ? 16 : 0;  // 0: zero-fill the 16 bytes
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// d += a * b  (m16n8k16, bf16 inputs, fp32 accumulators)
__device__ __forceinline__ void mma_bf16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two fp32 -> bf16 (round to nearest even, one cvt.rn.bf16x2.f32), lo in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Shared-memory tiles are [rows][D] bf16 with the 16-byte chunk index xor-swizzled by
// (row & 7) when a row has >= 8 chunks, so ldmatrix's 8 row reads hit 8 bank groups.
template <int D>
__device__ __forceinline__ int sm_idx(int r, int chunk) {
  constexpr int kChunks = D / 8;
  const int c = kChunks >= 8 ? (chunk ^ (r & 7)) : chunk;
  return r * D + c * 8;
}

// Rows [row0, row0 + R) of a [rows, H, D] view at head h into smem; rows >= nrows are
// zeros. Thread t always copies chunk t % (D/8) of rows t / (D/8) + k * (threads / (D/8)),
// and that row step is a multiple of 8, so its swizzled smem column is fixed per thread.
template <int D, int R, int NW>
__device__ __forceinline__ void load_tile(uint16_t* sm, const uint16_t* base, int64_t stride, int64_t row0,
                                          int64_t nrows) {
  constexpr int kChunks = D / 8, kStep = NW * 32 / kChunks;
  static_assert(kStep % 8 == 0 && R % kStep == 0, "tile loader layout");
  const int r0 = threadIdx.x / kChunks, c = threadIdx.x % kChunks;
  const uint16_t* src = base + (row0 + r0) * stride + c * 8;
  uint16_t* dst = sm + sm_idx<D>(r0, c);
#pragma unroll
  for (int i = 0; i < R / kStep; ++i) {
    const bool valid = row0 + r0 + i * kStep < nrows;
    cp_async16(dst + i * kStep * D, valid ? src + i * kStep * stride : base, valid);
  }
}

// The common fields (o, Mq, Mk, kv_tile, scale, state: attention_args.cuh; the state is
// read by the kState kernels only) and this kernel's inputs.
struct AttnArgs : AttnCommonArgs {
  const uint16_t* q;  // bf16 [Mq, H, D]
  const uint16_t* k;  // bf16 [Mk, H, D]
  const uint16_t* v;  // bf16 [Mk, H, D]
  int64_t sq, hq, sk, hk, sv, hv;  // row and head strides (elements)
};

// MT m-tiles of 16 queries per warp. MT = 1 keeps Q in registers; MT = 2 reads Q
// fragments from shared memory per k-step and reuses every K and V fragment for two
// m-tiles, which halves the shared-memory traffic per MMA (the limit of MT = 1 on an
// H200: 64 ldmatrix.x4 per 128 mma). A row's arithmetic (same K/V fragments, same
// k order, same softmax steps) is identical for every (NW, MT), so results are
// bitwise equal across variants (tested).
template <int D, int NW, int MT, bool kState>
__global__ void __launch_bounds__(NW * 32) attention_bf16(const AttnArgs a) {
  constexpr int kBr = 16 * NW * MT;  // queries per CTA
  constexpr bool kQInRegs = MT == 1;
  extern __shared__ __align__(128) uint16_t smem[];
  uint16_t* Qs = smem;              // [kBr][D]
  uint16_t* Ks = Qs + kBr * D;      // [2][kBc][D]
  uint16_t* Vs = Ks + 2 * kBc * D;  // [2][kBc][D]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int h = blockIdx.y;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kBr;
  const uint16_t* qh = a.q + h * a.hq;
  const uint16_t* kh = a.k + h * a.hk;
  const uint16_t* vh = a.v + h * a.hv;

  auto block_end = [&](int64_t b) {
    const int64_t tile_end = (b / a.kv_tile + 1) * a.kv_tile;
    int64_t e = b + kBc;
    if (e > tile_end) e = tile_end;
    if (e > a.Mk) e = a.Mk;
    return e;
  };

  load_tile<D, kBr, NW>(Qs, qh, a.sq, q0, a.Mq);
  load_tile<D, kBc, NW>(Ks, kh, a.sk, 0, a.Mk);
  load_tile<D, kBc, NW>(Vs, vh, a.sv, 0, a.Mk);
  cp_async_commit();

  // Per-thread ldmatrix offsets (elements): every row this lane addresses has
  // row & 7 == lane % 8, so the swizzle is fixed per lane.
  // Q rows of m-tile mt are 16 rows below those of mt - 1: same swizzle, offset 16 D.
  int koff[D / 32], voff[D / 16], qoff[D / 16];
#pragma unroll
  for (int i = 0; i < D / 32; ++i) koff[i] = sm_idx<D>(lane % 8, 4 * i + lane / 8);
#pragma unroll
  for (int i = 0; i < D / 16; ++i) voff[i] = sm_idx<D>((lane % 8) + 8 * ((lane / 8) % 2), 2 * i + lane / 16);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    qoff[kk] = sm_idx<D>(warp * MT * 16 + (lane % 8) + 8 * ((lane / 8) % 2), 2 * kk + lane / 16);

  uint32_t qf[kQInRegs ? D / 16 : 1][4];
  float acc[MT][D / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < D / 8; ++j) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.0f;
  float m_r[MT][2], l_r[MT][2];  // rows g, g + 8 of each m-tile (m in the log2 domain)
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m_r[mt][0] = m_r[mt][1] = -INFINITY, l_r[mt][0] = l_r[mt][1] = 0.0f;
  const float c = a.scale_log2;
  if constexpr (kState) {
    if (a.state_in) {  // resume a previous chunk's state (layout at the top of the file)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int64_t row = q0 + (warp * MT + mt) * 16 + g + 8 * r;
          if (row >= a.Mq) continue;
          const float* st = a.state + (row * gridDim.y + h) * (D + kAttentionStateExtra);
          m_r[mt][r] = st[D];
          l_r[mt][r] = st[D + 1 + t];
#pragma unroll
          for (int j = 0; j < D / 8; ++j) {
            const float2 x = *reinterpret_cast<const float2*>(st + 8 * j + 2 * t);
            acc[mt][j][2 * r] = x.x;
            acc[mt][j][2 * r + 1] = x.y;
          }
        }
      }
    }
  }

  int buf = 0;
  for (int64_t b = 0; b < a.Mk; buf ^= 1) {
    const int64_t e = block_end(b);
    const int nk = static_cast<int>(e - b);
    if (e < a.Mk) {
      load_tile<D, kBc, NW>(Ks + (buf ^ 1) * kBc * D, kh, a.sk, e, a.Mk);
      load_tile<D, kBc, NW>(Vs + (buf ^ 1) * kBc * D, vh, a.sv, e, a.Mk);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if constexpr (kQInRegs) {
      if (b == 0) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qf[kk], Qs + qoff[kk]);
      }
    }
    const uint16_t* Kb = Ks + buf * kBc * D;
    const uint16_t* Vb = Vs + buf * kBc * D;

    // S = Q K^T (raw dot products) for this warp's 16 MT rows x 64 keys. The fp32
    // accumulation order of s[mt][j] is kk = 0, 1, ..., D/16 - 1 for every variant.
    float s[MT][kBc / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < kBc / 8; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk += 2) {
      uint32_t qa[MT][2][4];
      if constexpr (!kQInRegs) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          ldmatrix_x4(qa[mt][0], Qs + mt * 16 * D + qoff[kk]);
          ldmatrix_x4(qa[mt][1], Qs + mt * 16 * D + qoff[kk + 1]);
        }
      }
#pragma unroll
      for (int j = 0; j < kBc / 8; ++j) {
        uint32_t kf[4];
        ldmatrix_x4(kf, Kb + j * 8 * D + koff[kk / 2]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (kQInRegs) {
            mma_bf16(s[mt][j], qf[kk], kf[0], kf[1]);
            mma_bf16(s[mt][j], qf[kk + 1], kf[2], kf[3]);
          } else {
            mma_bf16(s[mt][j], qa[mt][0], kf[0], kf[1]);
            mma_bf16(s[mt][j], qa[mt][1], kf[2], kf[3]);
          }
        }
      }
    }
    if (nk < kBc) {  // a short block (end of a kv_tile or of the keys): mask the rest
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < kBc / 8; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i)
            if (8 * j + 2 * t + (i & 1) >= nk) s[mt][j][i] = -INFINITY;
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < kBc / 8; ++j) {
        mx[0] = fmaxf(mx[0], fmaxf(s[mt][j][0], s[mt][j][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[mt][j][2], s[mt][j][3]));
      }
      float alpha[2], m_use[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float m_new = fmaxf(m_r[mt][r], mx[r] * c);
        alpha[r] = m_r[mt][r] == -INFINITY ? 0.0f : exp2f(m_r[mt][r] - m_new);
        m_use[r] = m_new == -INFINITY ? 0.0f : -m_new;
        m_r[mt][r] = m_new;
      }
      float psum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < kBc / 8; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float p = exp2f(fmaf(s[mt][j][i], c, m_use[i / 2]));
          s[mt][j][i] = p;
          psum[i / 2] += p;
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) l_r[mt][r] = l_r[mt][r] * alpha[r] + psum[r];
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        acc[mt][j][0] *= alpha[0];
        acc[mt][j][1] *= alpha[0];
        acc[mt][j][2] *= alpha[1];
        acc[mt][j][3] *= alpha[1];
      }
    }
    // acc += bf16(P) V: the S accumulators of key tiles 2kk, 2kk+1 are the A fragment.
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      uint32_t pf[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        pf[mt][0] = pack_bf16x2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pf[mt][1] = pack_bf16x2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pf[mt][2] = pack_bf16x2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pf[mt][3] = pack_bf16x2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int j = 0; j < D / 8; j += 2) {
        uint32_t vf[4];
        ldmatrix_x4_trans(vf, Vb + kk * 16 * D + voff[j / 2]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_bf16(acc[mt][j], pf[mt], vf[0], vf[1]);
          mma_bf16(acc[mt][j + 1], pf[mt], vf[2], vf[3]);
        }
      }
    }
    __syncthreads();  // everyone is done with this buffer before it is refilled
    b = e;
  }

  if constexpr (kState) {
    if (!a.finalize) {  // a non-final chunk: save the state, leave o untouched
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int64_t row = q0 + (warp * MT + mt) * 16 + g + 8 * r;
          if (row >= a.Mq) continue;
          float* st = a.state + (row * gridDim.y + h) * (D + kAttentionStateExtra);
          if (t == 0) st[D] = m_r[mt][r];
          st[D + 1 + t] = l_r[mt][r];
#pragma unroll
          for (int j = 0; j < D / 8; ++j)
            *reinterpret_cast<float2*>(st + 8 * j + 2 * t) = make_float2(acc[mt][j][2 * r], acc[mt][j][2 * r + 1]);
        }
      }
      return;  // uniform over the CTA (a.finalize), so no shuffle below is left half-joined
    }
  }

  // l over the quad, then out = bf16(acc / l).
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = l_r[mt][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int64_t row = q0 + (warp * MT + mt) * 16 + g + 8 * r;
      if (row >= a.Mq) continue;
      uint16_t* orow = a.o + row * a.so + h * a.ho;
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        const uint32_t v = pack_bf16x2(acc[mt][j][2 * r] / l, acc[mt][j][2 * r + 1] / l);
        *reinterpret_cast<uint32_t*>(orow + 8 * j + 2 * t) = v;
      }
    }
  }
}

template <int D, int NW, int MT, bool kState>
Status launch(CudaContext& ctx, const AttnArgs& a, int H) {
  constexpr int kBr = 16 * NW * MT;
  const size_t smem = static_cast<size_t>(kBr + 4 * kBc) * D * sizeof(uint16_t);
  // The shared-memory opt-in is a per-device attribute of this instantiation.
  static std::atomic<bool> configured[kMaxDevices] = {};
  LS_CHECK(ctx.device >= 0 && ctx.device < kMaxDevices);
  if (!configured[ctx.device].load(std::memory_order_acquire)) {
    LS_CUDA_CHECK(cudaFuncSetAttribute(attention_bf16<D, NW, MT, kState>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
    configured[ctx.device].store(true, std::memory_order_release);
  }
  dim3 grid(static_cast<unsigned>(div_up(a.Mq, kBr)), static_cast<unsigned>(H));
  attention_bf16<D, NW, MT, kState><<<grid, NW * 32, smem, ctx.stream>>>(a);
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

// Kernel variant (speed only; every variant gives the same bits, tested; it is a
// Numerics field because that is not guaranteed by construction):
// Numerics::native_variant = "4x1" (4 warps x 1 m-tile), "8x1", or "4x2" (4 warps x 2
// m-tiles), of the backend's resolved numerics, so tests compare variants in one process
// by set_numerics between calls.
template <int D, bool kState>
Status launch_variant(CudaContext& ctx, const AttnArgs& a, int H) {
  const std::string& v = ctx.numerics.native_variant.empty() ? std::string(kDefaultVariant) : ctx.numerics.native_variant;
  if (v == "8x1") return launch<D, 8, 1, kState>(ctx, a, H);
  if (v == "4x2") return launch<D, 4, 2, kState>(ctx, a, H);
  return launch<D, 4, 1, kState>(ctx, a, H);
}
template <int D>
Status launch_variant(CudaContext& ctx, const AttnArgs& a, int H) {
  return a.state ? launch_variant<D, true>(ctx, a, H) : launch_variant<D, false>(ctx, a, H);
}

// invalid_argument unless p's streamed-key settings fit a chunk of Mk keys for the
// queries [Mq, H, Dh] (the same rules and messages as the CPU reference).
Status check_state(const AttentionParams& p, int64_t Mq, int64_t Mk, int64_t H, int64_t Dh) {
  LS_TRY(check_attention_state(p, Mq, Mk, H, Dh));
  if (!p.state.empty() && p.state.device.kind != DeviceKind::cuda)
    return make_error(ErrorCode::invalid_argument,
                      "attention: the state lives on " + p.state.device.str() + "; it must be in device memory");
  return Status();
}

}  // namespace

Status cuda_op_attention(CudaContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& out, const AttentionParams& p) {
  LS_CHECK_MSG(q.ndim == 3 && k.ndim == 3 && v.ndim == 3 && out.ndim == 3 && k.shape[0] == v.shape[0] &&
                   q.shape[1] == k.shape[1] && q.shape[1] == v.shape[1] && q.shape[1] == out.shape[1] &&
                   q.shape[2] == k.shape[2] && q.shape[2] == v.shape[2] && q.shape[2] == out.shape[2] &&
                   q.shape[0] == out.shape[0] && q.inner_contiguous() && k.inner_contiguous() &&
                   v.inner_contiguous() && out.inner_contiguous() && p.kv_tile > 0,
               "attention: q " + q.shape_str() + " k " + k.shape_str() + " v " + v.shape_str() + " out " +
                   out.shape_str());
  LS_TRY(check_state(p, q.shape[0], k.shape[0], q.shape[1], q.shape[2]));
  // ---- hook: cuDNN attention path (attention_cudnn.cu), the resolved default where the
  // build has cuDNN (numerics.attention native selects the kernel below). Calls with
  // a state go to the selected path too: the cuDNN path carries its own fp32 state
  // (docs/cuda.md), so streamed keys (K/V offload) give the bytes of that path's one
  // call, and the selection never changes between the chunks of one query slice. ----
  if (attention_cudnn_selected(ctx)) return attention_cudnn(ctx, q, k, v, out, p);
  // ---- hook: the Hopper kernel (attention_hopper.cu), selected only by numerics attention
  // hopper; calls with a state go there too (its state layout is this kernel's). ----
  if (ctx.numerics.attention == AttentionAlgorithm::hopper) return attention_hopper(ctx, q, k, v, out, p);
  if (q.dtype != DType::bf16 || k.dtype != DType::bf16 || v.dtype != DType::bf16 || out.dtype != DType::bf16)
    return unsupported("attention", "needs bf16 q, k, v, out");
  const int64_t Dh = q.shape[2];
  if (Dh != 32 && Dh != 64 && Dh != 128)
    return unsupported("attention", "head_dim " + std::to_string(Dh) + " (supported: 32, 64, 128)");
  bool aligned = true;
  for (const TensorView* t : {&q, &k, &v, &out})
    aligned = aligned && aligned16(t->data) && t->stride[0] % 8 == 0 && t->stride[1] % 8 == 0;
  if (!aligned)
    return unsupported("attention", "q, k, v, out need 16-byte aligned rows and heads (strides multiple of 8)");
  if (q.shape[0] == 0) return Status();
  if (k.shape[0] == 0) return unsupported("attention", "no keys");
  if (q.shape[1] > 65535) return unsupported("attention", "more than 65535 heads");
  AttnArgs a{};
  a.q = q.ptr<const uint16_t>();
  a.k = k.ptr<const uint16_t>();
  a.v = v.ptr<const uint16_t>();
  a.sq = q.stride[0];
  a.hq = q.stride[1];
  a.sk = k.stride[0];
  a.hk = k.stride[1];
  a.sv = v.stride[0];
  a.hv = v.stride[1];
  LS_TRY(fill_attention_args("attention", q, k, out, p, a));
  const int H = static_cast<int>(q.shape[1]);
  switch (Dh) {
    case 32: return launch_variant<32>(ctx, a, H);
    case 64: return launch_variant<64>(ctx, a, H);
    default: return launch_variant<128>(ctx, a, H);
  }
}

}  // namespace ls::cuda
