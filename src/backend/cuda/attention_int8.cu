// CUDA INT8 attention, the portable kernels (AttentionAlgorithm::int8; docs/int8-attention.md
// is the contract, v4; src/backend/cpu/attention_int8.cpp the reference). sm_80+ (mma.sync
// m16n8k32 s8.s8 for Q.K, u8.s8 for P.V), head dim 128, kv_tile 128. Every element
// operation is the shared arithmetic of backend/int8_attention_math.h (the _rn intrinsics),
// the integer sums are exact, and the fp32 fold runs once per 128-key tile in the CPU's
// order, so the bytes equal the CPU reference's (tests/cuda/test_attention_int8_cuda.cpp).
// Contract v3: the statistics are per absolute block of kInt8StatBlock = 4096 keys (K's
// centre over block 0 only, V's scale sv_b per block b), keys [k0, k0 + n) of a call.
// Contract v4: K's scale per key GROUP (the 16 keys of a 128-key tile with the same j % 8,
// stored per key), and the score x = fmaf(fl32(a sk), float(d), fl32(kP8Top - sT)).
//
//   int8_key_stats  grid (columns / 128, row groups, statistics blocks of the call's keys):
//                   a CTA's rows lie in ONE block (a segment of the call's rows; the groups
//                   stride over it), each thread one (head, channel) column; K read only
//                   for block 0's rows; per thread one merge per statistic and block into
//                   stats by float max/min compare-and-swap (exact, order-free). reset: an
//                   init kernel first over all 2 + NB rows (-inf, +inf, 0...).
//   int8_prepare    vs rows (sv_b, rho_b) of the blocks the keys touch; K (k0 % 128 == 0) in
//                   three launches (the keys' own scales into sk, k8 with the group scales,
//                   the group scales into sk: prepare_k_scale_kernel), one warp per (key,
//                   head) row: lane l holds channels 4l..4l+3, the rotation's strides 1, 2 in
//                   registers and 4..64 by shuffles (the same adds as the CPU, in the same
//                   stage order); V through a 32-key shared-memory transpose into v8t[h, c,
//                   j], each key quantised with its own block's sv (32 keys span at most two
//                   blocks: two fp64 reciprocals per channel).
//   attention_int8  a CTA of 8 warps x 16 queries of one head (kWarps); per 128-key tile: K
//                   (k8, sk) and V^T (v8t) tiles in shared memory, two stages (cp.async: the
//                   next tile lands while this one computes; 91 KiB per CTA with Q), rows
//                   padded to 144 bytes, K's rows swizzled (k_row) so that an n-tile's 8 keys
//                   hit 8 bank groups),
//                   the B fragments of both products by ldmatrix.x4 (two per n-tile or channel
//                   tile), Q.K by 64 mma (16 n-tiles x 4 k-steps of 32), the tile max mu (an
//                   integer max of d per key group, then u = fl32(sk_g float(dmax)); the
//                   quad's shuffles), sT, alpha, beta, p8 of
//                   fmaf(fl32(a sk_g), float(d), fl32(kP8Top - sT)) (per score I2F, FFMA, the
//                   p8; v3's form for a row with |sT| >= 4096; fast ex2 byte or the threshold table: template kTable; template
//                   kGrouped false, keys off the 128-key grid: u and fl32(a sk) per key),
//                   integer row sums of p8 (one dp4a per P register; its 4 bytes by 3
//                   PRMT), P.V by 64 mma (16 channel tiles x 4 k-steps) into int32, then the v2 fold
//                   (before it, at a tile starting a statistics block b > 0, acc *= rho_b:
//                   one block entry in 32 tiles: an outer loop over the blocks). The
//                   keys of a 32-key group are loaded into the Q.K B operand in the order 4t+{0,1} | 4t+{2,3} | 16+4t+{0,1} |
//                   16+4t+{2,3} (n-tiles 0..3, column pair t), so each thread's Q.K accumulators
//                   ARE its P.V A fragment (keys 4t..4t+3 and 16+4t..16+4t+3): no shuffles.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <climits>
#include <string>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/int8_p8_check.cuh"
#include "backend/cuda/int8_quant_warp.cuh"
#include "backend/cuda/ops.cuh"
#include "backend/int8_attention_math.h"

namespace ls::cuda {
namespace {

constexpr int kDh = 128;        // the head dim of these kernels
constexpr int kTile = 128;      // keys per tile = kv_tile (the fold granularity)
// Warps per CTA, 16 queries each. 8 (session 20; was 4): the CTA's 91 KiB of shared memory
// (two K/V stages and the Q rows) is then shared by 128 queries, and a GPU with 100 KB of
// shared memory per SM (sm_86, sm_89, sm_120: the RTX cards), which fits one such CTA, runs 8
// warps per SM instead of 4; 255 registers x 256 threads fit the 64 K register file.
constexpr int kWarps = 8;
constexpr int kRowPad = 144;    // shared-memory row stride in bytes (128 + 16)
constexpr int kStatBlock = static_cast<int>(kInt8StatBlock);  // keys per statistics block (4096)
static_assert(kStatBlock % kTile == 0 && (kStatBlock & (kStatBlock - 1)) == 0,
              "tiles of 128 keys never straddle a statistics block; the block test is a mask");

__device__ __forceinline__ void atomic_max_f(float* a, float v) {
  int* ai = reinterpret_cast<int*>(a);
  int old = *ai;
  while (v > __int_as_float(old)) {
    const int assumed = old;
    old = atomicCAS(ai, assumed, __float_as_int(v));
    if (old == assumed) break;
  }
}
__device__ __forceinline__ void atomic_min_f(float* a, float v) {
  int* ai = reinterpret_cast<int*>(a);
  int old = *ai;
  while (v < __int_as_float(old)) {
    const int assumed = old;
    old = atomicCAS(ai, assumed, __float_as_int(v));
    if (old == assumed) break;
  }
}

// reset: stats [2 + NB, H, Dh] = (-inf | +inf | 0 ... 0), total = (2 + NB) * HD entries.
__global__ void stats_init(float* st, int64_t HD, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    st[i] = i < HD ? -INFINITY : i < 2 * HD ? INFINITY : 0.0f;
}

// Keys [k0, k0 + n): k, v bf16 rows of H * Dh elements (row strides ks, vs); columns HD =
// H * Dh. blockIdx.z (+ gridDim.z ...) = segment z: the call's rows in statistics block
// b0 + z (b0 = k0 / 4096), rows [max(0, 4096 b - k0), min(n, 4096 (b + 1) - k0)); the
// row groups (blockIdx.y) stride over the segment, so a thread's rows share one block and
// it merges once per statistic. max/min are exact and order-free: any grid gives the CPU's
// bytes (a NaN never wins a comparison, on either side).
__global__ void stats_kernel(const uint16_t* k, int64_t ks, const uint16_t* v, int64_t vs, int64_t n, int64_t k0,
                             int64_t HD, int64_t segments, float* st) {
  const int64_t col = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (col >= HD) return;
  const int64_t B = kStatBlock, b0 = k0 / B;
  for (int64_t z = blockIdx.z; z < segments; z += gridDim.z) {
    const int64_t b = b0 + z;
    const int64_t r0 = b * B - k0 > 0 ? b * B - k0 : 0, r1 = (b + 1) * B - k0 < n ? (b + 1) * B - k0 : n;
    if (r0 + blockIdx.y >= r1) continue;  // no rows of this group in the segment
    if (b == 0) {  // K's extremes over block 0's keys only (the centre mu, docs §3)
      float kmax = -INFINITY, kmin = INFINITY;
      for (int64_t j = r0 + blockIdx.y; j < r1; j += gridDim.y) {
        const float kv = bf16_bits_to_f32(k[j * ks + col]);
        kmax = kv > kmax ? kv : kmax;
        kmin = kv < kmin ? kv : kmin;
      }
      atomic_max_f(st + col, kmax);
      atomic_min_f(st + HD + col, kmin);
    }
    float vabs = 0.0f;
    for (int64_t j = r0 + blockIdx.y; j < r1; j += gridDim.y) {
      const float vv = lq::abs(bf16_bits_to_f32(v[j * vs + col]));
      vabs = vv > vabs ? vv : vabs;
    }
    atomic_max_f(st + (2 + b) * HD + col, vabs);
  }
}

// The V-scale table rows of blocks b0 .. b0 + nb - 1 (docs §3): vs[b][0] = sv_b =
// row_scale(max |v| of block b), vs[b][1] = rho_b = fl32(sv_{b-1} / sv_b) (rho_0 = 1), an IEEE
// division (lq::div = __fdiv_rn: rho may be subnormal, where i8a::div_rd is not exact).
__global__ void vscale_kernel(const float* st, int64_t HD, int64_t b0, int64_t nb, float* vs) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= HD) return;
  for (int64_t z = blockIdx.y; z < nb; z += gridDim.y) {
    const int64_t b = b0 + z;
    const float sv = i8a::row_scale(st[(2 + b) * HD + i]);
    vs[2 * b * HD + i] = sv;
    vs[(2 * b + 1) * HD + i] = b == 0 ? 1.0f : lq::div(i8a::row_scale(st[(1 + b) * HD + i]), sv);
  }
}

