// CPU elementwise dtype conversion (docs/numerics.md §7).
//
// Rounding follows core/dtype.h: round to nearest even into bf16/f16, saturating
// nearest-even into f8e4m3, NaN stays NaN. Every narrow float dtype widens exactly to
// f32 and f64, so a conversion between them is one rounding. From f64 to a type
// narrower than f32 we must not round twice (f64 -> f32 -> bf16 can be off by one ulp
// at a tie), so f64 is first rounded to f32 *to odd* (truncate, then set the last bit
// if anything was lost), which makes the second nearest-even rounding exact for any
// target with at least two fewer significand bits than f32 (bf16, f16, f8e4m3).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/rows.h"
#include "backend/cpu/simd.h"
#include "core/thread_pool.h"

namespace ls::cpu {
namespace {

// f64 -> f32 rounded to odd: of the two fp32 neighbours of d, the one with an odd
// last significand bit (or d itself when exact).
float f64_to_f32_round_to_odd(double d) {
  float f = static_cast<float>(d);  // nearest even
  if (std::isnan(d) || std::isinf(f) || static_cast<double>(f) == d) return f;
  uint32_t u = f32_bits(f);
  if ((u & 1u) == 0) {  // even neighbour chosen: take the other neighbour, on d's side
    f = std::nextafter(f, d > static_cast<double>(f) ? INFINITY : -INFINITY);
  }
  return f;
}

// Visits the rows (all but the innermost dimension) of a view; calls fn(src_row_ptr,
// dst_row_ptr) with element pointers. Both views have the same shape.
template <typename Fn>
void for_each_row_pair(const TensorView& src, const TensorView& dst, Fn&& fn) {
  const int nd = src.ndim;
  int64_t outer = 1;
  for (int i = 0; i + 1 < nd; ++i) outer *= src.size(i);
  const int64_t inner = nd == 0 ? 1 : src.size(nd - 1);
  parallel_for(outer, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, inner)), [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      int64_t soff = 0, doff = 0;
      row_offsets(src, dst, o, soff, doff);
      fn(static_cast<const char*>(src.data) + soff * src.elem_size(),
         static_cast<char*>(dst.data) + doff * dst.elem_size(), inner);
    }
  });
}

}  // namespace

Status cpu_op_convert(const TensorView& src, const TensorView& dst) {
  LS_TRY(require_host("convert", {&src, &dst}));
  if (!dtype_is_float(src.dtype) || !dtype_is_float(dst.dtype))
    return unsupported_dtypes("convert",
                              std::string("src=") + dtype_name(src.dtype) + " dst=" + dtype_name(dst.dtype),
                              "any pair of f64, f32, bf16, f16, f8e4m3");
  LS_CHECK_MSG(src.ndim == dst.ndim, "convert: rank mismatch " + src.shape_str() + " vs " + dst.shape_str());
  for (int i = 0; i < src.ndim; ++i)
    LS_CHECK_MSG(src.size(i) == dst.size(i), "convert: shape mismatch " + src.shape_str() + " vs " + dst.shape_str());
  LS_CHECK_MSG(src.inner_contiguous() && dst.inner_contiguous(), "convert: innermost dimension must be contiguous");
  if (src.numel() == 0) return Status();

  const DType st = src.dtype, dt = dst.dtype;
  if (st == dt) {
    for_each_row_pair(src, dst, [&](const char* s, char* d, int64_t n) {
      std::memcpy(d, s, static_cast<size_t>(n * src.elem_size()));
    });
  } else if (st == DType::bf16 && dt == DType::f32) {
    for_each_row_pair(src, dst, [](const char* s, char* d, int64_t n) {
      const uint16_t* sp = reinterpret_cast<const uint16_t*>(s);
      float* dp = reinterpret_cast<float*>(d);
      for (int64_t i = 0; i < n; ++i) dp[i] = widen_scalar<uint16_t>(sp[i]);
    });
  } else if (st == DType::f32 && dt == DType::bf16) {
    for_each_row_pair(src, dst, [](const char* s, char* d, int64_t n) {
      const float* sp = reinterpret_cast<const float*>(s);
      uint16_t* dp = reinterpret_cast<uint16_t*>(d);
      for (int64_t i = 0; i < n; ++i) dp[i] = f32_to_bf16(sp[i]);
    });
  } else if (st == DType::f64) {
    for_each_row_pair(src, dst, [dt](const char* s, char* d, int64_t n) {
      const double* sp = reinterpret_cast<const double*>(s);
      for (int64_t i = 0; i < n; ++i) {
        if (dt == DType::f32) reinterpret_cast<float*>(d)[i] = static_cast<float>(sp[i]);
        else store_from_f32(d, dt, i, f64_to_f32_round_to_odd(sp[i]));
      }
    });
  } else if (dt == DType::f64) {
    for_each_row_pair(src, dst, [st](const char* s, char* d, int64_t n) {
      double* dp = reinterpret_cast<double*>(d);
      for (int64_t i = 0; i < n; ++i) dp[i] = static_cast<double>(load_as_f32(s, st, i));
    });
  } else {
    for_each_row_pair(src, dst, [st, dt](const char* s, char* d, int64_t n) {
      for (int64_t i = 0; i < n; ++i) store_from_f32(d, dt, i, load_as_f32(s, st, i));
    });
  }
  return Status();
}

}  // namespace ls::cpu
