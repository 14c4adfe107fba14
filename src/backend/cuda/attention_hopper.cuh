// The Hopper attention kernel (attention_hopper.cu): FlashAttention-3 style (TMA, wgmma,
// a producer warpgroup and two consumer warpgroups) on sm_90a, inside the kv_tile
// contract (backend.h, DESIGN.md §1.2), head dim 128 only.
//
// Selected by the backend's numerics (CudaContext::numerics.attention == hopper: given, or
// auto's choice for a model of head dim 128 on sm_90, cuda_backend.cu resolve). The file is compiled for sm_90a only, and only when 90 is among the
// build's CUDA architectures (CMake defines LAYERSTREAM_HOPPER_ATTENTION then); in other
// builds the functions below say "unavailable" with a message that names the way out.
// Plain C++ header (no CUDA headers).
#pragma once

#include <string>

#include "backend/backend.h"

namespace ls::cuda {

struct CudaContext;  // cuda_common.cuh

#ifdef LAYERSTREAM_HOPPER_ATTENTION
// True: this build has the kernel.
bool attention_hopper_built();
// OK where cuda:device can run it (compute capability 9.0), else unsupported naming the
// device's architecture.
Status attention_hopper_available(int device);
// Same contract and argument checks as Backend::attention (bf16 q, k, v, out
// [rows, H, 128], strided rows and heads, 16-byte aligned; p.state for streamed keys in
// the native kernel's state layout). Other head dims are refused with a Status.
Status attention_hopper(CudaContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const AttentionParams& p);
// The kernel configuration ("schedule") calls launch, for the tests and benchmarks that
// compare them (attention_hopper.cu lists them): 0-5, 13 and 20-23 are speed knobs only
// and give the default's bytes (tested); 6 (the first form), 7 and 8 (176-key blocks),
// 16-19 (part of the exponentials by an FMA-pipe polynomial) have arithmetic of their
// own (other bits, each a fixed function of the inputs; tested like the default); 10 and
// 11 are timing diagnostics with WRONG results (no K/V reloads; no softmax). Default 4;
// another number makes the call return unsupported. Process-wide; read when a call is
// queued. Never part of Numerics: nothing but a test or a benchmark sets it.
void set_attention_hopper_schedule(int schedule);
int attention_hopper_schedule();
#else
inline void set_attention_hopper_schedule(int) {}
inline int attention_hopper_schedule() { return 0; }
inline bool attention_hopper_built() { return false; }
inline Status attention_hopper_available(int) {
  return make_error(ErrorCode::unsupported,
                    "attention hopper: this layerstream was built without the Hopper kernel (CUDA architecture 90 "
                    "not in CMAKE_CUDA_ARCHITECTURES); use attention auto, native or cudnn, or rebuild with 90");
}
inline Status attention_hopper(CudaContext&, const TensorView&, const TensorView&, const TensorView&,
                               const TensorView&, const AttentionParams&) {
  return attention_hopper_available(0);
}
#endif

}  // namespace ls::cuda