using i8w::quant_row_warp;  // int8_quant_warp.cuh (shared with the Hopper kernel)
using i8w::rotate_warp;

// K's prepare, contract v4 (docs §3): key j's scale is its GROUP's, the 16 keys of its 128-key
// tile with the same j % 8 (absolute j; the call's k0 is a multiple of 128, so local tiles
// and residues are absolute ones; keys past the call's n are simply absent from a group).
// No scratch (backends never allocate): sk itself carries the intermediate values, and three
// launches in stream order separate the phases:
//   1. prepare_k_scale_kernel, one warp per (key j, head h): y = R(fl32(k - mu)), sk[j, h] =
//      row_scale(max |y|) (the key's own v3 scale).
//   2. prepare_k_quant_kernel, one warp per (key, head): y again (the same bits), the group
//      scale = the max of the group's sk values (row_scale is monotone, so this is
//      row_scale of the group's largest max |y|; a max of floats >= kTiny: exact, order-free),
//      k8 = quant(y, group scale). Reads sk only.
//   3. prepare_k_group_kernel, one thread per (group, head): every key of the group gets the
//      group scale in sk (after launch 2, which read the per-key values).
// y is recomputed in launch 2 rather than stored (k is bf16 and the work is a few shuffles per
// value); the cost is about twice v3's K prepare, once per key per sequence.
__device__ __forceinline__ void centred_rotated_warp(const uint16_t* k, int64_t ks, int64_t j, int h, int H,
                                                     const float* st, int lane, float y[4]) {
  const int64_t HD = static_cast<int64_t>(H) * kDh;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int c = 4 * lane + e;
    const float mu = lq::mul(0.5f, lq::add(st[h * kDh + c], st[HD + h * kDh + c]));
    y[e] = lq::sub(bf16_bits_to_f32(k[j * ks + h * kDh + c]), mu);
  }
  rotate_warp(y, lane);
}

__global__ void prepare_k_scale_kernel(const uint16_t* k, int64_t ks, int64_t n, int H, const float* st, float* sk) {
  const int lane = threadIdx.x & 31;
  const int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;  // j * H + h
  if (row >= n * H) return;
  float y[4];
  centred_rotated_warp(k, ks, row / H, static_cast<int>(row % H), H, st, lane, y);
  const float s = i8a::row_scale(i8w::row_amax_warp(y));
  if (lane == 0) sk[row] = s;
}

// The first key of key j's group (local = absolute residues: k0 % 128 == 0); its members are
// first + 8 m, m = 0..15, those below n.
__device__ __forceinline__ int64_t group_first(int64_t j) {
  return j / kInt8KeyGroupTile * kInt8KeyGroupTile + j % kInt8KeyGroupStride;
}

__global__ void prepare_k_quant_kernel(const uint16_t* k, int64_t ks, int64_t n, int H, const float* st, int8_t* k8,
                                       const float* sk) {
  const int lane = threadIdx.x & 31;
  const int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;  // j * H + h
  if (row >= n * H) return;
  const int64_t j = row / H;
  const int h = static_cast<int>(row % H);
  // The group scale: lanes 0..15 read member m = lane (if present), a max over the warp.
  const int64_t jm = group_first(j) + kInt8KeyGroupStride * (lane & 15);
  float gs = jm < n ? sk[jm * H + h] : 0.0f;  // every sk >= kTiny > 0, never NaN
#pragma unroll
  for (int m = 8; m >= 1; m >>= 1) gs = fmaxf(gs, __shfl_xor_sync(0xffffffffu, gs, m));
  float y[4];
  centred_rotated_warp(k, ks, j, h, H, st, lane, y);
  reinterpret_cast<uint32_t*>(k8 + row * kDh)[lane] = i8w::quant_lane(y, gs);
}

__global__ void prepare_k_group_kernel(int64_t n, int H, float* sk) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;  // group * H + h
  const int64_t groups = (n + kInt8KeyGroupTile - 1) / kInt8KeyGroupTile * kInt8KeyGroupStride;
  if (i >= groups * H) return;
  const int64_t grp = i / H;
  const int h = static_cast<int>(i % H);
  const int64_t first = grp / kInt8KeyGroupStride * kInt8KeyGroupTile + grp % kInt8KeyGroupStride;
  float gs = 0.0f;
  for (int64_t j = first; j < n && j < first + kInt8KeyGroupTile; j += kInt8KeyGroupStride)
    gs = fmaxf(gs, sk[j * H + h]);
  for (int64_t j = first; j < n && j < first + kInt8KeyGroupTile; j += kInt8KeyGroupStride) sk[j * H + h] = gs;
}

