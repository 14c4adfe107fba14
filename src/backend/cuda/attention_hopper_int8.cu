// The Hopper INT8 attention kernel (issue 26): sm_90a, wgmma with 8-bit operands at twice
// the bf16 rate, TMA loads, warp specialisation, adapted from the bf16 kernel
// (attention_hopper.cu: CTA shape, producer / consumer split, ping-pong, streamed state).
// The arithmetic is docs/int8-attention.md §4 (contract v4) EXACTLY (kv_tile 128): the bytes equal the CPU
// reference's and the portable kernel's (tests/cuda/test_attention_int8_cuda.cpp, memcmp), so
// the CUDA backend dispatches attention int8 here on sm_90 (int8_hopper_fits) and to the
// portable kernel elsewhere without a numerics field to tell them apart.
//
// Calls whose keys start off the 128-key grid (k0 % 128 != 0: a key range of a prepared
// sequence, never a streamed chunk) go to the portable kernel (int8_hopper_fits).
// Inputs: bf16 q; the contract's Int8Keys as they are (k8 s8 [n, H, 128], sk f32 [n, H],
// v8t s8 [H, 128, ld] keys contiguous, the V-scale table vs f32 [NB, 2, H, 128] of the
// sequence and k0, the absolute index of the call's first key). No scratch; in a streamed
// sequence out also holds the q8 cache between calls (below).
//
// Persistent (session 14): one CTA per SM walks the (query tile, head) items in order; the
// roles below run on from one item into the next. One item = 128 queries x 1 head, 384 threads:
//   warpgroup 0, producer (setmaxnreg 24): thread 0 issues the TMA loads, per 128-key block
//     K8 (16 KiB) + the block's key scales (a box of 4 heads x 128 keys of sk [n, H], 2 KiB:
//     needs H % 4 == 0) on one barrier, V8^T (16 KiB) on another, into a ring of kStages;
//     warps 1-3 permute each V^T stage in place once it lands: within every 16-byte chunk
//     (16 consecutive keys of one channel) stored position p takes key 2 (p / 4) + (p % 2) +
//     8 ((p % 4) / 2) (4 byte permutes per chunk), so that each lane's Q K^T accumulators are
//     already its u8 A fragment of P V (no shuffles), then fence.proxy.async and arrive on a
//     third barrier.
//   warpgroups 1, 2, consumers (setmaxnreg 240), 64 queries each: first they load their
//     streamed state (if any) and quantise their Q rows (§4.1, int8_quant_warp.cuh: one warp
//     per row, lane l channels 4l..4l+3, the rotation's strides 1, 2 in registers and 4..64 by
//     shuffles, the CPU's adds in the CPU's stage order) into shared memory in the 128-byte
//     swizzled layout wgmma reads; then per block, ping-pong:
//       d   = q8 k8^T                 wgmma m64n128k32 s8 x s8 -> s32 (exact)
//       mu  = max_j fl32(sk_j float(d)) (§4.2): contract v4's key groups (16 keys of the
//             128-key tile with one j % 8, one scale sk_g) are a thread's keys 8i + 2t + e:
//             an integer max of d per group, u = fl32(sk_g float(dmax)), fmaxf; masked keys
//             of a partial last tile out; sT = fl32(a_i mu);
//       m'  = max(m, sT); alpha = exp2e(fl32(m - m')) (0 when m = -inf); beta = exp2e(fl32(sT - m'))
//       p8  = p8 of x = fmaf(fl32(a_i sk_g), float(d), fl32(kP8Top - sT)) (contract v4; per
//             score I2F, FFMA, then the byte): the low byte of fl32(ex2.approx(x) + 2^23)
//             (kTable false: the device check found ex2 = the table) or the fast byte
//             corrected by the table (kTable true); masked keys 0 (int8_p8_check.cuh); a row
//             with |sT| >= 4096 (never in practice) takes v3's x = fmaf(a_i, fl32(u - mu), kP8Top)
//       lt  = sum p8 (one dp4a per packed word of 4 P bytes; P packed at the end of the softmax)
//       ot  = p8 v8                   wgmma m64n128k32 u8 x s8 -> s32 (exact; |ot| < 2^22)
//       l   = fmaf(float(lt), beta, fl32(l alpha)); acc = fmaf(float(ot), beta, fl32(acc alpha))
//             (one block later in the pipeline: block j - 1's P V is issued before block j's
//             Q K^T, and its acc FFMAs run inside block j's p8 loop, in the issue slots the
//             MUFU.EX2 leaves; the alpha product skipped where every alpha of the warp is 1:
//             fl32(y 1) = y; one exp2e per row and block, the other of alpha, beta being 1).
//             The masking of a partial tile is compiled into the last block's softmax only.
//       contract v3: acc is in units of the current statistics block's V scale sv_b (v8 of
//             block b's keys is quant(v, sv_b)); before the fold of a block whose absolute
//             first key is a multiple of 4096 (> 0), starting statistics block b, acc =
//             fl32(acc rho_b) (rho_b = fl32(sv_{b-1} / sv_b), from vs). It runs right after
//             the previous block's fold (or after the state's load, for the item's first
//             block); a warp-uniform test on the block index, rho by 16 float2 loads only
//             there (one block in 32). l and m are free of V's scale: never rescaled.
//     out = bf16(fl32(fl32(acc sv) / l)) with sv of the last key's block, or the state (acc,
//     m, l) for the next chunk (acc in the units of its last block: the next call of the
//     sequence goes on from there).
//
// Invariance: a query's bits depend on its row and the keys alone (row-local quantisation,
// per-row state, every fold per 128-key tile), so query slicings give one call's bytes, and
// streamed chunks (multiples of 128 keys) carrying the state (f32 [Mq, H, 136], the CPU
// reference's layout: acc in channel order, [128] m, [129] l) give one call's bytes.
//
// Speed (H200, S = 111,274, 56 x 128, bf16 FLOP count; bench/results/issue26/): v1 (run 5) 346
// TOP/s, ~24.9 issued instructions per score; v2 as first written (run 7) 488; this kernel
// (run 8, helper opt's variant 15: the hoisted mask, P V before Q K^T, I2F for d and ot)
// 586, ~11.8 SASS instructions per score in the main loop by nvdisasm (run 7's loop 20.1 by
// the same count), 24 B of spill loads; the bf16 Hopper kernel 621 in the same run. Session
// 14 (run 12): 590 (the persistent launch), and the cost per streamed chunk call from ~0.4 to
// 0.15 ms (the quantiser without branching divisions, the q8 cache). Contract v4 (session 16,
// run 14): 621. Session 17 (run 15, side by side): 618 -> 668, the same bytes: the fold's
// FFMAs inside the next block's p8 loop (640 alone) and one exp2e per row and block. Session
// 18 (run 16): 669 -> 724, the same bytes: exp2e_nb (no branch in the per-row head; 706 alone)
// and P packed in the p8 loop's basic block (693 alone). Session 19 (run 17): 725 -> 727, the
// Q descriptors no longer spilled; what else was measured and not kept: docs §7a.
#include "backend/cuda/attention_hopper_int8.cuh"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <string>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/hopper_pipeline.cuh"
#include "backend/cuda/int8_p8_check.cuh"
#include "backend/cuda/int8_quant_warp.cuh"
#include "backend/int8_attention_math.h"

