// CPU per-head RMSNorm + split-half partial RoPE, in place on q or k (h3-model.md §2.8;
// docs/numerics.md §8).
//
// For token m, head h (x_d = x[m, h, d], d < Dh):
//   ss   = sum_d x_d * x_d           fixed 16-lane order of simd.h
//   rrms = 1 / sqrt(ss / fl32(Dh) + eps)
//   n_d  = bf16( (x_d * rrms) * w_d )                   (written back to x first)
//   for j < P (rot_dim = 2P, table rope[m, j] = (c, s), bf16 widened):
//     x0 = n_j, x1 = n_{j+P}
//     x[m, h, j]     = bf16( fl32(c * x0) - fl32(s * x1) )
//     x[m, h, j + P] = bf16( fl32(s * x0) + fl32(c * x1) )
//   dims >= 2P keep n_d.
// Each (m, h) reads and writes only its own Dh elements; no scratch memory is needed
// because n_d is stored as bf16 anyway and both members of a pair are read before
// either is written.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/simd.h"
#include "core/thread_pool.h"

namespace ls::cpu {

Status cpu_op_qk_norm_rope(const TensorView& x, const TensorView& w, const TensorView& rope, float eps) {
  LS_TRY(require_host("qk_norm_rope", {&x, &w, &rope}));
  const bool has_rope = !rope.empty();
  if (x.dtype != DType::bf16 || w.dtype != DType::bf16 || (has_rope && rope.dtype != DType::bf16))
    return unsupported_dtypes("qk_norm_rope",
                              std::string("x=") + dtype_name(x.dtype) + " w=" + dtype_name(w.dtype) +
                                  " rope=" + (has_rope ? dtype_name(rope.dtype) : "none"),
                              "x, w bf16; rope none or bf16");
  LS_CHECK_MSG(x.ndim == 3 && x.inner_contiguous(), "qk_norm_rope wants x bf16 [M, H, Dh]; got " + x.shape_str());
  const int64_t M = x.size(0), H = x.size(1), Dh = x.size(2);
  LS_CHECK_MSG(w.ndim == 1 && w.size(0) == Dh && w.inner_contiguous(),
               "qk_norm_rope: w must be [Dh = " + std::to_string(Dh) + "]; got " + w.shape_str());
  LS_CHECK_MSG(Dh > 0, "qk_norm_rope over an empty head");
  int64_t P = 0;
  if (has_rope) {
    LS_CHECK_MSG(rope.ndim == 3 && rope.size(0) == M && rope.size(2) == 2 && rope.inner_contiguous(),
                 "qk_norm_rope: rope must be [M = " + std::to_string(M) + ", P, 2]; got " + rope.shape_str());
    P = rope.size(1);
    LS_CHECK_MSG(2 * P <= Dh, "qk_norm_rope: rotary dims 2P = " + std::to_string(2 * P) + " exceed head dim " +
                                  std::to_string(Dh));
  }

  const uint16_t* wp = w.ptr<const uint16_t>();
  const float count = static_cast<float>(Dh);  // exact for Dh < 2^24
  parallel_for(M, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, H * Dh)), [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      for (int64_t h = 0; h < H; ++h) {
        uint16_t* xr = static_cast<uint16_t*>(x.at(m, h));  // bf16 [Dh]
        const float ss = dot16(xr, xr, Dh);
        const float rrms = 1.0f / std::sqrt(ss / count + eps);
        for (int64_t d = 0; d < Dh; ++d)
          xr[d] = f32_to_bf16((widen_scalar<uint16_t>(xr[d]) * rrms) * widen_scalar<uint16_t>(wp[d]));
        if (!has_rope) continue;
        for (int64_t j = 0; j < P; ++j) {
          const uint16_t* cs = static_cast<const uint16_t*>(rope.at(m, j));  // bf16 (cos, sin)
          const float c = widen_scalar<uint16_t>(cs[0]);
          const float s = widen_scalar<uint16_t>(cs[1]);
          const float x0 = widen_scalar<uint16_t>(xr[j]);
          const float x1 = widen_scalar<uint16_t>(xr[j + P]);
          const float c_x0 = c * x0, s_x1 = s * x1, s_x0 = s * x0, c_x1 = c * x1;
          xr[j] = f32_to_bf16(c_x0 - s_x1);
          xr[j + P] = f32_to_bf16(s_x0 + c_x1);
        }
      }
    }
  });
  return Status();
}

}  // namespace ls::cpu
