// CPU elementwise ops: add (token-refiner residual), swiglu, silu (docs/numerics.md §5).
//
//   add:     x = round_x( x + y )                      fp32 add, one rounding (bf16 or f32)
//   silu:    silu(g) = g / (1 + exp(-g))               fp32: expf (glibc), add, divide
//   swiglu:  out[m, i] = bf16( bf16(silu(u[m, i])) * u[m, F + i] )
//            (PyTorch eager: silu rounded to bf16, then multiplied in place by up)
// No reduction anywhere; every element depends on its own inputs only.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/simd.h"
#include "core/thread_pool.h"

namespace ls::cpu {
namespace {

inline float silu_f32(float g) {
  const float e = std::exp(-g);
  const float den = 1.0f + e;
  return g / den;
}

inline int64_t row_grain(int64_t width) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, width)); }

}  // namespace

Status cpu_op_add(const TensorView& x, const TensorView& y) {
  LS_TRY(require_host("add", {&x, &y}));
  if (x.dtype != y.dtype || (x.dtype != DType::bf16 && x.dtype != DType::f32))
    return unsupported_dtypes("add", std::string("x=") + dtype_name(x.dtype) + " y=" + dtype_name(y.dtype),
                              "x, y both bf16 or both f32");
  LS_CHECK_MSG(x.ndim == 2 && y.ndim == 2 && x.size(0) == y.size(0) && x.size(1) == y.size(1),
               "add: x and y must be [M, D]; got " + x.shape_str() + ", " + y.shape_str());
  LS_CHECK(x.inner_contiguous() && y.inner_contiguous());
  const int64_t M = x.size(0), D = x.size(1);
  const bool bf16 = x.dtype == DType::bf16;
  parallel_for(M, row_grain(D), [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      if (bf16) {
        uint16_t* xr = row_ptr<uint16_t>(x, m);
        const uint16_t* yr = row_ptr<const uint16_t>(y, m);
        for (int64_t d = 0; d < D; ++d)
          xr[d] = f32_to_bf16(widen_scalar<uint16_t>(xr[d]) + widen_scalar<uint16_t>(yr[d]));
      } else {
        float* xr = row_ptr<float>(x, m);
        const float* yr = row_ptr<const float>(y, m);
        for (int64_t d = 0; d < D; ++d) xr[d] = xr[d] + yr[d];
      }
    }
  });
  return Status();
}

Status cpu_op_swiglu(const TensorView& u, const TensorView& out) {
  LS_TRY(require_host("swiglu", {&u, &out}));
  if (u.dtype != DType::bf16 || out.dtype != DType::bf16)
    return unsupported_dtypes("swiglu", std::string("u=") + dtype_name(u.dtype) + " out=" + dtype_name(out.dtype),
                              "u, out bf16");
  LS_CHECK_MSG(u.ndim == 2 && out.ndim == 2 && u.size(0) == out.size(0) && u.size(1) == 2 * out.size(1),
               "swiglu wants u [M, 2F], out [M, F]; got " + u.shape_str() + ", " + out.shape_str());
  LS_CHECK(u.inner_contiguous() && out.inner_contiguous());
  const int64_t M = u.size(0), F = out.size(1);
  parallel_for(M, row_grain(F), [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const uint16_t* gate = row_ptr<const uint16_t>(u, m);  // bf16 [F]
      const uint16_t* up = gate + F;                          // bf16 [F]
      uint16_t* o = row_ptr<uint16_t>(out, m);
      for (int64_t i = 0; i < F; ++i) {
        const float s = round_bf16(silu_f32(widen_scalar<uint16_t>(gate[i])));
        o[i] = f32_to_bf16(s * widen_scalar<uint16_t>(up[i]));
      }
    }
  });
  return Status();
}

Status cpu_op_silu(const TensorView& x) {
  LS_TRY(require_host("silu", {&x}));
  if (x.dtype != DType::f32) return unsupported_dtypes("silu", std::string("x=") + dtype_name(x.dtype), "x f32");
  LS_CHECK_MSG(x.ndim == 2 && x.inner_contiguous(), "silu wants x f32 [M, N]; got " + x.shape_str());
  const int64_t M = x.size(0), N = x.size(1);
  parallel_for(M, row_grain(N), [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      float* xr = row_ptr<float>(x, m);
      for (int64_t i = 0; i < N; ++i) xr[i] = silu_f32(xr[i]);
    }
  });
  return Status();
}

}  // namespace ls::cpu