namespace ls::cuda {
namespace {

constexpr int kD = 128;        // head dim
constexpr int kBr = 128;       // queries per CTA
constexpr int kN = 128;        // keys per block = kv_tile
constexpr int kThreads = 384;  // producer + 2 consumer warpgroups
constexpr int kStages = 3;
constexpr int kStateRow = kD + static_cast<int>(kAttentionStateExtra);
constexpr int kQBytes = kBr * kD;  // q8 tile, 16 KiB
constexpr int kKBytes = kN * kD;   // k8 block, 16 KiB
constexpr int kVBytes = kD * kN;   // v8^T block (128 channels x 128 keys), 16 KiB
constexpr int kSkBytes = kN * 4 * 4;  // key scales: 128 keys x 4 heads
constexpr int kPermuteThreads = 96;   // producer warps 1-3
constexpr int kStatBlock = static_cast<int>(kInt8StatBlock);  // keys per statistics block (4096)
static_assert(kStatBlock % kN == 0 && (kStatBlock & (kStatBlock - 1)) == 0,
              "128-key blocks never straddle a statistics block; the block test is a mask");
constexpr int smem_bytes() { return kQBytes + kStages * (kKBytes + kVBytes + kSkBytes) + kBr * 4 + 256 + 1024; }

struct Args {
  const uint16_t* q;
  int64_t q_rs, q_hs;
  const float* sv;  // sv [H, 128] of the block of the call's last key (the output's units)
  const float* vs;  // the V-scale table f32 [NB, 2, H, 128]: rho_b at vs + (2 b + 1) H 128
  int64_t kb0;      // the statistics block of the call's first key, k0 / 4096
  int k0r;          // k0 % 4096: block j of the call starts key 4096 kb0 + k0r + 128 j
  uint16_t* o;
  int64_t o_rs, o_hs;
  int64_t Mq, Mk;
  float cs;  // i8a::score_factor(scale, 128)
  float* state;
  bool state_in, finalize;
  bool q8_cache;  // streamed state and out not overlapping q: the q8 cache below may be used
  int H, q_tiles, items;  // items = q_tiles * H (query tile fastest), taken in order by the grid
};

// The q8 cache of a streamed call sequence (docs/int8-attention.md §7a). A query row's q8 and
// sq depend on its q row alone, and every call of a sequence has the same q; out is written
// only by the final call. So a call that saves the state (not final) also leaves each row's
// q8 (128 bytes) and sq (4 bytes) in that row's out (256 bytes, bf16 [row, h, 0..128)) and
// marks the row's state with kQ8CachedBits in its first unused float ([Dh + 2]); the next call
// of the sequence (state_in) takes q8 and sq from there instead of quantising its Q rows
// again: the same bytes, ~7 us of each item's prologue saved (run 12 call 4's trace). A
// state written by the portable kernel carries 0 there, a first call (no state_in) never
// looks, so a stale mark of an earlier sequence in the same buffer is never trusted.
constexpr uint32_t kQ8CachedBits = 0x7fc0a8c8u;  // a quiet NaN pattern no m, l or acc takes here

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LS_HOPPER8_DEVICE 1
#endif

#ifdef LS_HOPPER8_DEVICE
// The pipeline primitives: hopper_pipeline.cuh (shared with the bf16 kernel).
using namespace hopper;  // NOLINT: the primitives by their plain names
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// K-major 128-byte-swizzled tiles: 8-row groups 1024 bytes apart; a k-step of 32 bytes lies
// inside one swizzled row (the leading offset unused).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) { return hopper::smem_desc(addr, 16, 1024); }
// d (+)= A B, m64n128k32, s8 A and B from shared memory (both K-major, 128-byte swizzle), s32.
__device__ __forceinline__ void wgmma_s8_ss(int32_t (&d)[64], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
      : "l"(da), "l"(db), "r"(scale_d));
}
// d (+)= A B, m64n128k32, u8 A (P) from registers (m16n8k32 A-fragment layout per warp), s8 B (V
// transposed: keys contiguous, K-major, 128-byte swizzle) from shared memory, s32.
__device__ __forceinline__ void wgmma_u8s8_rs(int32_t (&d)[64], const uint32_t (&a)[4], uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.u8.s8 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}
__device__ __forceinline__ void wg_sync(int cw) { asm volatile("bar.sync %0, 128;\n" ::"r"(3 + cw) : "memory"); }

// §4.1 for the 64 rows of consumer warpgroup cw: one warp per row (16 rows per warp), q8
// into the Q tile (128-byte swizzle: chunk c of row R at (c ^ (R % 8)) * 16), sq into sSq.
// From the q8 cache where every row of the warp has it (a warp-uniform choice), else
// quantised, and saved into the cache where this call saves the state.
__device__ __forceinline__ void quantise_q(const Args& a, uint32_t sQ, float* sSq, int q0, int h, int cw) {
  const int tid = static_cast<int>(threadIdx.x) % 128;
  const int warp = tid / 32, lane = tid % 32;
  const int64_t row0 = static_cast<int64_t>(q0) + 64 * cw + 16 * warp;
  const auto q_slot = [&](int r) {  // this lane's 4 bytes of the warp's row r in the swizzled Q tile
    const int R = 64 * cw + 16 * warp + r;
    return sQ + static_cast<uint32_t>(R * 128 + ((((lane >> 2) ^ (R & 7))) << 4) + (lane & 3) * 4);
  };
  const auto cache_of = [&](int64_t row) {  // the row's 256 out bytes: q8 [0, 128), sq [128, 132)
    return reinterpret_cast<uint8_t*>(a.o + row * a.o_rs + h * a.o_hs);
  };
  if (a.q8_cache && a.state_in) {
    const int64_t row = row0 + (lane & 15);
    const bool ok = row >= a.Mq || __float_as_uint(a.state[(row * a.H + h) * kStateRow + kD + 2]) == kQ8CachedBits;
    if (__all_sync(0xffffffffu, ok)) {
      uint32_t w[16];
#pragma unroll
      for (int r = 0; r < 16; ++r)  // a row past Mq: zeros and kTiny, as quantising its zero row gives
        w[r] = row0 + r < a.Mq ? reinterpret_cast<const uint32_t*>(cache_of(row0 + r))[lane] : 0u;
      const float sq = row < a.Mq ? *reinterpret_cast<const float*>(cache_of(row) + 128) : i8a::kTiny;
#pragma unroll
      for (int r = 0; r < 16; ++r) asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(q_slot(r)), "r"(w[r]) : "memory");
      if (lane < 16) sSq[64 * cw + 16 * warp + lane] = sq;
      return;
    }
  }
  const bool save = a.q8_cache && !a.finalize;
  // All 16 rows' loads first, then the 16 rows' arithmetic unrolled: one global-memory
  // latency per warp instead of one per row before the CTA's first Q K^T (run 11: S = 111,274
  // 586 -> 591 TOP/s; the fixed cost per call of streamed key chunks, ~0.4 ms, barely moved).
  uint2 raw[16];
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    const int64_t row = row0 + r;
    raw[r] = row < a.Mq ? *reinterpret_cast<const uint2*>(a.q + row * a.q_rs + h * a.q_hs + 4 * lane) : make_uint2(0u, 0u);
  }
  uint32_t q8w[16];  // this lane's q8 word and the scale of each row, for the cache
  float sq[16];
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    const int R = 64 * cw + 16 * warp + r;
    float x[4];  // bf16 widened exactly; a row past Mq is zeros (its output is never written)
    x[0] = __uint_as_float((raw[r].x & 0xFFFFu) << 16);
    x[1] = __uint_as_float(raw[r].x & 0xFFFF0000u);
    x[2] = __uint_as_float((raw[r].y & 0xFFFFu) << 16);
    x[3] = __uint_as_float(raw[r].y & 0xFFFF0000u);
    i8w::rotate_warp(x, lane);
    uint32_t packed;
    const float s = i8w::quant_row_warp(x, &packed);
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(q_slot(r)), "r"(packed) : "memory");
    if (lane == 0) sSq[R] = s;
    q8w[r] = packed;
    sq[r] = s;
  }
  if (save) {  // after the rows: a store's branch inside the loop would split it into blocks
#pragma unroll
    for (int r = 0; r < 16; ++r)
      if (row0 + r < a.Mq) {
        reinterpret_cast<uint32_t*>(cache_of(row0 + r))[lane] = q8w[r];
        if (lane == 0) *reinterpret_cast<float*>(cache_of(row0 + r) + 128) = sq[r];
      }
  }
}

