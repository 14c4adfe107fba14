// The cuDNN attention path (attention_cudnn.cu): cuDNN 9's fused flash-attention
// forward run once per key tile of kv_tile keys, the tiles merged by a log-sum-exp rule
// in fp32 (numerics: docs/cuda.md, "cuDNN attention path").
//
// Selected by the backend's numerics (CudaContext::numerics.attention == cudnn, the
// resolved default where the build has cuDNN; native selects the mma.sync kernel of
// attention.cu). The query chunk (numerics.cudnn_q_chunk), graph form and skipped
// heuristic configs come from the same struct. Plain C++ header (no CUDA headers), so
// tests and the executor can size the workspace.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/backend.h"

namespace ls::cuda {

struct CudaContext;  // cuda_common.cuh

// True when ctx's resolved numerics select this path (numerics.attention == cudnn).
bool attention_cudnn_selected(const CudaContext& ctx);

// True when this build has cuDNN (LAYERSTREAM_CUDNN).
bool attention_cudnn_built();

// Bytes of Backend workspace (set_workspace) the cuDNN path needs for H heads of
// head_dim Dh at q_chunk queries per cuDNN call (Numerics::cudnn_q_chunk): query chunk
// staging, per-tile O_t / LSE_t, the fp32 merge state and a fixed reserve for cuDNN's
// own workspace. Independent of Mq, Mk and kv_tile. (The backend's description,
// src/backend/description.cpp cudnn_attention_workspace_bytes, states the formula without
// a device; tests/cuda/test_backend_description_cuda.cpp checks the two agree.)
size_t attention_cudnn_workspace_bytes(int64_t H, int64_t Dh, int64_t q_chunk = kDefaultCudnnQChunk);

// Same contract and argument checks as Backend::attention (bf16 q, k, v, out
// [rows, H, Dh], strided rows and heads, 16-byte aligned; p.state for streamed keys, in
// this path's own state layout). Fails with a Status when the build has no cuDNN, the
// workspace is too small, or cuDNN refuses the graph (Diagnostics::cudnn_verbose says why).
Status attention_cudnn(CudaContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const AttentionParams& p);

}  // namespace ls::cuda
