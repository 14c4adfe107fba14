// AdaLN modulation and the gated residual add (h3-model.md §2.6), elementwise, one
// row per block, so there is no reduction and a row's bits depend on that row only.
//   modulate, bf16 out:  sc = bf16(1 + bf16(scale[r]));  out = bf16(bf16(in * sc) + bf16(shift[r]))
//   modulate, f32 out:   out = fl32(fl32(in * (1 + scale[r])) + shift[r])   (f32 tables only)
//   gated_add (in place): x = bf16( fma(y, bf16(gate[r]), x) )
// r = rows[m]: the table row of token m (an i32 index on the device).
#include "backend/cuda/modulate.cuh"
#include "backend/cuda/ops.cuh"

namespace ls::cuda {
namespace {

constexpr int kThreads = 256;

// in: bf16 [M, D]; shift, scale: bf16|f32 [R, D]; rows: i32 [M]; out: bf16 [M, D] (may alias in).
__global__ void __launch_bounds__(kThreads) modulate_bf16(const uint16_t* in, int64_t si, const void* shift,
                                                          int64_t ssh, const void* scale, int64_t ssc, bool tab_f32,
                                                          const int32_t* __restrict__ rows, uint16_t* out,
                                                          int64_t so, int64_t D, bool vec) {
  const int64_t m = blockIdx.x;
  const int64_t r = rows[m];
  const uint16_t* ir = in + m * si;
  uint16_t* orow = out + m * so;
  for (int64_t c = threadIdx.x; c * 8 < D; c += kThreads) {
    const int n = static_cast<int>(D - c * 8 < 8 ? D - c * 8 : 8);
    float v[8], o[8];
    load8_bf16(ir + c * 8, vec, n, v);
    modulate8_bf16(v, n, scale, r * ssc + c * 8, shift, r * ssh + c * 8, tab_f32, o);
    store8_bf16(orow + c * 8, vec, n, o);
  }
}

// Same with an f32 output (the fp32 final layer); in and out never alias (different dtypes).
__global__ void __launch_bounds__(kThreads) modulate_f32(const uint16_t* __restrict__ in, int64_t si,
                                                         const void* shift, int64_t ssh, const void* scale,
                                                         int64_t ssc, bool tab_f32, const int32_t* __restrict__ rows,
                                                         float* __restrict__ out, int64_t so, int64_t D) {
  const int64_t m = blockIdx.x;
  const int64_t r = rows[m];
  for (int64_t d = threadIdx.x; d < D; d += kThreads) {
    const float v = bf16_bits_to_f32(in[m * si + d]);
    const float sc = 1.0f + load_bf16_or_f32(scale, tab_f32, r * ssc + d);
    const float sh = load_bf16_or_f32(shift, tab_f32, r * ssh + d);
    out[m * so + d] = v * sc + sh;  // two roundings: the product, then the sum (no fma)
  }
}

// x, y: bf16 [M, D]; gate: bf16|f32 [R, D]; rows: i32 [M]. In place on x.
__global__ void __launch_bounds__(kThreads) gated_add_bf16(uint16_t* x, int64_t sx, const uint16_t* y, int64_t sy,
                                                           const void* gate, int64_t sg, bool tab_f32,
                                                           const int32_t* __restrict__ rows, int64_t D, bool vec) {
  const int64_t m = blockIdx.x;
  const int64_t r = rows[m];
  uint16_t* xr = x + m * sx;
  const uint16_t* yr = y + m * sy;
  for (int64_t c = threadIdx.x; c * 8 < D; c += kThreads) {
    const int n = static_cast<int>(D - c * 8 < 8 ? D - c * 8 : 8);
    float xv[8], yv[8], o[8];
    load8_bf16(xr + c * 8, vec, n, xv);
    load8_bf16(yr + c * 8, vec, n, yv);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float g = i < n ? round_bf16(load_bf16_or_f32(gate, tab_f32, r * sg + c * 8 + i)) : 0.0f;
      o[i] = fmaf(yv[i], g, xv[i]);
    }
    store8_bf16(xr + c * 8, vec, n, o);
  }
}

}  // namespace