template <bool kTable>
__global__ void __launch_bounds__(kThreads, 1)
    int8_attention_kernel(const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv,
                          const __grid_constant__ CUtensorMap ts, const Args a) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t sQ = base;
  const uint32_t sK = sQ + kQBytes;             // [kStages][128 keys][128]
  const uint32_t sV = sK + kStages * kKBytes;   // [kStages][128 channels][128 keys]
  const uint32_t sS = sV + kStages * kVBytes;   // [kStages][128 keys][4 heads] f32
  const uint32_t sSqa = sS + kStages * kSkBytes;  // [128] f32
  float* sSq = reinterpret_cast<float*>(smem_raw + (sSqa - raw));
  const uint32_t bars = sSqa + kBr * 4;
  const auto k_full = [&](int s) { return bars + 8u * static_cast<uint32_t>(s); };
  const auto v_full = [&](int s) { return bars + 8u * static_cast<uint32_t>(kStages + s); };
  const auto v_ready = [&](int s) { return bars + 8u * static_cast<uint32_t>(2 * kStages + s); };
  const auto k_empty = [&](int s) { return bars + 8u * static_cast<uint32_t>(3 * kStages + s); };
  const auto v_empty = [&](int s) { return bars + 8u * static_cast<uint32_t>(4 * kStages + s); };
  const int wg = static_cast<int>(threadIdx.x) / 128;
  const int nblocks = static_cast<int>((a.Mk + kN - 1) / kN);
  // Items (query tile, head) = (item % q_tiles, item / q_tiles): this CTA takes blockIdx.x,
  // blockIdx.x + gridDim.x, ... Every role walks the same items, and the ring's blocks are
  // counted across them (g = the CTA's block count so far): stage g % kStages, phase
  // (g / kStages) & 1.
  const auto item_head = [&](int item) { return item / a.q_tiles; };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(k_full(s), 1);
      mbar_init(v_full(s), 1);
      mbar_init(v_ready(s), kPermuteThreads);
      mbar_init(k_empty(s), 8);
      mbar_init(v_empty(s), 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    fence_async_smem();
  }
  __syncthreads();

  if (wg == 0) {  // ---- producer ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (threadIdx.x == 0) {
      uint32_t g = 0;
      for (int item = static_cast<int>(blockIdx.x); item < a.items; item += static_cast<int>(gridDim.x)) {
        const int h = item_head(item);
        for (int j = 0; j < nblocks; ++j, ++g) {
          const int s = static_cast<int>(g % kStages);
          const uint32_t round = g / kStages;
          if (round > 0) mbar_wait(k_empty(s), (round - 1) & 1u);
          mbar_expect_tx(k_full(s), kKBytes + kSkBytes);
          tma_load_3d(sK + s * kKBytes, &tk, 0, h, kN * j, k_full(s));
          tma_load_2d(sS + s * kSkBytes, &ts, h & ~3, kN * j, k_full(s));
          if (round > 0) mbar_wait(v_empty(s), (round - 1) & 1u);
          mbar_expect_tx(v_full(s), kVBytes);
          tma_load_3d(sV + s * kVBytes, &tv, kN * j, 0, h, v_full(s));
        }
      }
    } else if (threadIdx.x >= 32) {
      const int pt = static_cast<int>(threadIdx.x) - 32;
      const uint32_t total = static_cast<uint32_t>(nblocks) *
                             static_cast<uint32_t>((a.items - static_cast<int>(blockIdx.x) + static_cast<int>(gridDim.x) - 1) /
                                                   static_cast<int>(gridDim.x));
      for (uint32_t g = 0; g < total; ++g) {
        const int s = static_cast<int>(g % kStages);
        mbar_wait(v_full(s), (g / kStages) & 1u);
        const uint32_t vb = sV + static_cast<uint32_t>(s * kVBytes);
        for (int i = pt; i < kVBytes / 16; i += kPermuteThreads) {
          uint32_t w0, w1, w2, w3;
          asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                       : "=r"(w0), "=r"(w1), "=r"(w2), "=r"(w3)
                       : "r"(vb + 16u * static_cast<uint32_t>(i)));
          asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(vb + 16u * static_cast<uint32_t>(i)),
                       "r"(prmt(w0, w2, 0x5410u)), "r"(prmt(w0, w2, 0x7632u)), "r"(prmt(w1, w3, 0x5410u)),
                       "r"(prmt(w1, w3, 0x7632u))
                       : "memory");
        }
        fence_async_smem();
        mbar_arrive(v_ready(s));
      }
    }
    return;
  }

  // ---- consumers ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  const int cw = wg - 1;
  const int tid = static_cast<int>(threadIdx.x) % 128;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int H = a.H;
  int h = 0;             // the current item's head
  int64_t row_base = 0;  // the current item's rows of this thread: row_base, row_base + 8

  float F[64];     // acc: n8 block j, element i: row g + 8 (i / 2), channel 8j + 2t + (i & 1)
  int32_t I[64];   // this block's integer P V (ot)
  int32_t sc[64];  // scores of the current block, then the bits of fl32(e + 1.5 2^23) (p8 in byte 0)
  float Fl[2], m_r[2], c_r[2];