// V of 32 keys x 128 channels of one head through shared memory into v8t[h, c, j0..j0+31].
// Key j (absolute k0 + j) is quantised with sv of its own block, row_scale(stats[2 + b]) (the
// value vscale_kernel writes to vs; taken from stats here, the same bits, so this kernel
// does not wait on that one's writes). 32 keys lie in at most two blocks (32 < 4096): the
// first jb in block b, the rest in b + 1.
__global__ void prepare_v_kernel(const uint16_t* v, int64_t vs, int64_t n, int64_t k0, const float* st, int64_t HD,
                                 int8_t* v8t, int64_t ld, int64_t hs) {
  __shared__ int8_t t[kDh][32 + 4];
  const int h = blockIdx.y, c = threadIdx.x;  // 128 threads: one channel each
  const int64_t j0 = blockIdx.x * 32LL;
  const int64_t b = (k0 + j0) / kStatBlock, col = h * kDh + c;
  const int64_t left = (b + 1) * kStatBlock - (k0 + j0);  // keys of this group still in block b
  const int jb = left < 32 ? static_cast<int>(left) : 32;
  // i8a::quant's bits without a division; block b + 1's only where this group has keys there.
  const double r0 = i8a::recip_d(i8a::row_scale(st[(2 + b) * HD + col]));
  const double r1 = jb < 32 && j0 + jb < n ? i8a::recip_d(i8a::row_scale(st[(3 + b) * HD + col])) : r0;
  for (int jj = 0; jj < 32; ++jj) {
    const int64_t j = j0 + jj;
    t[c][jj] = j < n ? i8a::quant_rd(bf16_bits_to_f32(v[j * vs + h * kDh + c]), jj < jb ? r0 : r1) : 0;
  }
  __syncthreads();
  int8_t* dst = v8t + h * hs + c * ld + j0;
  const int64_t m = n - j0 < 32 ? n - j0 : 32;
  for (int jj = 0; jj < m; ++jj) dst[jj] = t[c][jj];
}

// ---- the attention kernel ------------------------------------------------------------------

__device__ __forceinline__ void mma_s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_u8s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

struct AttnArgs {
  const uint16_t* q;
  int64_t q_rs, q_hs;  // q row / head strides (elements)
  const int8_t* k8;
  int64_t k8_rs;       // k8 row stride (elements): H * Dh for a contiguous [n, H, Dh]
  const float* sk;
  int64_t sk_rs;       // sk row stride: H
  const int8_t* v8t;
  int64_t v_hs, v_ld;  // v8t head stride, row stride (ld)
  const float* sv;     // sv [H, Dh] of the block of the call's last key (the output's units)
  const float* vs;     // the V-scale table f32 [NB, 2, H, Dh]: rho_b at vs + (2 b + 1) H Dh
  int64_t k0;          // the absolute index of the call's first key
  uint16_t* out;
  int64_t o_rs, o_hs;
  float* state;        // f32 [Mq, H, Dh + 8] or null
  int64_t Mq, Mk;
  int H;
  float cs;            // score factor fl32(fl32(scale * log2e) / Dh)
  bool state_in, finalize;
};

// The key of column c of n-tile nt (0..15) of a tile: see the file comment.
__device__ __forceinline__ int key_of(int nt, int c) {
  const int grp = nt >> 2, ntl = nt & 3, t = c >> 1, e = c & 1;
  return grp * 32 + (ntl >> 1) * 16 + 4 * t + (ntl & 1) * 2 + e;
}
// The shared-memory row of key r of a K tile. An n-tile's 8 keys (key_of(nt, 0..7)) are
// b + {0, 1, 4, 5, 8, 9, 12, 13}: with 144-byte rows (16-byte bank group r mod 8) keys r and
// r + 8 would share banks, so rows whose bit 3 is set swap pairs (bit 1 flipped): the 8 rows
// then hit 8 distinct bank groups (session 20; before, every K fragment load was a 2-way
// conflict).
__device__ __forceinline__ int k_row(int r) { return r ^ (((r >> 3) & 1) << 1); }
// ldmatrix of four 8 x 16-byte matrices: lane l gives the row address of matrix l / 8, row
// l % 8, and receives in r[i] bytes 4 (l % 4) .. + 3 of row l / 4 of matrix i: for a tile
// stored key- (or channel-) major, exactly the B fragment b of mma m16n8k32 (n = l / 4, k =
// 4 (l % 4) ..) of the 16-byte segment matrix i covers.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// cp.async of 16 (or 4) bytes; zero-filled when !valid (src then names a safe address).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// One stage of shared memory: a K tile [128 keys][144 B], a V^T tile [128 channels][144 B]
// (keys along the row) and the tile's 128 key scales.
constexpr int kStageBytes = kTile * kRowPad + kDh * kRowPad + kTile * 4;

