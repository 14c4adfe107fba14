// CPU count_nonfinite (backend.h): elements whose exponent bits are all ones (NaN,
// +inf, -inf), read as bits, so the count is exact and needs no floating-point
// arithmetic (no flag, no trap, nothing a compiler could fold away under fast-math).
//   bf16: (h & 0x7f80) == 0x7f80     f16: (h & 0x7c00) == 0x7c00
//   f32:  (u & 0x7f800000) == 0x7f800000
// The view is walked as [rows, inner] with the innermost dimension as `inner` (any
// stride) and every outer index decomposed per row; a contiguous view is one long row
// cut into pieces. Rows go over the thread pool; integer counts add up the same in
// any order.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "core/thread_pool.h"

namespace ls::cpu {
namespace {

template <typename Bits, Bits kMask>
int64_t count_run(const char* p, int64_t n, int64_t stride_bytes) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) {
    Bits b;
    std::memcpy(&b, p + i * stride_bytes, sizeof b);
    c += (b & kMask) == kMask ? 1 : 0;
  }
  return c;
}

int64_t count_run(DType t, const char* p, int64_t n, int64_t stride_bytes) {
  switch (t) {
    case DType::bf16: return count_run<uint16_t, 0x7f80u>(p, n, stride_bytes);
    case DType::f16: return count_run<uint16_t, 0x7c00u>(p, n, stride_bytes);
    default: return count_run<uint32_t, 0x7f800000u>(p, n, stride_bytes);
  }
}

}  // namespace

Expected<int64_t> cpu_op_count_nonfinite(const TensorView& t) {
  LS_TRY(require_host("count_nonfinite", {&t}));
  if (t.dtype != DType::bf16 && t.dtype != DType::f16 && t.dtype != DType::f32)
    return unsupported_dtypes("count_nonfinite", dtype_name(t.dtype), "bf16, f16, f32").error();
  if (t.empty() || t.numel() == 0) return int64_t{0};
  const int64_t es = t.elem_size();
  const char* base = static_cast<const char*>(t.data);
  if (t.ndim == 0) return count_run(t.dtype, base, 1, es);
  std::atomic<int64_t> total{0};
  if (t.is_contiguous()) {
    const int64_t n = t.numel();
    parallel_for(n, 1 << 16, [&](int64_t a, int64_t b) {
      total.fetch_add(count_run(t.dtype, base + a * es, b - a, es), std::memory_order_relaxed);
    });
    return total.load();
  }
  const int nd = t.ndim;
  const int64_t inner = t.size(nd - 1);
  const int64_t inner_stride = t.stride[static_cast<size_t>(nd - 1)] * es;
  const int64_t rows = t.numel() / inner;
  parallel_for(rows, std::max<int64_t>(1, (1 << 16) / inner), [&](int64_t r0, int64_t r1) {
    int64_t c = 0;
    for (int64_t r = r0; r < r1; ++r) {
      int64_t rem = r, off = 0;
      for (int i = nd - 2; i >= 0; --i) {
        off += (rem % t.size(i)) * t.stride[static_cast<size_t>(i)];
        rem /= t.size(i);
      }
      c += count_run(t.dtype, base + off * es, inner, inner_stride);
    }
    total.fetch_add(c, std::memory_order_relaxed);
  });
  return total.load();
}

}  // namespace ls::cpu