#pragma unroll
  for (int i = 0; i < 64; ++i) I[i] = 0;

  const auto issue_qk = [&](int s) {
    // This warpgroup's Q tile address read afresh at every issue (a volatile move: never
    // hoisted), so its four descriptors are formed here, not held across the loop as 64-bit
    // values: held, ptxas spilled them (4 LDL.64 + 2 STL.64 per block before the wgmma issue).
    uint32_t q_addr;
    asm volatile("mov.u32 %0, %1;\n" : "=r"(q_addr) : "r"(sQ + static_cast<uint32_t>(cw) * 64u * 128u));
    const uint64_t q_desc = smem_desc(q_addr);
    const uint64_t k_desc = smem_desc(sK + static_cast<uint32_t>(s * kKBytes));
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma_s8_ss(sc, q_desc + static_cast<uint64_t>(2 * kk), k_desc + static_cast<uint64_t>(2 * kk), kk > 0);
  };
  const auto issue_pv = [&](int s, const uint32_t (&p)[4][4]) {
    const uint64_t v_desc = smem_desc(sV + static_cast<uint32_t>(s * kVBytes));
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_u8s8_rs(I, p[kk], v_desc + static_cast<uint64_t>(2 * kk), kk > 0);
  };
  // Contract v4 §4.2-4.4 on block (stage s, nk valid keys; k0 % 128 == 0, int8_hopper_fits,
  // so the block is an absolute 128-key tile). sc[4j + i] is d of row g + 8 (i / 2) and key
  // 8j + 2t + (i & 1): a thread's 16 keys per row and class e = i & 1 are ONE group (residue
  // 2t + e), whose scale every member holds in sk; taken from key 2t + e (2 shared loads per
  // block). The tile max mu = max_j fl32(sk_j float(d_j)) is the max over (row, class) of
  // fl32(sk_g float(dmax)), dmax the INTEGER max of the group's d (fl32(s y) is non-decreasing
  // in y for s > 0: the same bits), then fmaxf over the classes and the quad's shuffles; sT =
  // fl32(a mu), m, alpha, beta (returned for the fold after this block's P V); and sc becomes
  // the p8 words (byte 0 = p8 of x = fmaf(fl32(a sk_g), float(d), fl32(kP8Top - sT))). Per
  // score: IMNMX, I2F, FFMA, MUFU.EX2, FADD and a share of the packing (v3's FMUL and FADD per
  // score are gone; the group's A = fl32(a sk_g) is 4 FMUL per block). float(d) and float(ot)
  // by __int2float_rn (I2FP.F32.S32 on sm_90, exact: |x| < 2^22). Masked keys (a partial last
  // tile, compiled into the last block only): INT_MIN in the integer max, never its result
  // where the class has a valid key (its first key, 2t + e, is this thread's own); a class
  // with no valid key gives -inf (its scale is TMA's zero fill: u would be -0); p8 0.
  // The one-FFMA form holds for a row whose |sT| < 4096 (i8a::score_fma_form; docs §4.4: there
  // x < log2(255.5), so the fast byte is right, and the maximum's p8 is 255); a row with a
  // larger |sT| (never in a model's attention) takes v3's x = fmaf(a, fl32(fl32(sk_g float(d))
  // - mu), kP8Top), as the CPU. Tested once per block, warp-uniform: the one-FFMA loop where
  // every row of the warp has the v4 form, else a loop choosing the form per row.
  // The fold's FFMA of one accumulator: acc = fmaf(float(ot), beta, acc), acc already
  // fl32(acc alpha) (fold_pre below); in the next block's p8 loop, or in fold.
  const auto fold_acc = [](float& acc, int32_t ot, float be) { acc = __fmaf_rn(__int2float_rn(ot), be, acc); };
  // P's u8 A fragments: lane t's keys 2t, 2t + 1, 8 + 2t, 9 + 2t of each 16 are what its
  // fragment holds there, given V^T's keys permuted within each 16 by the producer. The low
  // bytes of 4 words by 3 PRMT; lt (this thread's p8 sum per row) by one dp4a per word. Run
  // at the end of the softmax, in the p8 loop's basic block, so that the PRMT and dp4a fill
  // the issue slots the loop's MUFU.EX2 leaves (session 18, run 16: with exp2e_nb 669 -> 724
  // TOP/s; before, they ran as a burst on the ALU pipe before the next wgmma issue).
  uint32_t p[4][4];
  int lt[2];
  const auto pack_p = [&] {  // into p, lt
    lt[0] = 0;
    lt[1] = 0;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int jl = 4 * kk + 2 * half, jh = jl + 1;
        p[kk][2 * half] = p8dev::pack_p8(sc[4 * jl], sc[4 * jl + 1], sc[4 * jh], sc[4 * jh + 1]);
        p[kk][2 * half + 1] = p8dev::pack_p8(sc[4 * jl + 2], sc[4 * jl + 3], sc[4 * jh + 2], sc[4 * jh + 3]);
        lt[0] = static_cast<int>(__dp4a(p[kk][2 * half], 0x01010101u, static_cast<unsigned>(lt[0])));
        lt[1] = static_cast<int>(__dp4a(p[kk][2 * half + 1], 0x01010101u, static_cast<unsigned>(lt[1])));
      }
  };
  const auto softmax = [&](auto masked, auto fuse_c, int s, int nk, float (&alpha)[2], float (&beta)[2]) {
    constexpr bool kMask = decltype(masked)::value;  // a partial tile: the last block only
    constexpr bool kFuse = decltype(fuse_c)::value;  // the previous block's fold (acc only) inside the p8 loop
    const float be_old[2] = {beta[0], beta[1]};
    const uint32_t sk_base = sS + static_cast<uint32_t>(s * kSkBytes + 4 * (h & 3));
    float skg[2];  // the scales of this thread's groups: keys 2t, 2t + 1 (16 bytes per key)
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(skg[0]) : "r"(sk_base + static_cast<uint32_t>(16 * (2 * t))));
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(skg[1]) : "r"(sk_base + static_cast<uint32_t>(16 * (2 * t + 1))));
    // dm[r][q]: 4 independent chains per row (q = class e + 2 (j % 2)), merged below.
    int dm[2][4];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int q = 0; q < 4; ++q) dm[r][q] = INT_MIN;
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int d = kMask && 8 * j + 2 * t + (i & 1) >= nk ? INT_MIN : sc[4 * j + i];
        dm[i / 2][(i & 1) + 2 * (j & 1)] = max(dm[i / 2][(i & 1) + 2 * (j & 1)], d);
      }
    float mu[2], bT[2], A[2][2];
    bool v4f[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int dmax = max(dm[r][e], dm[r][e + 2]);
        const float u = !kMask || 2 * t + e < nk ? __fmul_rn(skg[e], __int2float_rn(dmax)) : -INFINITY;
        mx = fmaxf(mx, u);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mu[r] = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float sT = __fmul_rn(c_r[r], mu[r]);  // the tile's largest score (log2 units)
      const float m_new = fmaxf(m_r[r], sT);
      // One exp2e per row (i8a::fold_factors; session 17: part of 618 -> 668 TOP/s, run 15),
      // without a branch (exp2e_nb, session 18), so the two rows' chains overlap.
      i8a::fold_factors(m_r[r], sT, alpha[r], beta[r]);
      m_r[r] = m_new;
      bT[r] = __fsub_rn(i8a::kP8Top, sT);
      v4f[r] = i8a::score_fma_form(sT);
#pragma unroll
      for (int e = 0; e < 2; ++e) A[r][e] = __fmul_rn(c_r[r], skg[e]);
    }
    // x of score k (row (k % 4) / 2, group k & 1); kMixed: the row's form (v3's where |sT| >= 4096).
    const auto x_of = [&](auto mixed_c, int k) {
      constexpr bool kMixed = decltype(mixed_c)::value;
      const int r = (k % 4) / 2, e = k & 1;
      const float df = __int2float_rn(sc[k]);
      if (!kMixed || v4f[r]) return __fmaf_rn(A[r][e], df, bT[r]);
      return __fmaf_rn(c_r[r], __fsub_rn(__fmul_rn(skg[e], df), mu[r]), i8a::kP8Top);
    };
    const auto p8_all = [&](auto mixed_c) {
      if constexpr (kTable) {  // every x first (A, b dead before the table's branches), then p8
#pragma unroll
        for (int k = 0; k < 64; ++k) {
          sc[k] = __float_as_int(x_of(mixed_c, k));
          if constexpr (kFuse) fold_acc(F[k], I[k], be_old[(k / 2) % 2]);
        }
#pragma unroll
        for (int k = 0; k < 64; ++k) sc[k] = static_cast<int32_t>(p8dev::p8_word<true>(__int_as_float(sc[k])));
      } else {
#pragma unroll
        for (int k = 0; k < 64; ++k) {
          sc[k] = static_cast<int32_t>(p8dev::p8_word<false>(x_of(mixed_c, k)));
          if constexpr (kFuse) fold_acc(F[k], I[k], be_old[(k / 2) % 2]);
        }
      }
      if constexpr (!kMask) pack_p();  // P and lt of this block (a masked block: below)
    };
    if (__all_sync(0xffffffffu, v4f[0] && v4f[1])) p8_all(std::false_type{});
    else p8_all(std::true_type{});
    if constexpr (kMask) {  // softmax_block: nk < kN
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          if (8 * j + 2 * t + (i & 1) >= nk) sc[4 * j + i] = 0;
      pack_p();
    }
  };
  // The fold of one block (v2 §4.4): l = fmaf(float(lt), beta, fl32(l alpha)), acc =
  // fmaf(float(ot), beta, fl32(acc alpha)). One of alpha, beta is 1 (m' = max(m, sT)); the
  // common case is alpha = 1 (the tile did not raise the row's maximum), where fl32(acc * 1)
  // = acc, so the multiplication by alpha is skipped where every alpha of the warp is 1.
  // fold_pre does l and the products fl32(acc alpha); the FFMA per accumulator (fold_acc,
  // float(ot) exact: |ot| <= 255 127 128 < 2^22) runs inside the next block's p8 loop
  // (softmax, kFuse), or in fold for the item's last block.
  const auto fold_pre = [&](const float (&al)[2], const float (&be)[2], const int (&lt)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      int x = lt[r];
      x += __shfl_xor_sync(0xffffffffu, x, 1);
      x += __shfl_xor_sync(0xffffffffu, x, 2);
      Fl[r] = __fmaf_rn(__int2float_rn(x), be[r], __fmul_rn(Fl[r], al[r]));
    }
    if (!__all_sync(0xffffffffu, al[0] == 1.0f && al[1] == 1.0f)) {
#pragma unroll
      for (int i = 0; i < 64; ++i) F[i] = __fmul_rn(F[i], al[(i / 2) % 2]);
    }
  };
  const auto fold = [&](const float (&al)[2], const float (&be)[2], const int (&lt)[2]) {
    fold_pre(al, be, lt);
#pragma unroll
    for (int i = 0; i < 64; ++i) fold_acc(F[i], I[i], be[(i / 2) % 2]);
  };
  // Contract v3 (§4.4): before block jn's fold, where block jn starts statistics block b > 0
  // (its absolute first key 4096 kb0 + k0r + 128 jn a multiple of 4096), acc moves from block
  // b - 1's units of V to b's: acc = fl32(acc rho_b), a plain multiply (the CPU's, before
  // its fold). Warp-uniform (jn, the call's k0); rho of this thread's channels 8 jj + 2 t +
  // {0, 1} (both rows) by 16 float2 loads only at a block entry. rel < 2^31: jn < 2^23.
  // Registers: the main loop's peak (sc, I, P and acc live around the wgmma issue) leaves
  // none spare, so nothing of this may stay live across the loop: the uniform parts (kb0,
  // k0r, jn, h) sit in uniform registers, and the thread's channel offset 2 t comes from
  // %laneid read here (a volatile read, not hoisted: a hoisted 64-bit per-thread offset
  // cost 2 more spill loads and a spill store per block, by ptxas and nvdisasm).
  const auto enter_block = [&](int jn) {
    const int rel = a.k0r + kN * jn;
    if ((rel & (kStatBlock - 1)) != 0 || (jn == 0 && a.kb0 == 0)) return;  // not a block start, or key 0
    uint32_t lane_now;
    asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(lane_now));
    const float* rho = a.vs + ((2 * (a.kb0 + rel / kStatBlock) + 1) * H + h) * kD;
    const float2* rho2 = reinterpret_cast<const float2*>(rho) + (lane_now & 3u);  // channels 2 t, 2 t + 1