// The launch bounds: 128 threads; on sm_100 and later also "at least one CTA per SM", without
// which ptxas 13.0 for sm_120 (the RTX 50 class) caps the table-path kernels at 168 registers
// and spills 600-732 B (with it: 255 registers, no spills; the per-key kernel's 140 / 112 B
// either way). sm_80-90 keep the plain bound: their cubins are byte-identical to before.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
#define LS_I8_PORTABLE_BOUNDS __launch_bounds__(kWarps * 32, 1)
#else
#define LS_I8_PORTABLE_BOUNDS __launch_bounds__(kWarps * 32)
#endif
template <bool kTable, bool kGrouped>
__global__ void LS_I8_PORTABLE_BOUNDS attention_int8_kernel(const AttnArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* sQ = smem + 2 * kStageBytes;  // [warps][16 rows][144 B]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int h = blockIdx.y;
  const int64_t q0 = blockIdx.x * static_cast<int64_t>(kWarps * 16) + warp * 16;
  // This lane's ldmatrix row offsets in a stage's K and V^T tiles (ldsm_x4): K row
  // k_row(key_of(nt, 0) + kl), kl = key_of(nt, l % 8) - key_of(nt, 0); key_of(nt, 0) has bit 1 =
  // nt & 1 and no bit 3, kl no bit 1, so k_row flips bit 1 of key_of(nt, 0) where kl has bit 3:
  // + 2 rows for even nt, - 2 for odd. V^T row 8 ct + l % 8. Segment 16 (l / 8) of the row.
  const int kc = lane & 7, kl = 4 * (kc >> 1) + (kc & 1), kflip = 2 * (kc >> 2);
  const uint32_t k_lane[2] = {static_cast<uint32_t>((kl + kflip) * kRowPad + 16 * (lane >> 3)),
                              static_cast<uint32_t>((kl - kflip) * kRowPad + 16 * (lane >> 3))};
  const uint32_t v_lane = static_cast<uint32_t>(kc * kRowPad + 16 * (lane >> 3));
  // Tile loads into stage st (two stages: the next tile lands while this one computes).
  // K rows past nk and V bytes never read are zero-filled or ignored: the V bytes past nk
  // inside ld are copied but multiply p8 = 0.
  auto load_tile = [&](int st, int64_t t0) {
    unsigned char* sK = smem + st * kStageBytes;
    unsigned char* sV = sK + kTile * kRowPad;
    float* sSk = reinterpret_cast<float*>(sV + kDh * kRowPad);
    const int nk = a.Mk - t0 < kTile ? static_cast<int>(a.Mk - t0) : kTile;
    for (int idx = tid; idx < kTile * 8; idx += kWarps * 32) {
      const int r = idx >> 3, piece = idx & 7;
      const bool ok = r < nk;
      cp_async16(sK + k_row(r) * kRowPad + 16 * piece, ok ? a.k8 + (t0 + r) * a.k8_rs + h * kDh + 16 * piece : a.k8, ok);
    }
    for (int idx = tid; idx < kDh * 8; idx += kWarps * 32) {
      const int c = idx >> 3, piece = idx & 7;
      const bool ok = 16 * piece < nk;
      cp_async16(sV + c * kRowPad + 16 * piece, ok ? a.v8t + h * a.v_hs + c * a.v_ld + t0 + 16 * piece : a.v8t, ok);
    }
    for (int j = tid; j < kTile; j += kWarps * 32)
      cp_async4(sSk + j, j < nk ? a.sk + (t0 + j) * a.sk_rs + h : a.sk, j < nk);
  };
  load_tile(0, 0);
  cp_async_commit();
  // ---- Q: rotate, quantise (per row, the warp together), into this warp's smem rows.
  unsigned char* myQ = sQ + warp * 16 * kRowPad;
  float arow[2] = {0.0f, 0.0f};  // a of rows g, g + 8
  // All 16 rows' loads first (a row loop that loads as it goes waits one global-memory
  // latency per row before the first tile). Rows past Mq are zeros; their output is never
  // written.
  uint16_t qraw[16][4];
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    const int64_t i = q0 + r;
#pragma unroll
    for (int e = 0; e < 4; ++e) qraw[r][e] = i < a.Mq ? a.q[i * a.q_rs + h * a.q_hs + 4 * lane + e] : uint16_t{0};
  }
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    float y[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) y[e] = bf16_bits_to_f32(qraw[r][e]);
    rotate_warp(y, lane);
    uint32_t w;
    const float s = quant_row_warp(y, &w);
    reinterpret_cast<uint32_t*>(myQ + r * kRowPad)[lane] = w;
    const float ar = lq::mul(s, a.cs);
    if (r == g) arow[0] = ar;
    if (r == g + 8) arow[1] = ar;
  }
  __syncwarp();
  uint32_t qa[4][4];  // A fragments, k-steps of 32 channels
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    qa[ks][0] = *reinterpret_cast<const uint32_t*>(myQ + g * kRowPad + 32 * ks + 4 * t);
    qa[ks][1] = *reinterpret_cast<const uint32_t*>(myQ + (g + 8) * kRowPad + 32 * ks + 4 * t);
    qa[ks][2] = *reinterpret_cast<const uint32_t*>(myQ + g * kRowPad + 32 * ks + 16 + 4 * t);
    qa[ks][3] = *reinterpret_cast<const uint32_t*>(myQ + (g + 8) * kRowPad + 32 * ks + 16 + 4 * t);
  }
  // ---- the state of rows g (index 0) and g + 8 (index 1): channels 8 ct + 2 t + e.
  float acc[16][4];
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int64_t rows[2] = {q0 + g, q0 + g + 8};
  const int64_t SW = kDh + kAttentionStateExtra;
#pragma unroll
  for (int ct = 0; ct < 16; ++ct)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[ct][e] = 0.0f;
  if (a.state_in) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      if (rows[rr] >= a.Mq) continue;
      const float* st = a.state + (rows[rr] * a.H + h) * SW;
