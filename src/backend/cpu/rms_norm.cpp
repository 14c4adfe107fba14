// CPU RMSNorm: out = bf16( x * rrms * w ), one rounding (h3-model.md §3.2, fused form).
//
// Per row (docs/numerics.md §3):
//   ss   = sum_d x_d * x_d          fixed 16-lane order of simd.h (depends only on D)
//   mean = ss / fl32(D)             fp32 division
//   rrms = 1 / sqrt(mean + eps)     fp32: add, correctly rounded sqrt, division
//   out_d = bf16( (x_d * rrms) * w_d )   two fp32 products, one bf16 rounding
// A row depends on that row alone; `out` may alias `x` (the sum is complete before
// the row is written).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/simd.h"
#include "core/thread_pool.h"

namespace ls::cpu {

Status cpu_op_rms_norm(const TensorView& x, const TensorView& w, float eps, const TensorView& out) {
  LS_TRY(require_host("rms_norm", {&x, &w, &out}));
  if (x.dtype != DType::bf16 || w.dtype != DType::bf16 || out.dtype != DType::bf16)
    return unsupported_dtypes("rms_norm",
                              std::string("x=") + dtype_name(x.dtype) + " w=" + dtype_name(w.dtype) +
                                  " out=" + dtype_name(out.dtype),
                              "x, w, out all bf16");
  LS_CHECK_MSG(x.ndim == 2 && out.ndim == 2 && w.ndim == 1,
               "rms_norm wants x [M, D], w [D], out [M, D]; got " + x.shape_str() + ", " + w.shape_str() + ", " +
                   out.shape_str());
  const int64_t M = x.size(0), D = x.size(1);
  LS_CHECK_MSG(w.size(0) == D && out.size(0) == M && out.size(1) == D,
               "rms_norm shape mismatch: x " + x.shape_str() + ", w " + w.shape_str() + ", out " + out.shape_str());
  LS_CHECK(x.inner_contiguous() && out.inner_contiguous() && w.inner_contiguous());
  LS_CHECK_MSG(D > 0, "rms_norm over an empty row");

  const uint16_t* wp = w.ptr<const uint16_t>();
  const float count = static_cast<float>(D);  // exact for D < 2^24
  parallel_for(M, std::max<int64_t>(1, 4096 / D), [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const uint16_t* xr = row_ptr<const uint16_t>(x, m);
      uint16_t* o = row_ptr<uint16_t>(out, m);
      const float ss = dot16(xr, xr, D);
      const float mean = ss / count;
      const float rrms = 1.0f / std::sqrt(mean + eps);
      for (int64_t d = 0; d < D; ++d) {
        const float xv = widen_scalar<uint16_t>(xr[d]);
        const float wv = widen_scalar<uint16_t>(wp[d]);
        o[d] = f32_to_bf16((xv * rrms) * wv);
      }
    }
  });
  return Status();
}

}  // namespace ls::cpu