#pragma unroll
    for (int jj = 0; jj < 16; ++jj) {
      const float2 x = __ldg(rho2 + 4 * jj);
      F[4 * jj + 0] = __fmul_rn(F[4 * jj + 0], x.x);
      F[4 * jj + 1] = __fmul_rn(F[4 * jj + 1], x.y);
      F[4 * jj + 2] = __fmul_rn(F[4 * jj + 2], x.x);
      F[4 * jj + 3] = __fmul_rn(F[4 * jj + 3], x.y);
    }
  };
  const auto release = [&](uint32_t bar) {
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
  };
  const auto softmax_block = [&](auto fuse_c, int s, int64_t b, float (&al)[2], float (&be)[2]) {
    const int nk = static_cast<int>(a.Mk - b < kN ? a.Mk - b : kN);
    if (nk < kN) softmax(std::true_type{}, fuse_c, s, nk, al, be);
    else softmax(std::false_type{}, fuse_c, s, nk, al, be);
  };
  // The turns of the ping-pong run on across items: warpgroup 1's first arrival lets
  // warpgroup 0 take the CTA's first turn, and warpgroup 1's last turn of the last item
  // arrives for nobody.
  const auto stage = [](uint32_t x) { return static_cast<int>(x % kStages); };
  const auto phase = [](uint32_t x) { return (x / kStages) & 1u; };
  if (cw == 1) sched_arrive(1);
  uint32_t gb = 0;  // ring blocks consumed before this item
  for (int item = static_cast<int>(blockIdx.x); item < a.items; item += static_cast<int>(gridDim.x)) {
    h = item_head(item);
    const int q0 = (item % a.q_tiles) * kBr;
    row_base = static_cast<int64_t>(q0) + 64 * cw + 16 * warp + g;
    const bool last_item = item + static_cast<int>(gridDim.x) >= a.items;
    // The streamed state first: its loads are in flight while the Q rows are quantised.
    Fl[0] = Fl[1] = 0.0f;
    m_r[0] = m_r[1] = -INFINITY;
#pragma unroll
    for (int i = 0; i < 64; ++i) F[i] = 0.0f;
    if (a.state && a.state_in) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t row = row_base + 8 * r;
        if (row >= a.Mq) continue;
        const float* st = a.state + (row * H + h) * kStateRow;
        m_r[r] = st[kD];
        Fl[r] = st[kD + 1];
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const float2 x = *reinterpret_cast<const float2*>(st + 8 * j + 2 * t);
          F[4 * j + 2 * r] = x.x;
          F[4 * j + 2 * r + 1] = x.y;
        }
      }
    }
    enter_block(0);  // acc (the state's: its last block's units) into block 0's statistics block
    // This warpgroup's Q rows and sSq entries: its previous item's Q K^T are complete (every
    // thread waited for them before that item's last softmax, and its last turn's bar.sync
    // came after those waits).
    quantise_q(a, sQ, sSq, q0, h, cw);
    fence_async_smem();
    wg_sync(cw);
