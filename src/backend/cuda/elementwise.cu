// Elementwise ops, one row per block (no reductions, so no order to fix):
//   add (in place):     x = bf16(x + y)
//   swiglu:             out[m, i] = bf16( bf16(silu(u[m, i])) * u[m, F + i] ),  silu(g) = g / (1 + exp(-g))
//   silu (in place):    x = x / (1 + exp(-x))   (f32)
// exp is CUDA's expf (max 2 ulp, not the fast intrinsic); the CPU uses the C library's,
// so silu may differ from the CPU by an fp32 ulp, which rarely survives a bf16 rounding.
#include "backend/cuda/ops.cuh"

namespace ls::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float silu_f32(float g) { return g / (1.0f + expf(-g)); }

// x, y: bf16 [M, D]. In place on x.
__global__ void __launch_bounds__(kThreads) add_bf16(uint16_t* x, int64_t sx, const uint16_t* y, int64_t sy, int64_t D,
                                                     bool vec) {
  const int64_t m = blockIdx.x;
  for (int64_t c = threadIdx.x; c * 8 < D; c += kThreads) {
    const int n = static_cast<int>(D - c * 8 < 8 ? D - c * 8 : 8);
    float a[8], b[8], o[8];
    load8_bf16(x + m * sx + c * 8, vec, n, a);
    load8_bf16(y + m * sy + c * 8, vec, n, b);
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = a[i] + b[i];
    store8_bf16(x + m * sx + c * 8, vec, n, o);
  }
}

// u: bf16 [M, 2F] (gate = first half); out: bf16 [M, F].
__global__ void __launch_bounds__(kThreads) swiglu_bf16(const uint16_t* __restrict__ u, int64_t su,
                                                        uint16_t* __restrict__ out, int64_t so, int64_t F, bool vec) {
  const int64_t m = blockIdx.x;
  const uint16_t* ur = u + m * su;
  for (int64_t c = threadIdx.x; c * 8 < F; c += kThreads) {
    const int n = static_cast<int>(F - c * 8 < 8 ? F - c * 8 : 8);
    float g[8], up[8], o[8];
    load8_bf16(ur + c * 8, vec, n, g);
    load8_bf16(ur + F + c * 8, vec, n, up);
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = round_bf16(silu_f32(g[i])) * up[i];
    store8_bf16(out + m * so + c * 8, vec, n, o);
  }
}

// x: f32 [M, N], in place.
__global__ void __launch_bounds__(kThreads) silu_f32_rows(float* x, int64_t sx, int64_t N) {
  const int64_t m = blockIdx.x;
  for (int64_t d = threadIdx.x; d < N; d += kThreads) x[m * sx + d] = silu_f32(x[m * sx + d]);
}

}  // namespace

Status cuda_op_add(CudaContext& ctx, const TensorView& x, const TensorView& y) {
  LS_CHECK_MSG(x.ndim == 2 && y.ndim == 2 && x.shape[0] == y.shape[0] && x.shape[1] == y.shape[1] &&
                   x.inner_contiguous() && y.inner_contiguous(),
               "add: x " + x.shape_str() + " y " + y.shape_str());
  if (x.dtype != DType::bf16 || y.dtype != DType::bf16)
    return unsupported("add", "needs bf16; got " + x.shape_str() + " and " + y.shape_str());
  if (x.shape[0] == 0) return Status();
  const bool vec = aligned16(x.data) && aligned16(y.data) && x.stride[0] % 8 == 0 && y.stride[0] % 8 == 0;
  add_bf16<<<static_cast<unsigned>(x.shape[0]), kThreads, 0, ctx.stream>>>(x.ptr<uint16_t>(), x.stride[0],
                                                                           y.ptr<const uint16_t>(), y.stride[0],
                                                                           x.shape[1], vec);
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

Status cuda_op_swiglu(CudaContext& ctx, const TensorView& u, const TensorView& out) {
  LS_CHECK_MSG(u.ndim == 2 && out.ndim == 2 && u.shape[0] == out.shape[0] && u.shape[1] == 2 * out.shape[1] &&
                   u.inner_contiguous() && out.inner_contiguous(),
               "swiglu: u " + u.shape_str() + " out " + out.shape_str());
  if (u.dtype != DType::bf16 || out.dtype != DType::bf16)
    return unsupported("swiglu", "needs bf16; got " + u.shape_str() + " -> " + out.shape_str());
  if (u.shape[0] == 0) return Status();
  const int64_t F = out.shape[1];
  const bool vec = aligned16(u.data) && aligned16(out.data) && u.stride[0] % 8 == 0 && out.stride[0] % 8 == 0 &&
                   F % 8 == 0;
  swiglu_bf16<<<static_cast<unsigned>(u.shape[0]), kThreads, 0, ctx.stream>>>(u.ptr<const uint16_t>(), u.stride[0],
                                                                              out.ptr<uint16_t>(), out.stride[0], F,
                                                                              vec);
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

Status cuda_op_silu(CudaContext& ctx, const TensorView& x) {
  LS_CHECK_MSG(x.ndim == 2 && x.inner_contiguous(), "silu: x " + x.shape_str());
  if (x.dtype != DType::f32) return unsupported("silu", "needs f32; got " + x.shape_str());
  if (x.shape[0] == 0) return Status();
  silu_f32_rows<<<static_cast<unsigned>(x.shape[0]), kThreads, 0, ctx.stream>>>(x.ptr<float>(), x.stride[0],
                                                                                x.shape[1]);
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

}  // namespace ls::cuda
