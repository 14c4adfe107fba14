// The Hopper INT8 attention kernel (attention_hopper_int8.cu): sm_90a, wgmma with 8-bit
// operands (Q K^T: s8 x s8 -> s32; P V: u8 x s8 -> s32), TMA loads, a producer warpgroup and
// two consumer warpgroups, as the bf16 Hopper kernel (attention_hopper.cu). Head dim 128,
// kv_tile 128. The arithmetic is docs/int8-attention.md §4 exactly (the shared element
// functions of backend/int8_attention_math.h): the bytes equal the CPU reference's and the
// portable kernel's (attention_int8.cu), so the CUDA backend's attention_int8 dispatches here
// on sm_90 where the call fits (int8_hopper_fits) and to the portable kernel otherwise.
// No scratch: Q is quantised inside the kernel, the prepared keys are read as they are.
// Plain C++ header (no CUDA headers).
#pragma once

#include <cstdint>
#include <string>

#include "backend/backend.h"

namespace ls::cuda {

struct CudaContext;  // cuda_common.cuh

#if defined(LAYERSTREAM_HOPPER_ATTENTION)
// True where this build compiled the sm_90a kernel.
inline bool attention_hopper_int8_built() { return true; }

// "" where the Hopper kernel can run this call on this device, else why not (the backend then
// runs the portable kernel: the same bytes). Needs: an sm_90 device (`sm_90` true), head dim
// 128, kv_tile 128, H % 4 == 0 (the key scales sk [n, H] are read by TMA boxes of 4 heads:
// its row pitch must be a multiple of 16 bytes), q and out rows 8-byte aligned, k8 / v8t /
// sk 16-byte aligned with 16-byte row pitches, the V-scale table vs 8-byte aligned, and keys
// that cross a statistics block boundary (contract v3) starting at a multiple of 128.
std::string int8_hopper_fits(bool sm_90, const TensorView& q, const Int8Keys& keys, const TensorView& out,
                             const AttentionParams& p);

// The contract's attention_int8 (docs/int8-attention.md §5, v3) on the Hopper kernel: q, out
// bf16 [Mq, H, 128]; keys as Int8Keys (keys [k0, k0 + n) of the sequence, its V-scale table
// vs); p's kv_tile (128), scale and streamed state (f32 [Mq, H, 136]: acc in the units of
// the last folded key's statistics block, m, l, the CPU reference's layout). Call only where int8_hopper_fits
// said "" (checked again: unsupported with that message otherwise).
// p8_table: p8 by the threshold table instead of the fast ex2 byte (int8_p8_check.cuh).
// persistent: one CTA per SM looping over the (query tile, head) items (the default launch),
// else one CTA per item (the launch before session 14, kept for side-by-side timing:
// cuda::set_int8_attention_kernel(b, "hopper-grid")). The same bytes either way.
Status attention_hopper_int8(CudaContext& ctx, const TensorView& q, const Int8Keys& keys, const TensorView& out,
                             const AttentionParams& p, bool p8_table, bool persistent);
#else
inline bool attention_hopper_int8_built() { return false; }
inline std::string int8_hopper_fits(bool, const TensorView&, const Int8Keys&, const TensorView&,
                                    const AttentionParams&) {
  return "this layerstream was built without the Hopper kernels (CUDA architecture 90 not in "
         "CMAKE_CUDA_ARCHITECTURES)";
}
inline Status attention_hopper_int8(CudaContext&, const TensorView&, const Int8Keys&, const TensorView&,
                                    const AttentionParams&, bool, bool) {
  return make_error(ErrorCode::unsupported,
                    "attention hopper int8: this layerstream was built without the Hopper kernels");
}
#endif

}  // namespace ls::cuda