#pragma unroll
    for (int r = 0; r < 2; ++r) c_r[r] = __fmul_rn(sSq[64 * cw + 16 * warp + g + 8 * r], a.cs);  // a_i (§4.1)

    // Block 0: Q K^T and the softmax.
    mbar_wait(k_full(stage(gb)), phase(gb));
    sched_wait(cw);
    wgmma_fence();
    issue_qk(stage(gb));
    wgmma_commit();
    sched_arrive(cw);
    wgmma_wait<0>();
    fence_regs(sc);
    float alpha[2], beta[2];
    softmax_block(std::false_type{}, stage(gb), 0, alpha, beta);
    release(k_empty(stage(gb)));
    int j = 1;
    for (; j < nblocks; ++j) {
      const uint32_t x = gb + static_cast<uint32_t>(j);
      const int s = stage(x), sp = stage(x - 1);
      const int64_t b = static_cast<int64_t>(kN) * j;
      mbar_wait(k_full(s), phase(x));
      mbar_wait(v_ready(sp), phase(x - 1));  // p, lt: block j - 1's (its softmax packed them)
      fence_regs(I);
      // P V of block j - 1 first, then Q K^T of block j; both complete before block j's
      // softmax, whose p8 loop carries block j - 1's fold of acc: its I2F and FFMA per
      // accumulator fill the issue slots the loop's MUFU.EX2 leaves (the fold used to run
      // alone while Q K^T was on the tensor cores; session 17, run 15: 618 -> 640 TOP/s).
      sched_wait(cw);
      wgmma_fence();
      issue_pv(sp, p);
      wgmma_commit();
      issue_qk(s);
      wgmma_commit();
      sched_arrive(cw);
      wgmma_wait<0>();
      fence_regs(I);
      fence_regs(sc);
      release(v_empty(sp));
      fold_pre(alpha, beta, lt);  // block j - 1: l, and acc * alpha where an alpha is not 1
      softmax_block(std::true_type{}, s, b, alpha, beta);  // + block j - 1's fmaf(float(ot), beta, acc)
      enter_block(j);  // after block j - 1's fold, before block j's (next turn)
      release(k_empty(s));
    }
    {  // the last block's P V
      const uint32_t x = gb + static_cast<uint32_t>(j - 1);
      const int sp = stage(x);
      mbar_wait(v_ready(sp), phase(x));
      sched_wait(cw);
      wgmma_fence();
      issue_pv(sp, p);
      wgmma_commit();
      if (cw == 0 || !last_item) sched_arrive(cw);
      wgmma_wait<0>();
      fence_regs(I);
      release(v_empty(sp));
      fold(alpha, beta, lt);
    }
    gb += static_cast<uint32_t>(nblocks);
    if (a.state && !a.finalize) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t row = row_base + 8 * r;
        if (row >= a.Mq) continue;
        float* st = a.state + (row * H + h) * kStateRow;
        if (t == 0) {
          st[kD] = m_r[r];
          st[kD + 1] = Fl[r];
          if (a.q8_cache) st[kD + 2] = __uint_as_float(kQ8CachedBits);  // quantise_q saved or read it
        }
