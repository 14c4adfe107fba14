// The cuDNN attention path (attention_cudnn.cu): cuDNN 9's fused flash-attention
// forward run once per key tile of kv_tile keys, the tiles merged by a log-sum-exp rule
// in fp32 (numerics: docs/cuda.md, "cuDNN attention path").
//
// Selected per call by the environment (attention_cudnn_selected below): the default
// where the build has cuDNN; LAYERSTREAM_ATTENTION=native selects the mma.sync kernel of
// attention.cu. Plain C++ header (no CUDA headers), so tests
// and the executor can size the workspace.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/backend.h"

namespace ls::cuda {

struct CudaContext;  // cuda_common.cuh

// Which attention path runs (read at every call; a process should not change it between
// the calls of one forward). LAYERSTREAM_ATTENTION=cudnn | native; unset: cuDNN where the
// build has it (the fast path), else the native kernel. =cudnn in a build without cuDNN
// selects this path so that attention_cudnn can say so.
bool attention_cudnn_selected();

// True when this build has cuDNN (LAYERSTREAM_CUDNN).
bool attention_cudnn_built();

// Bytes of Backend workspace (set_workspace) the cuDNN path needs for H heads of
// head_dim Dh: query chunk staging, per-tile O_t / LSE_t, the fp32 merge state and a
// fixed reserve for cuDNN's own workspace. Independent of Mq, Mk and kv_tile.
size_t attention_cudnn_workspace_bytes(int64_t H, int64_t Dh);

// Same contract and argument checks as Backend::attention (bf16 q, k, v, out
// [rows, H, Dh], strided rows and heads, 16-byte aligned; p.state for streamed keys, in
// this path's own state layout). Fails with a Status when the build has no cuDNN, the
// workspace is too small, or cuDNN refuses the graph (LAYERSTREAM_CUDNN_VERBOSE=1 says why).
Status attention_cudnn(CudaContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const AttentionParams& p);

}  // namespace ls::cuda