#pragma unroll
      for (int ct = 0; ct < 16; ++ct) {
        acc[ct][2 * rr] = st[8 * ct + 2 * t];
        acc[ct][2 * rr + 1] = st[8 * ct + 2 * t + 1];
      }
      m[rr] = st[kDh];
      l[rr] = st[kDh + 1];
    }
  }
  // ---- the tiles, statistics block by statistics block
  int stage = 0;
  for (int64_t t0 = 0; t0 < a.Mk;) {
    // Contract v3 (§4.4): acc is kept in units of the current statistics block's V scale
    // (the P.V sums are of v8 = quant(v, sv_b)); a tile that starts block b > 0 (absolute
    // first key ta = k0 + t0 a multiple of 4096: tiles never straddle a block) first moves
    // acc from block b - 1's units to b's, acc = fl32(acc rho_b), rho_b = fl32(sv_{b-1} /
    // sv_b): a plain multiply, before the fold and apart from it (as the CPU). l and m are
    // sums and maxima of p8 and scores, free of V's scale: never rescaled. CTA-uniform (t0,
    // k0); rho by 16 float2 loads (this thread's channels 8 ct + 2 t + {0, 1}, the same for
    // both rows). It sits in an outer loop over the blocks, so the tile loop below is v2's
    // loop body unchanged (a test and branch inside it cost 2.6 % of the kernel's rate on the
    // H200: bench/results/issue26/run13, call 3).
    const int64_t ta = a.k0 + t0;
    if ((ta & (kStatBlock - 1)) == 0 && ta != 0) {
      const float* rho = a.vs + ((2 * (ta / kStatBlock) + 1) * a.H + h) * kDh + 2 * t;
#pragma unroll
      for (int ct = 0; ct < 16; ++ct) {
        const float2 r = __ldg(reinterpret_cast<const float2*>(rho + 8 * ct));
        acc[ct][0] = lq::mul(acc[ct][0], r.x);
        acc[ct][1] = lq::mul(acc[ct][1], r.y);
        acc[ct][2] = lq::mul(acc[ct][2], r.x);
        acc[ct][3] = lq::mul(acc[ct][3], r.y);
      }
    }
    // The call's tiles in this block: up to the next block start (key k0 + t1) or the end.
    const int64_t t_next = (ta / kStatBlock + 1) * kStatBlock - a.k0;
    const int64_t t1 = t_next < a.Mk ? t_next : a.Mk;
    for (; t0 < t1; t0 += kTile, stage ^= 1) {
      const int nk = a.Mk - t0 < kTile ? static_cast<int>(a.Mk - t0) : kTile;
      cp_async_wait_all();
      __syncthreads();  // tile t0 is in `stage`; every thread is done with the other stage
      if (t0 + kTile < a.Mk) load_tile(stage ^ 1, t0 + kTile);
      cp_async_commit();
      const unsigned char* sK = smem + stage * kStageBytes;
      const unsigned char* sV = sK + kTile * kRowPad;
      const float* sSk = reinterpret_cast<const float*>(sV + kDh * kRowPad);
      // Q.K: sc[nt][0..3] = d of (row g, key key_of(nt, 2t)), (g, key_of(nt, 2t+1)), (g+8, ..), (g+8, ..)
      // The B fragments by ldmatrix (two x4 per n-tile: k-steps 0, 1 and 2, 3): lane l's row is
      // key_of(nt, l % 8) = key_of(nt, 0) + kl at k_row's place, its segment 16 (l / 8) (+ 64).
      const uint32_t sK_s = static_cast<uint32_t>(__cvta_generic_to_shared(sK));
      const uint32_t sV_s = static_cast<uint32_t>(__cvta_generic_to_shared(sV));
      int sc[16][4];
#pragma unroll
      for (int nt = 0; nt < 16; ++nt) {
        sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0;
        const uint32_t kb = sK_s + static_cast<uint32_t>(key_of(nt, 0) * kRowPad) + k_lane[nt & 1];
        uint32_t b[4];
        ldsm_x4(b, kb);
        mma_s8(sc[nt], qa[0], b[0], b[1]);
        mma_s8(sc[nt], qa[1], b[2], b[3]);
        ldsm_x4(b, kb + 64);
        mma_s8(sc[nt], qa[2], b[0], b[1]);
        mma_s8(sc[nt], qa[3], b[2], b[3]);
      }
      // Contract v4 (§4.2-4.4), rows g (rr 0) and g + 8 (rr 1). Key key_of(nt, 2t + (e & 1)) is
      // 32 grp + 16 (ntl >> 1) + 4t + cls, cls = 2 (ntl & 1) + (e & 1): its residue mod 8 is
      // 4 (t & 1) + cls, so (kGrouped: the tile is an absolute 128-key tile, k0 % 128 == 0) a
      // thread's 32 keys per row lie in 4 groups, and the group of class cls has the scale
      // sk[4t + cls] (the thread's first key of that class; every key of a group holds the
      // group's scale). The tile max mu = max_j fl32(sk_j float(d_j)) is then a max of the
      // INTEGER d per (row, class) and one u = fl32(sk_g float(dmax)) per (row, class): fl32(s y)
      // is non-decreasing in y for s > 0, so the bits of the max over the keys' u. Masked keys
      // (a partial last tile) are INT_MIN there, never the result where the class has a valid
      // key (its first key 4t + cls is this thread's own); a class with no valid key gives
      // -inf (its zero-filled scale would give u = -0); p8 = 0.
      // Not kGrouped (a call whose keys start off the 128-key grid: local tiles straddle two
      // groups per class): u and A per key, the same values.
      const auto tile_softmax = [&](auto masked_c, float (&alpha)[2], float (&beta)[2], uint32_t (&pa)[4][4],
                                    int (&lt)[2]) {
        constexpr bool kMask = decltype(masked_c)::value;
        [[maybe_unused]] float skg[4];
        if constexpr (kGrouped) {
          const float4 v = *reinterpret_cast<const float4*>(sSk + 4 * t);
          skg[0] = v.x, skg[1] = v.y, skg[2] = v.z, skg[3] = v.w;
        }
        float mu[2] = {-INFINITY, -INFINITY};
        if constexpr (kGrouped) {
          int dm[2][4];
#pragma unroll
          for (int rr = 0; rr < 2; ++rr)
#pragma unroll
            for (int c = 0; c < 4; ++c) dm[rr][c] = INT_MIN;
#pragma unroll
          for (int nt = 0; nt < 16; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = key_of(nt, 2 * t + (e & 1)), rr = e >> 1, c = 2 * (nt & 1) + (e & 1);
              const int d = kMask && key >= nk ? INT_MIN : sc[nt][e];
              dm[rr][c] = max(dm[rr][c], d);
            }
#pragma unroll
          for (int rr = 0; rr < 2; ++rr)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              const float uc = !kMask || 4 * t + c < nk ? lq::mul(skg[c], __int2float_rn(dm[rr][c])) : -INFINITY;
              mu[rr] = fmaxf(mu[rr], uc);
            }
        } else {
#pragma unroll
          for (int nt = 0; nt < 16; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = key_of(nt, 2 * t + (e & 1)), rr = e >> 1;
              if (!kMask || key < nk) mu[rr] = fmaxf(mu[rr], lq::mul(sSk[key], __int2float_rn(sc[nt][e])));
            }
        }
        // sT = fl32(a mu) (the tile's largest score, log2 units), m_new, alpha, beta; b =
        // fl32(kP8Top - sT) and (kGrouped) A = fl32(a sk_g) per row and class.
        float bT[2];
        [[maybe_unused]] float A[2][4];
        bool v4f[2];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          mu[rr] = fmaxf(mu[rr], __shfl_xor_sync(0xffffffffu, mu[rr], 1));
          mu[rr] = fmaxf(mu[rr], __shfl_xor_sync(0xffffffffu, mu[rr], 2));
          const float sT = lq::mul(arow[rr], mu[rr]);
          const float m_new = sT > m[rr] ? sT : m[rr];
          i8a::fold_factors(m[rr], sT, alpha[rr], beta[rr]);  // one exp2e_nb per row
          m[rr] = m_new;
          bT[rr] = lq::sub(i8a::kP8Top, sT);
          v4f[rr] = i8a::score_fma_form(sT);
          if constexpr (kGrouped) {
#pragma unroll
            for (int c = 0; c < 4; ++c) A[rr][c] = lq::mul(arow[rr], skg[c]);
          }
        }
        // p8 of x = fmaf(A, float(d), b) (within 9.8e-4 of kP8Top at the tile's maximum, below
        // log2(255.5): the fast byte is right; masked keys 0), the integer row sums lt, the P A
        // fragments (k-step = 32-key group). A row with |sT| >= 4096 (i8a::score_fma_form false,
        // never in a model's attention) takes v3's x = fmaf(a, fl32(fl32(sk float(d)) - mu),
        // kP8Top), as the CPU: tested once per tile, warp-uniform (kMixed: the form per row).
        const auto p8_loop = [&](auto mixed_c) {
          constexpr bool kMixed = decltype(mixed_c)::value;
          lt[0] = lt[1] = 0;
#pragma unroll
          for (int grp = 0; grp < 4; ++grp) {
            // wd[ntl][e]: the p8 word of score (nt = 4 grp + ntl, e) (byte 0 = p8, the rest
            // ignored; 0 for a masked key). A register of P's A fragment takes byte 0 of four
            // words by 3 PRMT, and lt one dp4a per register (session 20; before, a shift, an OR,
            // a mask and an add per score).
            uint32_t wd[4][4];
#pragma unroll
            for (int ntl = 0; ntl < 4; ++ntl) {
              const int nt = grp * 4 + ntl;
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const int key = key_of(nt, 2 * t + (e & 1)), rr = e >> 1;
                [[maybe_unused]] const int c = 2 * (ntl & 1) + (e & 1);
                uint32_t w = 0;
                if (!kMask || key < nk) {
                  float sk, Ak;
                  if constexpr (kGrouped) sk = skg[c], Ak = A[rr][c];
                  else sk = sSk[key], Ak = lq::mul(arow[rr], sk);
                  const float df = __int2float_rn(sc[nt][e]);
                  const float x = !kMixed || v4f[rr]
                                      ? lq::fma(Ak, df, bT[rr])
                                      : lq::fma(arow[rr], lq::sub(lq::mul(sk, df), mu[rr]), i8a::kP8Top);
                  w = p8dev::p8_word<kTable>(x);
                }
                wd[ntl][e] = w;
              }
            }
            // Register reg = 2 (ntl / 2) + row: bytes (ntl, e) = (n0, 2 row), (n0, 2 row + 1),
            // (n0 + 1, 2 row), (n0 + 1, 2 row + 1), n0 = 2 (reg / 2): keys 4t + {0,1} | 4t + {2,3}
            // of its 16-key half (<= 255 * 32 per thread in lt).
#pragma unroll
            for (int reg = 0; reg < 4; ++reg) {
              const int n0 = 2 * (reg >> 1), rr = reg & 1;
              pa[grp][reg] = p8dev::pack_p8(wd[n0][2 * rr], wd[n0][2 * rr + 1], wd[n0 + 1][2 * rr], wd[n0 + 1][2 * rr + 1]);
              lt[rr] = static_cast<int>(__dp4a(pa[grp][reg], 0x01010101u, static_cast<unsigned>(lt[rr])));
            }
          }
        };
        if (__all_sync(0xffffffffu, v4f[0] && v4f[1])) p8_loop(std::false_type{});
        else p8_loop(std::true_type{});
      };
      float alpha[2], beta[2];
      uint32_t pa[4][4];
      int lt[2];
      if (nk == kTile) tile_softmax(std::false_type{}, alpha, beta, pa, lt);
      else tile_softmax(std::true_type{}, alpha, beta, pa, lt);
      // l = fmaf(float(lt), beta, fl32(l alpha)) (float(lt) exact: lt <= 255 * 128).
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        lt[rr] += __shfl_xor_sync(0xffffffffu, lt[rr], 1);
        lt[rr] += __shfl_xor_sync(0xffffffffu, lt[rr], 2);
        l[rr] = lq::fma(__int2float_rn(lt[rr]), beta[rr], lq::mul(l[rr], alpha[rr]));
      }
      // P.V into int32, then acc = fmaf(float(ot), beta, fl32(acc alpha)) (|ot| < 2^22: exact).
      // One of alpha, beta is 1 (m_new = max(m, sT)); alpha = 1, a tile that does not raise the
      // row's maximum, is the common case, and there fl32(acc * 1) = acc: the products are
      // skipped where every alpha of the warp is 1 (as the Hopper kernel; session 20).
      if (!__all_sync(0xffffffffu, alpha[0] == 1.0f && alpha[1] == 1.0f)) {
#pragma unroll
        for (int ct = 0; ct < 16; ++ct)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[ct][e] = lq::mul(acc[ct][e], alpha[e >> 1]);
      }