#pragma unroll
        for (int jj = 0; jj < 16; ++jj)
          *reinterpret_cast<float2*>(st + 8 * jj + 2 * t) = make_float2(F[4 * jj + 2 * r], F[4 * jj + 2 * r + 1]);
      }
      continue;
    }
    // out = bf16(fl32(fl32(acc sv) / l)), sv of the last key's block (acc's units): the
    // division by i8a::div_rd (one fp64 reciprocal of l per row; the IEEE division where a
    // tiny numerator needs it, int8_quant_warp.cuh).
    bool ieee = false;
#pragma unroll
    for (int jj = 0; jj < 16; ++jj) {
      const float2 x = *reinterpret_cast<const float2*>(a.sv + h * kD + 8 * jj + 2 * t);
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // F becomes y = fl32(acc sv)
        F[4 * jj + i] = __fmul_rn(F[4 * jj + i], (i & 1) ? x.y : x.x);
        ieee |= i8w::out_needs_ieee(F[4 * jj + i]);
      }
    }
    i8w::divide_by_row_sums(F, Fl, ieee);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t row = row_base + 8 * r;
      if (row >= a.Mq) continue;
      uint16_t* orow = a.o + row * a.o_rs + h * a.o_hs;
#pragma unroll
      for (int jj = 0; jj < 16; ++jj)
        *reinterpret_cast<uint32_t*>(orow + 8 * jj + 2 * t) = static_cast<uint32_t>(f32_to_bf16_bits(F[4 * jj + 2 * r])) |
                                                              (static_cast<uint32_t>(f32_to_bf16_bits(F[4 * jj + 2 * r + 1])) << 16);
    }
  }
}
#else
template <bool kTable>
__global__ void int8_attention_kernel(const __grid_constant__ CUtensorMap, const __grid_constant__ CUtensorMap,
                                      const __grid_constant__ CUtensorMap, const Args) {
#ifdef __CUDA_ARCH__
  __trap();
#endif
}
#endif  // LS_HOPPER8_DEVICE

// ---- host ---------------------------------------------------------------------------

using hopper::EncodeTiled;

std::string encode(CUtensorMap* map, CUtensorMapDataType type, int rank, const void* ptr, const cuuint64_t* dims,
                   const cuuint64_t* strides, const cuuint32_t* box, CUtensorMapSwizzle swz, const char* name) {
  std::string why;
  const EncodeTiled enc = hopper::tensor_map_encoder(&why);
  if (enc == nullptr) return "attention hopper int8: " + why;
  const cuuint32_t estr[3] = {1, 1, 1};
  const CUresult r = enc(map, type, static_cast<cuuint32_t>(rank), const_cast<void*>(ptr), dims, strides, box, estr,
                         CU_TENSOR_MAP_INTERLEAVE_NONE, swz, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return std::string("attention hopper int8: the driver refuses a TMA map of ") + name + " (CUresult " +
           std::to_string(static_cast<int>(r)) + ")";
  return "";
}

bool aligned(const void* p, uintptr_t n) { return (reinterpret_cast<uintptr_t>(p) % n) == 0; }

}  // namespace

std::string int8_hopper_fits(bool sm_90, const TensorView& q, const Int8Keys& keys, const TensorView& out,
                             const AttentionParams& p) {
  if (!sm_90) return "the device is not sm_90";
  if (q.ndim != 3 || q.size(2) != kD) return "head dim is not 128";
  if (p.kv_tile != kN) return "kv_tile is not 128";
  const int64_t H = q.size(1), n = keys.keys();
  // Shapes and dtypes the portable kernel's checks would refuse go there (for its message).
  const Int8Keys& K = keys;
  if (q.dtype != DType::bf16 || out.dtype != DType::bf16 || out.ndim != 3 || out.size(0) != q.size(0) ||
      out.size(1) != H || out.size(2) != kD || n <= 0 || K.k8.dtype != DType::i8 || K.k8.ndim != 3 ||
      K.k8.size(1) != H || K.k8.size(2) != kD || K.sk.dtype != DType::f32 || K.sk.ndim != 2 || K.sk.size(0) != n ||
      K.sk.size(1) != H || K.v8t.dtype != DType::i8 || K.v8t.ndim != 3 || K.v8t.size(0) != H ||
      K.v8t.size(1) != kD || K.v8t.size(2) != n || K.vs.dtype != DType::f32 || K.vs.ndim != 4 || K.vs.size(1) != 2 ||
      K.vs.size(2) != H || K.vs.size(3) != kD || !K.vs.is_contiguous() || !aligned(K.vs.data, 8) || K.k0 < 0 ||
      (K.k0 + n - 1) / kInt8StatBlock >= K.vs.size(0))
    return "shapes or dtypes do not match (the portable kernel reports which)";
  // Contract v4: the kernel's blocks must be absolute 128-key tiles, K's scale groups (its
  // score takes one scale per group). Keys starting off the grid (a key range of a prepared
  // sequence; never a streamed chunk) go to the portable kernel's per-key form. This also
  // keeps blocks from straddling a statistics block.
  if (K.k0 % kN != 0) return "the first key is not a multiple of 128 (K's scale groups, contract v4)";
  if (!check_attention_state(p, q.size(0), n, H, kD).ok()) return "the streamed state does not match";
  if (H % 4 != 0 || H > 65535) return "the head count is not a multiple of 4 (the key scales' TMA boxes)";
  if (q.size(0) > (int64_t{1} << 30) || n > (int64_t{1} << 30)) return "more than 2^30 rows";
  if (!aligned(q.data, 8) || q.stride[0] % 4 || q.stride[1] % 4 || q.stride[2] != 1 || !aligned(out.data, 4) ||
      out.stride[0] % 2 || out.stride[1] % 2 || out.stride[2] != 1)
    return "q rows are not 8-byte aligned or out rows not 4-byte aligned";
  if (!aligned(keys.k8.data, 16) || keys.k8.stride[0] % 16 || keys.k8.stride[1] != kD || keys.k8.stride[2] != 1 ||
      !aligned(keys.v8t.data, 16) || keys.v8t.stride[1] % 16 || keys.v8t.stride[0] != kD * keys.v8t.stride[1] ||
      keys.v8t.stride[2] != 1 || !aligned(keys.sk.data, 16) || !keys.sk.is_contiguous())
    return "the prepared keys' rows are not 16-byte aligned";
  return "";
}

