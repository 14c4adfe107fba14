// The Hopper INT8 attention kernel (attention_hopper_int8.cu): sm_90a, wgmma with 8-bit
// operands (Q K^T: s8 x s8 -> s32; P V: u8 x s8 -> s32), TMA loads, a producer warp and two
// consumer warpgroups, as the bf16 Hopper kernel (attention_hopper.cu). Head dim 128 only.
//
// Issue 26. The arithmetic is the INT8 spec (helper int8's docs/int8-attention.md; the
// kernel's own choices where that spec leaves an order open are in the .cu file comment).
// The kernel takes K and V already prepared once per block (after pass 1: key statistics
// over ALL keys, rotation, per-row / per-channel quantisation) and quantises Q itself per
// call (rotation + per-row scale: row-local, so slice-invariant).
//
// Entry point until the backend's INT8 dispatch lands (helper int8): attention_hopper_int8()
// below, raw device pointers (no TensorView, so that a standalone harness can link it
// without the rest of the library). Plain C++ header (no CUDA headers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/backend.h"

namespace ls::cuda {

struct CudaContext;  // cuda_common.cuh

// The rotation's fixed sign vector (docs/int8-attention.md §3, helper int8): channel c is
// negated when bit 31 of (uint32)(c * 2654435761u) is set. As 32-bit words (bit c % 32 of
// word c / 32) for the kernel's Q quantisation, whose lane l holds channels 4l..4l+3.
constexpr bool int8_negative_sign(int c) { return ((static_cast<uint32_t>(c) * 2654435761u) >> 31) != 0; }
constexpr uint32_t int8_sign_word(int w) {
  uint32_t r = 0;
  for (int b = 0; b < 32; ++b) r |= (int8_negative_sign(32 * w + b) ? 1u : 0u) << b;
  return r;
}

// The configuration a plain call runs (the fastest measured, bench/results/issue26/), and
// the one with the contract's bytes (docs/int8-attention.md; kv_tile 128).
inline constexpr int kInt8DefaultConfig = 2;
inline constexpr int kInt8ContractConfig = 7;

struct Int8AttentionCall {
  // bf16 q [Mq, H, 128]: row and head strides in elements (head stride 128 when packed).
  const uint16_t* q = nullptr;
  int64_t q_row_stride = 0, q_head_stride = 128;
  // s8 k8 [Mk, H, 128] (head stride 128, row stride k8_row_stride bytes, a multiple of 16)
  // and f32 sk [Mk, H] (contiguous): the prepared keys of this call (all keys, or one
  // streamed chunk of whole kv_tiles).
  const int8_t* k8 = nullptr;
  int64_t k8_row_stride = 0;
  const float* sk = nullptr;
  // s8 v8t [H, 128, key pitch] (the prepared V transposed per head: keys contiguous; key j
  // of head h, channel c at h * 128 * pitch + c * pitch + j; pitch >= Mk, a multiple of
  // 16) and f32 sv [H, 128].
  const int8_t* v8t = nullptr;
  int64_t v8t_key_pitch = 0;
  // true: within each aligned group of 16 keys, stored position p holds key
  // 2 (p / 4) + (p % 2) + 8 ((p % 4) / 2) (int8_v8t_key_at), the pitch covers Mk rounded up
  // to 16 and the padding is zeros. This puts each lane's own P values where its u8 A
  // fragment wants them (no shuffles; the same holds for mma.sync m16n8k32). A layout
  // proposal for helper int8's prepared V; false: keys in order.
  bool v8t_keys_permuted = false;
  const float* sv = nullptr;
  // bf16 out [Mq, H, 128].
  uint16_t* out = nullptr;
  int64_t out_row_stride = 0, out_head_stride = 128;
  int64_t Mq = 0, Mk = 0, H = 0;
  int64_t kv_tile = 8192;
  float scale = 0.0f;  // softmax scale; 0 = 1/sqrt(128)
  // Streamed keys (backend.h's AttentionParams): f32 [Mq, H, 136] or null; its layout in
  // the .cu file comment.
  float* state = nullptr;
  bool state_in = false;
  bool finalize = true;
  // Device scratch of attention_hopper_int8_scratch_bytes(Mq, Mk, H) bytes, 256-aligned
  // (the backend's workspace; this function allocates nothing).
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
};

// The key stored at position p of a group of 16 in the permuted V^T layout.
constexpr int int8_v8t_key_at(int p) { return 2 * (p / 4) + (p % 2) + 8 * ((p % 4) / 2); }

#if defined(LAYERSTREAM_HOPPER_ATTENTION) || defined(LS_HOPPER8_STANDALONE)
// Scratch bytes one call needs: q8 [Mq, H, 128], sq [Mq, H], sk transposed [H, Mk rounded
// up to 128].
size_t attention_hopper_int8_scratch_bytes(int64_t Mq, int64_t Mk, int64_t H);

// config (tests and benchmarks; the .cu lists them): 0-3 the default's bytes (lazy flush;
// ping-pong or free-running, 4 or 3 stages), 4 the per-block flush (other bytes), 7 the
// contract's arithmetic exactly (docs/int8-attention.md §4: its score order, exp2
// polynomial and per-tile fold; kv_tile 128 only; built where helper int8's
// backend/int8_attention_math.h is present), 10 a timing diagnostic with wrong results. Runs the call on `stream` (a cudaStream_t; null =
// the legacy default stream). Returns "" on success, else a message naming the problem.
std::string attention_hopper_int8(const Int8AttentionCall& call, void* stream, int config = kInt8DefaultConfig);

// True where this build compiled the sm_90a kernel.
inline bool attention_hopper_int8_built() { return true; }

// The same call on the contract's views (docs/int8-attention.md §5, Int8Keys' fields), for
// the backend's attention_int8 on sm_90: q, out bf16 [Mq, H, 128] (strided rows, 8-byte
// aligned); k8 i8 [n, H, 128] (row-strided, head stride 128); sk f32 [n, H] contiguous;
// v8t i8 [H, 128, n] with strides {128 ld, ld, 1}; sv f32 [H, 128]; p's kv_tile, scale and
// streamed state (f32 [Mq, H, 136]: acc, m, l, the CPU reference's layout, checked by
// check_attention_state); scratch u8 of at least attention_hopper_int8_scratch_bytes(Mq, n,
// H) bytes (a workspace piece, 256-aligned). unsupported with a message where a shape,
// dtype, alignment or kv_tile does not fit, or the device is not sm_90.
Status attention_hopper_int8(CudaContext& ctx, const TensorView& q, const TensorView& k8, const TensorView& sk,
                             const TensorView& v8t, const TensorView& sv, const TensorView& out,
                             const AttentionParams& p, const TensorView& scratch, int config = kInt8ContractConfig);
#else
inline size_t attention_hopper_int8_scratch_bytes(int64_t, int64_t, int64_t) { return 0; }
inline std::string attention_hopper_int8(const Int8AttentionCall&, void*, int = 0) {
  return "attention hopper int8: this layerstream was built without the Hopper kernels (CUDA architecture 90 not in "
         "CMAKE_CUDA_ARCHITECTURES)";
}
inline bool attention_hopper_int8_built() { return false; }
inline Status attention_hopper_int8(CudaContext&, const TensorView&, const TensorView&, const TensorView&,
                                    const TensorView&, const TensorView&, const TensorView&, const AttentionParams&,
                                    const TensorView&, int = 7) {
  return make_error(ErrorCode::unsupported, attention_hopper_int8(Int8AttentionCall{}, nullptr));
}
#endif

}  // namespace ls::cuda
