// Entry points of the CPU reference ops (one file per op family, style-lessons §3).
// Each implements the Backend method of the same name (src/backend/backend.h); the
// exact reduction orders and rounding points are in docs/numerics.md and at the top of
// each file. CpuBackend (cpu_backend.cpp) only forwards to these.
#pragma once

#include <initializer_list>
#include <string>

#include "backend/backend.h"

namespace ls::cpu {

Status cpu_op_gemm(const TensorView& x, const TensorView& w, const TensorView* bias, const TensorView& out);
Status cpu_op_rms_norm(const TensorView& x, const TensorView& w, float eps, const TensorView& out);
Status cpu_op_modulate(const TensorView& in, const TensorView& shift, const TensorView& scale, const TensorView& rows,
                       const TensorView& out);
Status cpu_op_gated_add(const TensorView& x, const TensorView& y, const TensorView& gate, const TensorView& rows);
Status cpu_op_add(const TensorView& x, const TensorView& y);
Status cpu_op_qk_norm_rope(const TensorView& x, const TensorView& w, const TensorView& rope, float eps);
Status cpu_op_swiglu(const TensorView& u, const TensorView& out);
Status cpu_op_silu(const TensorView& x);
Status cpu_op_time_embedding(const TensorView& t, const TensorView& out);
Status cpu_op_convert(const TensorView& src, const TensorView& dst);
// INT8 attention (attention_int8.cpp; docs/int8-attention.md).
Status cpu_op_int8_key_stats(const TensorView& k, const TensorView& v, const TensorView& stats, int64_t k0,
                             bool reset);
Status cpu_op_int8_prepare(const TensorView& k, const TensorView& v, const TensorView& stats, const Int8Keys& keys);
Status cpu_op_attention_int8(const TensorView& q, const Int8Keys& keys, const TensorView& out,
                             const AttentionParams& p);
Status cpu_op_attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                        const AttentionParams& p);
Status cpu_op_copy(const TensorView& dst, const TensorView& src);
Expected<int64_t> cpu_op_count_nonfinite(const TensorView& t);

// ---- helpers shared by the op files --------------------------------------------
// The Status for a dtype combination an op does not implement.
inline Status unsupported_dtypes(const char* op, const std::string& got, const char* supported) {
  return make_error(ErrorCode::unsupported,
                    std::string("cpu ") + op + ": unsupported dtypes " + got + " (supported: " + supported + ")");
}
// unsupported unless every (non-empty) view lives in host memory.
inline Status require_host(const char* op, std::initializer_list<const TensorView*> views) {
  for (const TensorView* v : views) {
    if (v && !v->empty() && v->device.kind != DeviceKind::cpu)
      return make_error(ErrorCode::unsupported, std::string("cpu ") + op + ": a view lives on " + v->device.str() +
                                                    "; the cpu backend only reads and writes host memory");
  }
  return Status();
}
// Element pointer of row m of a view whose innermost dimension is contiguous.
template <typename T>
inline T* row_ptr(const TensorView& v, int64_t m) {
  return static_cast<T*>(v.data) + m * v.stride[0];
}

}  // namespace ls::cpu
