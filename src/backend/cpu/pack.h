// The CPU latent packing ops (Backend::pack_video_rows, pack_audio_rows,
// unpack_video_rows, unpack_audio_rows; the arithmetic is written at their declaration
// in backend/backend.h). They are the reference of the CUDA kernels
// (src/backend/cuda/pack.cu) and the engine's host path: with any backend, host latents
// are packed (and host velocities unpacked) by these functions on host memory.
#pragma once

#include "backend/backend.h"

namespace ls::cpu {

Status cpu_op_pack_video_rows(const TensorView& lat, int64_t r0, const TensorView& out);
Status cpu_op_pack_audio_rows(const TensorView& lat, float carry, int64_t r0, const TensorView& out);
Status cpu_op_unpack_video_rows(const TensorView& rows, const TensorView& mask, int64_t r0, const TensorView& out);
Status cpu_op_unpack_audio_rows(const TensorView& rows, const TensorView& mask, const Backend::AudioCarryOut& c,
                                int64_t r0, const TensorView& out);

// The four ops' argument checks (dtypes, shapes, the row range in the latent's rows),
// shared by the CPU ops above and the CUDA kernels (src/backend/cuda/pack.cu), so both
// refuse the same calls with the same messages. Where the views live is each backend's
// own check (require_host / require_device), made first.
Status check_pack_video_args(const TensorView& lat, int64_t r0, const TensorView& out);
Status check_pack_audio_args(const TensorView& lat, int64_t r0, const TensorView& out);
Status check_unpack_video_args(const TensorView& rows, const TensorView& mask, int64_t r0, const TensorView& out);
Status check_unpack_audio_args(const TensorView& rows, const TensorView& mask, const Backend::AudioCarryOut& ca,
                               int64_t r0, const TensorView& out);

}  // namespace ls::cpu
