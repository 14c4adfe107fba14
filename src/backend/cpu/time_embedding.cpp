// CPU sinusoidal time embedding, cos first (h3-model.md §2.5; docs/numerics.md §6).
//
// PyTorch computes freqs = exp(-ln(10000) * arange(half, f32) / half) with the Python
// scalar cast to fp32, left to right; we do the same in fp32:
//   c      = fl32(-ln(10000))                      (from double)
//   freq_j = expf( fl32( fl32(c * j) / half ) )
//   arg    = fl32(t[m] * freq_j)
//   out[m] = [cosf(arg_0 .. arg_{half-1}), sinf(arg_0 .. arg_{half-1})]
// expf/cosf/sinf are glibc's; their results are deterministic on one libm but are not
// guaranteed correctly rounded, so another libm may differ in the last ulp.
#include <cmath>
#include <cstdint>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "core/thread_pool.h"

namespace ls::cpu {

Status cpu_op_time_embedding(const TensorView& t, const TensorView& out) {
  LS_TRY(require_host("time_embedding", {&t, &out}));
  if (t.dtype != DType::f32 || out.dtype != DType::f32)
    return unsupported_dtypes("time_embedding",
                              std::string("t=") + dtype_name(t.dtype) + " out=" + dtype_name(out.dtype),
                              "t, out f32");
  LS_CHECK_MSG(t.ndim == 1 && out.ndim == 2 && out.size(0) == t.size(0) && out.inner_contiguous(),
               "time_embedding wants t [M], out [M, N]; got " + t.shape_str() + ", " + out.shape_str());
  const int64_t M = out.size(0), N = out.size(1);
  if (N % 2 != 0)
    return make_error(ErrorCode::unsupported, "cpu time_embedding: width " + std::to_string(N) +
                                                  " is odd; the cos/sin embedding needs an even width");
  const int64_t half = N / 2;
  const float c = static_cast<float>(-std::log(10000.0));
  const float half_f = static_cast<float>(half);
  parallel_for(M, 1, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const float tv = static_cast<const float*>(t.data)[m * t.stride[0]];
      float* o = row_ptr<float>(out, m);
      for (int64_t j = 0; j < half; ++j) {
        const float e = (c * static_cast<float>(j)) / half_f;
        const float freq = std::exp(e);
        const float arg = tv * freq;
        o[j] = std::cos(arg);
        o[half + j] = std::sin(arg);
      }
    }
  });
  return Status();
}

}  // namespace ls::cpu
