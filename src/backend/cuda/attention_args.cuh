// The kernel arguments both built-in attention kernels take (attention.cu's native
// kernel, attention_hopper.cu's Hopper kernel), and the one function that fills them
// from an attention call, so the two cannot drift apart: output pointer and strides,
// query and key counts, kv_tile, the softmax scale in the log2 domain, and the streamed-
// key state (backend.h's AttentionParams::state, in the native kernel's layout).
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/cuda_common.cuh"

namespace ls::cuda {

struct AttnCommonArgs {
  uint16_t* o;       // bf16 [Mq, H, D]
  int64_t so, ho;    // o's row and head strides (elements)
  int64_t Mq, Mk, kv_tile;
  float scale_log2;  // softmax scale * log2(e)
  float* state;      // f32 [Mq, H, D + kAttentionStateExtra], contiguous, or null
  bool state_in;     // start from `state` instead of (-inf, 0, 0)
  bool finalize;     // write o; else save the running state to `state`
};

// Fills `a` from the call (q [Mq, H, D], k [Mk, H, D], out, p; shapes already checked by
// the caller). unsupported, naming `who`, where the state is not 8-byte aligned (the
// kernels store it as float2) or the softmax scale is not positive. The scale is
// PyTorch's default when p.scale is 0: fl32(1 / sqrt(D)) computed in double, as the CPU
// reference does.
inline Status fill_attention_args(const char* who, const TensorView& q, const TensorView& k, const TensorView& out,
                                  const AttentionParams& p, AttnCommonArgs& a) {
  constexpr float kLog2e = 1.4426950408889634f;
  a.o = out.ptr<uint16_t>();
  a.so = out.stride[0];
  a.ho = out.stride[1];
  a.Mq = q.shape[0];
  a.Mk = k.shape[0];
  a.kv_tile = p.kv_tile;
  a.state = p.state.empty() ? nullptr : p.state.ptr<float>();
  a.state_in = p.state_in;
  a.finalize = p.finalize;
  if (a.state && (reinterpret_cast<uintptr_t>(a.state) & 7u) != 0)
    return unsupported(who, "the state needs 8-byte aligned memory (an arena piece is)");
  const int64_t Dh = q.shape[2];
  const float scale = attention_scale(p, Dh);
  if (!(scale > 0.0f)) return unsupported(who, "softmax scale must be positive");
  a.scale_log2 = scale * kLog2e;
  return Status();
}

}  // namespace ls::cuda