Status cuda_op_modulate(CudaContext& ctx, const TensorView& in, const TensorView& shift, const TensorView& scale,
                        const TensorView& rows, const TensorView& out) {
  LS_CHECK_MSG(in.ndim == 2 && out.ndim == 2 && in.shape[0] == out.shape[0] && in.shape[1] == out.shape[1] &&
                   rows.ndim == 1 && rows.shape[0] == in.shape[0] && in.inner_contiguous() && out.inner_contiguous(),
               "modulate: in " + in.shape_str() + " rows " + rows.shape_str() + " out " + out.shape_str());
  const int64_t M = in.shape[0], D = in.shape[1];
  if (in.dtype != DType::bf16 || rows.dtype != DType::i32 || !modulation_table_ok(shift, D) || !modulation_table_ok(scale, D) ||
      shift.dtype != scale.dtype || (out.dtype != DType::bf16 && out.dtype != DType::f32) ||
      (out.dtype == DType::f32 && shift.dtype != DType::f32))
    return unsupported("modulate", "in " + in.shape_str() + " shift " + shift.shape_str() + " scale " +
                                       scale.shape_str() + " rows " + rows.shape_str() + " out " + out.shape_str());
  if (M == 0) return Status();
  const bool tab_f32 = shift.dtype == DType::f32;
  if (out.dtype == DType::bf16) {
    const bool vec = aligned16(in.data) && aligned16(out.data) && in.stride[0] % 8 == 0 && out.stride[0] % 8 == 0;
    modulate_bf16<<<static_cast<unsigned>(M), kThreads, 0, ctx.stream>>>(
        in.ptr<const uint16_t>(), in.stride[0], shift.data, shift.stride[0], scale.data, scale.stride[0], tab_f32,
        rows.ptr<const int32_t>(), out.ptr<uint16_t>(), out.stride[0], D, vec);
  } else {
    modulate_f32<<<static_cast<unsigned>(M), kThreads, 0, ctx.stream>>>(
        in.ptr<const uint16_t>(), in.stride[0], shift.data, shift.stride[0], scale.data, scale.stride[0], tab_f32,
        rows.ptr<const int32_t>(), out.ptr<float>(), out.stride[0], D);
  }
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

Status cuda_op_gated_add(CudaContext& ctx, const TensorView& x, const TensorView& y, const TensorView& gate,
                         const TensorView& rows) {
  LS_CHECK_MSG(x.ndim == 2 && y.ndim == 2 && x.shape[0] == y.shape[0] && x.shape[1] == y.shape[1] &&
                   rows.ndim == 1 && rows.shape[0] == x.shape[0] && x.inner_contiguous() && y.inner_contiguous(),
               "gated_add: x " + x.shape_str() + " y " + y.shape_str() + " rows " + rows.shape_str());
  const int64_t M = x.shape[0], D = x.shape[1];
  if (x.dtype != DType::bf16 || y.dtype != DType::bf16 || rows.dtype != DType::i32 || !modulation_table_ok(gate, D))
    return unsupported("gated_add", "x " + x.shape_str() + " y " + y.shape_str() + " gate " + gate.shape_str());
  if (M == 0) return Status();
  const bool vec = aligned16(x.data) && aligned16(y.data) && x.stride[0] % 8 == 0 && y.stride[0] % 8 == 0;
  gated_add_bf16<<<static_cast<unsigned>(M), kThreads, 0, ctx.stream>>>(
      x.ptr<uint16_t>(), x.stride[0], y.ptr<const uint16_t>(), y.stride[0], gate.data, gate.stride[0],
      gate.dtype == DType::f32, rows.ptr<const int32_t>(), D, vec);
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

}  // namespace ls::cuda