#pragma unroll
      for (int ct = 0; ct < 16; ++ct) {
        int ot[4] = {0, 0, 0, 0};
        // V^T's B fragments by ldmatrix: rows (channels) 8 ct + l % 8, segments 16 (l / 8) (+ 64).
        const uint32_t vb = sV_s + static_cast<uint32_t>(8 * ct * kRowPad) + v_lane;
        uint32_t b[4];
        ldsm_x4(b, vb);
        mma_u8s8(ot, pa[0], b[0], b[1]);
        mma_u8s8(ot, pa[1], b[2], b[3]);
        ldsm_x4(b, vb + 64);
        mma_u8s8(ot, pa[2], b[0], b[1]);
        mma_u8s8(ot, pa[3], b[2], b[3]);
#pragma unroll
        for (int e = 0; e < 4; ++e)
          acc[ct][e] = lq::fma(__int2float_rn(ot[e]), beta[e >> 1], acc[ct][e]);
      }
    }  // the tiles of one statistics block
  }
  // ---- out or state
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    if (rows[rr] >= a.Mq) continue;
    if (!a.finalize) {
      float* st = a.state + (rows[rr] * a.H + h) * SW;
#pragma unroll
      for (int ct = 0; ct < 16; ++ct) {
        st[8 * ct + 2 * t] = acc[ct][2 * rr];
        st[8 * ct + 2 * t + 1] = acc[ct][2 * rr + 1];
      }
      // [kDh + 2] = 0: no q8 cache in out (the Hopper kernel's, attention_hopper_int8.cu).
      if (t == 0) st[kDh] = m[rr], st[kDh + 1] = l[rr], st[kDh + 2] = 0.0f;
      continue;
    }
  }
  if (!a.finalize) return;
  // out = bf16(fl32(fl32(acc sv) / l)), sv of the last key's block (acc's units after the last
  // tile): the division by i8a::div_rd (one fp64 reciprocal of l per row; the IEEE division
  // where a tiny numerator needs it, int8_quant_warp.cuh).
  bool ieee = false;
#pragma unroll
  for (int ct = 0; ct < 16; ++ct)
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // acc becomes y = fl32(acc sv)
      acc[ct][i] = lq::mul(acc[ct][i], a.sv[h * kDh + 8 * ct + 2 * t + (i & 1)]);
      ieee |= i8w::out_needs_ieee(acc[ct][i]);
    }
  i8w::divide_by_row_sums(&acc[0][0], l, ieee);
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    if (rows[rr] >= a.Mq) continue;
    uint16_t* o = a.out + rows[rr] * a.o_rs + h * a.o_hs;
#pragma unroll
    for (int ct = 0; ct < 16; ++ct)
      *reinterpret_cast<uint32_t*>(o + 8 * ct + 2 * t) = static_cast<uint32_t>(f32_to_bf16_bits(acc[ct][2 * rr])) |
                                                         (static_cast<uint32_t>(f32_to_bf16_bits(acc[ct][2 * rr + 1])) << 16);
  }
}

constexpr size_t kAttnSmem = 2 * static_cast<size_t>(kStageBytes) + static_cast<size_t>(kWarps) * 16 * kRowPad;

Status check_bf16_kv(const char* op, const TensorView& k, const TensorView& v) {
  if (k.dtype != DType::bf16 || v.dtype != DType::bf16)
    return unsupported(op, std::string("needs bf16 k, v; got ") + dtype_name(k.dtype) + ", " + dtype_name(v.dtype));
  LS_CHECK_MSG(k.ndim == 3 && v.ndim == 3 && v.size(0) == k.size(0) && v.size(1) == k.size(1) &&
                   v.size(2) == k.size(2) && k.inner_contiguous() && v.inner_contiguous() &&
                   k.stride[1] == k.size(2) && v.stride[1] == v.size(2),
               std::string(op) + ": k, v must be [n, H, Dh] with contiguous heads; got " + k.shape_str() + ", " +
                   v.shape_str());
  if (k.size(2) != kDh)
    return unsupported(op, "the CUDA int8 attention kernels take head dim 128 only; got " + std::to_string(k.size(2)));
  return Status();
}

