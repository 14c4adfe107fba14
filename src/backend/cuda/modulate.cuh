// AdaLN modulation pieces shared by modulate.cu (the op) and rms_norm.cu (the fused
// rms_norm_modulate), so both compute a row with the same code and so the same bits.
#pragma once

#include "backend/cuda/cuda_common.cuh"

namespace ls::cuda {

// A modulation table as the kernels take it: bf16|f32 [R, D], rows strided, inner
// contiguous.
inline bool modulation_table_ok(const TensorView& t, int64_t D) {
  return t.ndim == 2 && t.shape[1] == D && t.inner_contiguous() && (t.dtype == DType::bf16 || t.dtype == DType::f32);
}

// modulate's bf16 arithmetic (h3-model.md §2.6) on eight consecutive values h of one row,
// with the table elements scale[sc0 + i], shift[sh0 + i] (bf16, or f32 when tab_f32):
//   o[i] = bf16(h[i] * bf16(1 + bf16(scale))) + bf16(shift)   for i < n, else 0;
// the caller's bf16 store rounds the sum (separate multiplies and adds: -fmad=false).
__device__ __forceinline__ void modulate8_bf16(const float h[8], int n, const void* scale, int64_t sc0,
                                               const void* shift, int64_t sh0, bool tab_f32, float o[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    if (i < n) {
      const float sc = round_bf16(1.0f + round_bf16(load_bf16_or_f32(scale, tab_f32, sc0 + i)));
      const float sh = round_bf16(load_bf16_or_f32(shift, tab_f32, sh0 + i));
      o[i] = round_bf16(h[i] * sc) + sh;
    } else {
      o[i] = 0.0f;
    }
  }
}

}  // namespace ls::cuda
