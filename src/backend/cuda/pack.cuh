// The CUDA latent packing ops (pack.cu): Backend::pack_video_rows, pack_audio_rows,
// unpack_video_rows, unpack_audio_rows, with the arithmetic written at their declaration
// in backend/backend.h and the CPU ops (src/backend/cpu/pack.cpp) as the reference
// (tests/cuda/test_pack_ops.cpp: memcmp). Every view on the backend's device.
#pragma once

#include "backend/backend.h"
#include "backend/cuda/cuda_common.cuh"

namespace ls::cuda {

Status cuda_op_pack_video_rows(CudaContext& ctx, const TensorView& lat, int64_t r0, const TensorView& out);
Status cuda_op_pack_audio_rows(CudaContext& ctx, const TensorView& lat, float carry, int64_t r0, const TensorView& out);
Status cuda_op_unpack_video_rows(CudaContext& ctx, const TensorView& rows, const TensorView& mask, int64_t r0,
                                 const TensorView& out);
Status cuda_op_unpack_audio_rows(CudaContext& ctx, const TensorView& rows, const TensorView& mask,
                                 const Backend::AudioCarryOut& c, int64_t r0, const TensorView& out);

}  // namespace ls::cuda