void check_keys(const Int8Keys& keys, int64_t H) {
  const int64_t n = keys.keys();
  LS_CHECK_MSG(keys.k8.dtype == DType::i8 && keys.k8.ndim == 3 && keys.k8.size(1) == H && keys.k8.size(2) == kDh &&
                   keys.k8.stride[2] == 1 && keys.k8.stride[1] == kDh && keys.k8.stride[0] % 16 == 0 &&
                   aligned16(keys.k8.data),
               "int8 keys: k8 must be i8 [n, H, 128], 16-byte aligned rows; got " + keys.k8.shape_str());
  LS_CHECK_MSG(keys.sk.dtype == DType::f32 && keys.sk.ndim == 2 && keys.sk.size(0) == n && keys.sk.size(1) == H &&
                   keys.sk.stride[1] == 1,
               "int8 keys: sk must be f32 [n, H]; got " + keys.sk.shape_str());
  LS_CHECK_MSG(keys.v8t.dtype == DType::i8 && keys.v8t.ndim == 3 && keys.v8t.size(0) == H &&
                   keys.v8t.size(1) == kDh && keys.v8t.size(2) == n && keys.v8t.stride[2] == 1 &&
                   keys.v8t.stride[1] >= n && keys.v8t.stride[1] % 16 == 0 && keys.v8t.stride[0] % 16 == 0 &&
                   aligned16(keys.v8t.data),
               "int8 keys: v8t must be i8 [H, 128, n] with ld >= n, ld % 16 == 0, 16-byte aligned; got " +
                   keys.v8t.shape_str());
  LS_CHECK_MSG(keys.vs.dtype == DType::f32 && keys.vs.ndim == 4 && keys.vs.size(1) == 2 && keys.vs.size(2) == H &&
                   keys.vs.size(3) == kDh && keys.vs.is_contiguous() &&
                   (reinterpret_cast<uintptr_t>(keys.vs.data) & 7u) == 0,
               "int8 keys: vs must be a contiguous, 8-byte aligned f32 [NB, 2, H, 128]; got " + keys.vs.shape_str());
  LS_CHECK_MSG(keys.k0 >= 0 && (n == 0 || (keys.k0 + n - 1) / kInt8StatBlock < keys.vs.size(0)),
               "int8 keys [" + std::to_string(keys.k0) + ", " + std::to_string(keys.k0 + n) + ") lie past the " +
                   std::to_string(keys.vs.size(0)) + " statistics blocks of their V-scale table");
}

// stats f32 [2 + NB, H, 128] (contiguous); returns NB.
int64_t check_stats(const char* op, const TensorView& stats, int64_t H) {
  LS_CHECK_MSG(stats.dtype == DType::f32 && stats.ndim == 3 && stats.size(0) >= 3 && stats.size(1) == H &&
                   stats.size(2) == kDh && stats.is_contiguous(),
               std::string(op) + ": stats must be a contiguous f32 [2 + NB, H, 128]; got " + stats.shape_str());
  return stats.size(0) - 2;
}

// Launch dimensions y, z are at most 65535: kernels loop past them.
unsigned grid_yz(int64_t n) { return static_cast<unsigned>(std::min<int64_t>(n, 65535)); }

}  // namespace