Status attention_hopper_int8(CudaContext& ctx, const TensorView& q, const Int8Keys& keys, const TensorView& out,
                             const AttentionParams& p, bool p8_table, bool persistent) {
  const std::string why = int8_hopper_fits(true, q, keys, out, p);
  if (!why.empty()) return make_error(ErrorCode::unsupported, "attention hopper int8: " + why);
  const int64_t Mq = q.size(0), H = q.size(1), Mk = keys.keys();
  if (Mq == 0) return Status();
  CUtensorMap tk{}, tv{}, ts{};
  std::string e;
  {
    const cuuint64_t dims[3] = {kD, static_cast<cuuint64_t>(H), static_cast<cuuint64_t>(Mk)};
    const cuuint64_t strides[2] = {kD, static_cast<cuuint64_t>(keys.k8.stride[0])};
    const cuuint32_t box[3] = {kD, 1, kN};
    e = encode(&tk, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, keys.k8.data, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B,
               "k8");
  }
  if (e.empty()) {
    const int64_t ld = keys.v8t.stride[1];
    const cuuint64_t dims[3] = {static_cast<cuuint64_t>(Mk), kD, static_cast<cuuint64_t>(H)};
    const cuuint64_t strides[2] = {static_cast<cuuint64_t>(ld), static_cast<cuuint64_t>(ld * kD)};
    const cuuint32_t box[3] = {kN, kD, 1};
    e = encode(&tv, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, keys.v8t.data, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B,
               "v8t");
  }
  if (e.empty()) {
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(H), static_cast<cuuint64_t>(Mk)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(H * 4)};
    const cuuint32_t box[2] = {4, kN};
    e = encode(&ts, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, keys.sk.data, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_NONE,
               "sk");
  }
  if (!e.empty()) return make_error(ErrorCode::unsupported, e);
  Args a{};
  a.q = q.ptr<uint16_t>();
  a.q_rs = q.stride[0];
  a.q_hs = q.stride[1];
  a.vs = keys.vs.ptr<float>();
  a.sv = a.vs + 2 * ((keys.k0 + Mk - 1) / kInt8StatBlock) * H * kD;  // sv of the last key's block
  a.kb0 = keys.k0 / kInt8StatBlock;
  a.k0r = static_cast<int>(keys.k0 % kInt8StatBlock);
  a.o = out.ptr<uint16_t>();
  a.o_rs = out.stride[0];
  a.o_hs = out.stride[1];
  a.Mq = Mq;
  a.Mk = Mk;
  const float scale = attention_scale(p, kD);
  a.cs = i8a::score_factor(scale, kD);
  a.state = p.state.empty() ? nullptr : p.state.ptr<float>();
  a.state_in = p.state_in;
  a.finalize = p.finalize;
  {  // the q8 cache needs a state and out's bytes apart from q's (it writes out before the last read of q)
    const auto span = [](const TensorView& t) {
      const auto* b = static_cast<const uint8_t*>(t.data);
      int64_t last = 0;
      for (int d = 0; d < t.ndim; ++d) last += (t.size(d) - 1) * t.stride[d];
      return std::make_pair(b, b + (last + 1) * static_cast<int64_t>(t.elem_size()));
    };
    const auto [q_lo, q_hi] = span(q);
    const auto [o_lo, o_hi] = span(out);
    a.q8_cache = a.state != nullptr && (o_hi <= q_lo || q_hi <= o_lo);
  }
  a.H = static_cast<int>(H);
  a.q_tiles = static_cast<int>((Mq + kBr - 1) / kBr);
  const int64_t items = static_cast<int64_t>(a.q_tiles) * H;
  if (items >= (int64_t{1} << 30))  // item + gridDim.x stays an int
    return make_error(ErrorCode::unsupported, "attention hopper int8: 2^30 or more (query tile, head) items");
  a.items = static_cast<int>(items);
  constexpr int kSmem = smem_bytes();
  if (ctx.max_smem_optin < static_cast<size_t>(kSmem))
    return make_error(ErrorCode::unsupported, "attention hopper int8: needs " + std::to_string(kSmem) +
                                                  " bytes of shared memory per block; the device allows " +
                                                  std::to_string(ctx.max_smem_optin));
  // Persistent: one CTA per SM, each taking items blockIdx.x, + grid, ... (the ring and the
  // ping-pong run on across items, so an item's start and end overlap its neighbours'
  // loads); else one CTA per item (the launch before session 14, for side-by-side timing).
  // The ring's block count per CTA is a uint32 whose stage (count % 3) must not wrap: a
  // persistent CTA walks ceil(items / ctas) items of nblocks blocks; past 2^31 (an hour-long
  // call) the launch is one CTA per item, whose count is nblocks < 2^23.
  int64_t ctas = persistent ? std::min<int64_t>(items, std::max(ctx.sm_count, 1)) : items;
  if ((items + ctas - 1) / ctas * ((Mk + kN - 1) / kN) >= (int64_t{1} << 31)) ctas = items;
  const dim3 grid(static_cast<unsigned>(ctas));
  // The shared-memory opt-in once per process (both instantiations).
  static std::once_flag once;
  static cudaError_t attr_err = cudaSuccess;
  std::call_once(once, [] {
    attr_err = cudaFuncSetAttribute(int8_attention_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (attr_err == cudaSuccess)
      attr_err = cudaFuncSetAttribute(int8_attention_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  });
  if (attr_err == cudaSuccess) {
    if (p8_table) int8_attention_kernel<true><<<grid, kThreads, kSmem, ctx.stream>>>(tk, tv, ts, a);
    else int8_attention_kernel<false><<<grid, kThreads, kSmem, ctx.stream>>>(tk, tv, ts, a);
  }
  if (attr_err != cudaSuccess)
    return make_error(ErrorCode::device, std::string("attention hopper int8: shared memory opt-in: ") +
                                               cudaGetErrorString(attr_err));
  const cudaError_t le = cudaGetLastError();
  if (le != cudaSuccess)
    return make_error(ErrorCode::device, std::string("attention hopper int8: launch: ") + cudaGetErrorString(le));
  return Status();
}

}  // namespace ls::cuda
