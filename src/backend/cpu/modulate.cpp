// CPU AdaLN modulation and gated residual add (h3-model.md §2.6, §3.4).
//
// modulate, row m, table row r = rows[m], element d (docs/numerics.md §4):
//   out bf16:  sc = bf16(1 + bf16(scale[r, d]));  t = bf16(in * sc);  out = bf16(t + bf16(shift[r, d]))
//              (f32 tables are first rounded to bf16, like PyTorch's cast to the activation dtype)
//   out f32:   out = fl32( fl32(in * fl32(1 + scale[r, d])) + shift[r, d] )   (tables must be f32)
// gated_add (in place on the residual x):
//   x = bf16( fma(y, bf16(gate[r, d]), x) )      one fp32 fma (std::fma), then one bf16 rounding
// Purely elementwise: a row depends on that row (and its table row) alone.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/simd.h"
#include "core/thread_pool.h"

namespace ls::cpu {
namespace {

// Table element (r, d) of a bf16|f32 [R, D] view as fp32.
inline float table_at(const TensorView& t, int64_t r, int64_t d) {
  if (t.dtype == DType::f32) return row_ptr<const float>(t, r)[d];
  return widen_scalar<uint16_t>(row_ptr<const uint16_t>(t, r)[d]);
}

// rows[m] checked against the table height (a bad index is a bug in the caller).
inline int64_t table_row(const TensorView& rows, int64_t m, int64_t R) {
  const int64_t r = static_cast<const int32_t*>(rows.data)[m * rows.stride[0]];
  LS_CHECK_MSG(r >= 0 && r < R, "modulation table row " + std::to_string(r) + " out of range [0, " +
                                    std::to_string(R) + ")");
  return r;
}

void check_rows_view(const char* op, const TensorView& rows, int64_t M) {
  LS_CHECK_MSG(rows.ndim == 1 && rows.size(0) == M,
               std::string(op) + ": rows must be i32 [M = " + std::to_string(M) + "]; got " + rows.shape_str());
}

void check_table(const char* op, const TensorView& t, int64_t D) {
  LS_CHECK_MSG(t.ndim == 2 && t.size(1) == D && t.inner_contiguous(),
               std::string(op) + ": table must be [R, " + std::to_string(D) + "] with contiguous rows; got " +
                   t.shape_str());
}

}  // namespace

Status cpu_op_modulate(const TensorView& in, const TensorView& shift, const TensorView& scale, const TensorView& rows,
                       const TensorView& out) {
  LS_TRY(require_host("modulate", {&in, &shift, &scale, &rows, &out}));
  const std::string got = std::string("in=") + dtype_name(in.dtype) + " shift=" + dtype_name(shift.dtype) +
                          " scale=" + dtype_name(scale.dtype) + " rows=" + dtype_name(rows.dtype) +
                          " out=" + dtype_name(out.dtype);
  constexpr const char* kSupported =
      "in bf16, rows i32, and either out bf16 with bf16|f32 tables, or out f32 with f32 tables "
      "(for bf16 tables and an f32 result, modulate into bf16 and convert)";
  auto is_table_type = [](DType t) { return t == DType::bf16 || t == DType::f32; };
  if (in.dtype != DType::bf16 || rows.dtype != DType::i32 || !is_table_type(shift.dtype) ||
      !is_table_type(scale.dtype))
    return unsupported_dtypes("modulate", got, kSupported);
  const bool out_f32 = out.dtype == DType::f32;
  if (out.dtype != DType::bf16 && !out_f32) return unsupported_dtypes("modulate", got, kSupported);
  if (out_f32 && (shift.dtype != DType::f32 || scale.dtype != DType::f32))
    return unsupported_dtypes("modulate", got, kSupported);

  LS_CHECK_MSG(in.ndim == 2 && out.ndim == 2 && in.size(0) == out.size(0) && in.size(1) == out.size(1),
               "modulate: in and out must be [M, D]; got " + in.shape_str() + ", " + out.shape_str());
  LS_CHECK(in.inner_contiguous() && out.inner_contiguous());
  const int64_t M = in.size(0), D = in.size(1);
  check_rows_view("modulate", rows, M);
  check_table("modulate", shift, D);
  check_table("modulate", scale, D);
  const int64_t R = std::min(shift.size(0), scale.size(0));

  parallel_for(M, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, D)), [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const int64_t r = table_row(rows, m, R);
      const uint16_t* x = row_ptr<const uint16_t>(in, m);
      if (out_f32) {
        const float* sc = row_ptr<const float>(scale, r);
        const float* sh = row_ptr<const float>(shift, r);
        float* o = row_ptr<float>(out, m);
        for (int64_t d = 0; d < D; ++d) {
          const float one_plus = 1.0f + sc[d];
          const float t = widen_scalar<uint16_t>(x[d]) * one_plus;
          o[d] = t + sh[d];
        }
      } else {
        uint16_t* o = row_ptr<uint16_t>(out, m);
        for (int64_t d = 0; d < D; ++d) {
          const float sc = round_bf16(1.0f + round_bf16(table_at(scale, r, d)));
          const float t = round_bf16(widen_scalar<uint16_t>(x[d]) * sc);
          o[d] = f32_to_bf16(t + round_bf16(table_at(shift, r, d)));
        }
      }
    }
  });
  return Status();
}

Status cpu_op_gated_add(const TensorView& x, const TensorView& y, const TensorView& gate, const TensorView& rows) {
  LS_TRY(require_host("gated_add", {&x, &y, &gate, &rows}));
  if (x.dtype != DType::bf16 || y.dtype != DType::bf16 || rows.dtype != DType::i32 ||
      (gate.dtype != DType::bf16 && gate.dtype != DType::f32))
    return unsupported_dtypes("gated_add",
                              std::string("x=") + dtype_name(x.dtype) + " y=" + dtype_name(y.dtype) +
                                  " gate=" + dtype_name(gate.dtype) + " rows=" + dtype_name(rows.dtype),
                              "x, y bf16; gate bf16 or f32; rows i32");
  LS_CHECK_MSG(x.ndim == 2 && y.ndim == 2 && x.size(0) == y.size(0) && x.size(1) == y.size(1),
               "gated_add: x and y must be [M, D]; got " + x.shape_str() + ", " + y.shape_str());
  LS_CHECK(x.inner_contiguous() && y.inner_contiguous());
  const int64_t M = x.size(0), D = x.size(1);
  check_rows_view("gated_add", rows, M);
  check_table("gated_add", gate, D);
  const int64_t R = gate.size(0);

  parallel_for(M, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, D)), [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const int64_t r = table_row(rows, m, R);
      uint16_t* xr = row_ptr<uint16_t>(x, m);
      const uint16_t* yr = row_ptr<const uint16_t>(y, m);
      for (int64_t d = 0; d < D; ++d) {
        const float g = round_bf16(table_at(gate, r, d));
        const float v = std::fma(widen_scalar<uint16_t>(yr[d]), g, widen_scalar<uint16_t>(xr[d]));
        xr[d] = f32_to_bf16(v);
      }
    }
  });
  return Status();
}

}  // namespace ls::cpu