Status cuda_op_int8_key_stats(CudaContext& ctx, const TensorView& k, const TensorView& v, const TensorView& stats,
                              int64_t k0, bool reset) {
  LS_TRY(check_bf16_kv("int8_key_stats", k, v));
  const int64_t n = k.size(0), H = k.size(1), HD = H * kDh;
  const int64_t NB = check_stats("int8_key_stats", stats, H);
  LS_CHECK_MSG(k0 >= 0 && (n == 0 || (k0 + n - 1) / kInt8StatBlock < NB),
               "int8_key_stats: keys [" + std::to_string(k0) + ", " + std::to_string(k0 + n) + ") lie past the " +
                   std::to_string(NB) + " statistics blocks of stats " + stats.shape_str());
  const unsigned cols = static_cast<unsigned>(div_up(HD, 128));
  if (reset) {
    const int64_t total = (2 + NB) * HD;
    stats_init<<<static_cast<unsigned>(std::min<int64_t>(div_up(total, 256), 1 << 20)), 256, 0, ctx.stream>>>(
        stats.ptr<float>(), HD, total);
    LS_CUDA_CHECK_LAUNCH();
  }
  if (n == 0) return Status();
  // Segments = the statistics blocks of keys [k0, k0 + n); row groups of >= 64 rows per
  // segment, about 256 (segment, group) pairs in all (v2's 256 groups for one segment).
  const int64_t segments = (k0 + n - 1) / kInt8StatBlock - k0 / kInt8StatBlock + 1;
  const int64_t groups =
      std::max<int64_t>(1, std::min(div_up(std::min<int64_t>(n, kInt8StatBlock), 64), div_up(256, segments)));
  stats_kernel<<<dim3(cols, static_cast<unsigned>(groups), grid_yz(segments)), 128, 0, ctx.stream>>>(
      k.ptr<const uint16_t>(), k.stride[0], v.ptr<const uint16_t>(), v.stride[0], n, k0, HD, segments,
      stats.ptr<float>());
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

Status cuda_op_int8_prepare(CudaContext& ctx, const TensorView& k, const TensorView& v, const TensorView& stats,
                            const Int8Keys& keys) {
  LS_TRY(check_bf16_kv("int8_prepare", k, v));
  const int64_t n = k.size(0), H = k.size(1), HD = H * kDh;
  LS_CHECK_MSG(keys.keys() == n, "int8_prepare: " + std::to_string(n) + " keys into prepared keys of " +
                                     std::to_string(keys.keys()));
  const int64_t NB = check_stats("int8_prepare", stats, H);
  check_keys(keys, H);
  LS_CHECK_MSG(keys.vs.size(0) == NB, "int8_prepare: the V-scale table " + keys.vs.shape_str() + " and stats " +
                                          stats.shape_str() + " must have the same number of statistics blocks");
  LS_CHECK_MSG(keys.k8.stride[0] == HD && keys.sk.stride[0] == H, "int8_prepare writes contiguous k8 and sk");
  // Contract v4: K's scale groups lie in 128-key tiles (docs §3), so a prepare covers whole
  // tiles from a multiple of 128 (and runs to one or to the sequence's last key: the
  // caller's duty, backend.h).
  LS_TRY(check_int8_prepare_start(keys));
  if (n == 0) return Status();
  // The vs rows of the blocks these keys touch (a function of the statistics alone: a block
  // prepared in several calls gets the same bytes each time).
  const int64_t k0 = keys.k0, b0 = k0 / kInt8StatBlock, nb = (k0 + n - 1) / kInt8StatBlock - b0 + 1;
  vscale_kernel<<<dim3(static_cast<unsigned>(div_up(HD, 128)), grid_yz(nb)), 128, 0, ctx.stream>>>(
      stats.ptr<const float>(), HD, b0, nb, keys.vs.ptr<float>());
  LS_CUDA_CHECK_LAUNCH();
  // K (contract v4): the keys' own scales, k8 with their groups' scales, then the groups'
  // scales into sk (three launches, stream-ordered: see prepare_k_scale_kernel).
  const int64_t warps = n * H;
  const unsigned kblocks = static_cast<unsigned>(div_up(warps * 32, 256));
  prepare_k_scale_kernel<<<kblocks, 256, 0, ctx.stream>>>(k.ptr<const uint16_t>(), k.stride[0], n,
                                                          static_cast<int>(H), stats.ptr<const float>(),
                                                          keys.sk.ptr<float>());
  LS_CUDA_CHECK_LAUNCH();
  prepare_k_quant_kernel<<<kblocks, 256, 0, ctx.stream>>>(k.ptr<const uint16_t>(), k.stride[0], n,
                                                          static_cast<int>(H), stats.ptr<const float>(),
                                                          keys.k8.ptr<int8_t>(), keys.sk.ptr<const float>());
  LS_CUDA_CHECK_LAUNCH();
  const int64_t group_threads = div_up(n, kInt8KeyGroupTile) * kInt8KeyGroupStride * H;
  prepare_k_group_kernel<<<static_cast<unsigned>(div_up(group_threads, 256)), 256, 0, ctx.stream>>>(
      n, static_cast<int>(H), keys.sk.ptr<float>());
  LS_CUDA_CHECK_LAUNCH();
  prepare_v_kernel<<<dim3(static_cast<unsigned>(div_up(n, 32)), static_cast<unsigned>(H)), kDh, 0, ctx.stream>>>(
      v.ptr<const uint16_t>(), v.stride[0], n, k0, stats.ptr<const float>(), HD, keys.v8t.ptr<int8_t>(),
      keys.v8t.stride[1], keys.v8t.stride[0]);
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

Status cuda_op_attention_int8(CudaContext& ctx, const TensorView& q, const Int8Keys& keys, const TensorView& out,
                              const AttentionParams& p, bool p8_table) {
  if (q.dtype != DType::bf16 || out.dtype != DType::bf16)
    return unsupported("attention_int8", "needs bf16 q, out; got " + q.shape_str() + ", " + out.shape_str());
  LS_CHECK_MSG(q.ndim == 3 && out.ndim == 3 && out.size(0) == q.size(0) && out.size(1) == q.size(1) &&
                   out.size(2) == q.size(2) && q.inner_contiguous() && out.inner_contiguous(),
               "attention_int8 wants q, out [Mq, H, Dh]; got " + q.shape_str() + ", " + out.shape_str());
  const int64_t Mq = q.size(0), H = q.size(1), Dh = q.size(2), Mk = keys.keys();
  if (Dh != kDh)
    return unsupported("attention_int8", "the CUDA int8 attention kernel takes head dim 128 only; got " +
                                             std::to_string(Dh));
  if (p.kv_tile != kTile)
    return make_error(ErrorCode::invalid_argument,
                      "attention_int8: the CUDA int8 kernels fold once per 128-key tile: kv_tile must be 128; got " +
                          std::to_string(p.kv_tile));
  check_keys(keys, H);
  LS_TRY(check_attention_state(p, Mq, Mk, H, Dh));
  LS_CHECK_MSG(Mk > 0, "attention_int8 over zero keys");
  // Tiles never straddle a statistics block (contract v3): keys that cross a block boundary
  // start at a multiple of the tile (128 divides 4096), as the CPU requires.
  const int64_t k0 = keys.k0;
  if (k0 / kInt8StatBlock != (k0 + Mk - 1) / kInt8StatBlock && k0 % kTile != 0)
    return make_error(ErrorCode::invalid_argument,
                      "attention_int8: keys [" + std::to_string(k0) + ", " + std::to_string(k0 + Mk) +
                          ") cross a statistics block boundary (every " + std::to_string(kInt8StatBlock) +
                          " keys): kv_tile " + std::to_string(p.kv_tile) + " must divide " +
                          std::to_string(kInt8StatBlock) + " and the first key");
  LS_CHECK_MSG((out.stride[0] % 2 == 0) && (out.stride[1] % 2 == 0) &&
                   (reinterpret_cast<uintptr_t>(out.data) & 3u) == 0,
               "attention_int8: out rows must be 4-byte aligned");
  if (Mq == 0) return Status();
  const float scale = attention_scale(p, Dh);
  AttnArgs a{};
  a.q = q.ptr<const uint16_t>(), a.q_rs = q.stride[0], a.q_hs = q.stride[1];
  a.k8 = keys.k8.ptr<const int8_t>(), a.k8_rs = keys.k8.stride[0];
  a.sk = keys.sk.ptr<const float>(), a.sk_rs = keys.sk.stride[0];
  a.v8t = keys.v8t.ptr<const int8_t>(), a.v_hs = keys.v8t.stride[0], a.v_ld = keys.v8t.stride[1];
  a.vs = keys.vs.ptr<const float>();
  a.sv = a.vs + 2 * ((k0 + Mk - 1) / kInt8StatBlock) * H * kDh;  // sv of the last key's block
  a.k0 = k0;
  a.out = out.ptr<uint16_t>(), a.o_rs = out.stride[0], a.o_hs = out.stride[1];
  a.state = p.state.empty() ? nullptr : p.state.ptr<float>();
  a.Mq = Mq, a.Mk = Mk, a.H = static_cast<int>(H);
  a.cs = i8a::score_factor(scale, static_cast<int>(Dh));
  a.state_in = p.state_in, a.finalize = p.finalize;
  if (ctx.max_smem_optin < kAttnSmem)
    return unsupported("attention_int8", "the kernel needs " + std::to_string(kAttnSmem) +
                                             " bytes of shared memory per block; this device allows " +
                                             std::to_string(ctx.max_smem_optin));
  // Contract v4's grouped score where local tiles are absolute 128-key tiles (the keys start
  // on the grid: every call of a streamed sequence); else the per-key form, the same values.
  const bool grouped = k0 % kTile == 0;
  const auto kernel = p8_table ? (grouped ? attention_int8_kernel<true, true> : attention_int8_kernel<true, false>)
                               : (grouped ? attention_int8_kernel<false, true> : attention_int8_kernel<false, false>);
  LS_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kAttnSmem)));
  const dim3 grid(static_cast<unsigned>(div_up(Mq, kWarps * 16)), static_cast<unsigned>(H));
  kernel<<<grid, kWarps * 32, kAttnSmem, ctx.stream>>>(a);
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

}  // namespace ls::cuda
