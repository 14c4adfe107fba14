// RMSNorm over the last dimension, one row per block (h3-model.md §3.2, fused form):
//   out = bf16( x * rrms * w ),  rrms = 1 / sqrt(sum(x^2) / D + eps)   (fp32, one rounding)
//
// Reduction order (fixed, depends on D only, so a row's bits never depend on how many
// rows a launch holds): the row is cut in chunks of 8 elements; thread t of the 256
// owns chunks t, t+256, ... and accumulates x^2 over its chunks in order, element by
// element (separate multiply and add: -fmad=false); then a warp xor-shuffle tree
// (offsets 16, 8, 4, 2, 1), then warp 0..7 partials summed in order by thread 0.
// Whether a chunk is read with one 16-byte load or eight 2-byte loads does not change
// the order.
//
// rms_norm_modulate (the DiT block's norm + AdaLN modulation, backend.h) fuses the
// rms_norm kernel with modulate.cu's bf16 kernel: the same row_rrms below (so rrms has
// the same bits), then per element h = bf16(x * rrms * w) (the rms_norm output, rounded
// exactly where rms_norm's store rounds it) and modulate's arithmetic on h (modulate.cuh's
// modulate8_bf16, the code modulate.cu runs),
//   out = bf16(bf16(h * bf16(1 + bf16(scale[r]))) + bf16(shift[r])),  r = rows[m],
// separate multiplies and adds (-fmad=false). Every rounding point of the two-op
// composition stays, so the bytes are the composition's (tests/cuda/test_backend_ops
// checks by memcmp). Memory: the composition writes h ([M, D] bf16) and modulate reads
// it back; the fused pass does neither, saving one read and one write of [M, D] bf16
// per use: at S = 111274, D = 5376 that is 2 x 1.2 GB = 2.4 GB per use, two uses per
// DiT block (norm1 and norm2), about 4.8 GB of traffic per block.
#include "backend/cuda/modulate.cuh"
#include "backend/cuda/ops.cuh"

namespace ls::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float block_sum_fixed(float v, float* smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = smem[0];
    for (int i = 1; i < kThreads / 32; ++i) s += smem[i];
    smem[kThreads / 32] = s;
  }
  __syncthreads();
  return smem[kThreads / 32];
}

// 1 / sqrt(sum(x^2) / D + eps) of one row, in the fixed order described above. Every
// thread of the block calls it; all get the same value. xr: bf16 [D].
__device__ __forceinline__ float row_rrms(const uint16_t* xr, int64_t D, float eps, bool vec, float* smem) {
  const int64_t chunks = (D + 7) / 8;
  float acc = 0.0f;
  for (int64_t c = threadIdx.x; c < chunks; c += kThreads) {
    const int n = static_cast<int>(D - c * 8 < 8 ? D - c * 8 : 8);
    float v[8];
    load8_bf16(xr + c * 8, vec, n, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc += v[i] * v[i];  // padded lanes are 0: adding +0 changes nothing
  }
  const float total = block_sum_fixed(acc, smem);
  return 1.0f / sqrtf(total / static_cast<float>(D) + eps);
}

// x, out: bf16 [M, D] (row strides sx, so); w: bf16 [D]. vec: all rows 16-byte aligned.
__global__ void __launch_bounds__(kThreads) rms_norm_bf16(const uint16_t* __restrict__ x, int64_t sx,
                                                          const uint16_t* __restrict__ w, float eps, uint16_t* out,
                                                          int64_t so, int64_t D, bool vec) {
  __shared__ float smem[kThreads / 32 + 1];
  const int64_t row = blockIdx.x;
  const uint16_t* xr = x + row * sx;
  uint16_t* orow = out + row * so;
  const int64_t chunks = (D + 7) / 8;
  const float rrms = row_rrms(xr, D, eps, vec, smem);
  for (int64_t c = threadIdx.x; c < chunks; c += kThreads) {
    const int n = static_cast<int>(D - c * 8 < 8 ? D - c * 8 : 8);
    float v[8], g[8], r[8];
    load8_bf16(xr + c * 8, vec, n, v);
    load8_bf16(w + c * 8, vec, n, g);
#pragma unroll
    for (int i = 0; i < 8; ++i) r[i] = v[i] * rrms * g[i];
    store8_bf16(orow + c * 8, vec, n, r);
  }
}

// x, out: bf16 [M, D] (row strides sx, so; out may alias x: a thread reads a chunk of x
// before writing the same chunk of out, and the sum is complete before any write);
// w: bf16 [D]; shift, scale: bf16|f32 [R, D] (row strides ssh, ssc); rows: i32 [M].
__global__ void __launch_bounds__(kThreads) rms_norm_modulate_bf16(const uint16_t* x, int64_t sx,
                                                                   const uint16_t* __restrict__ w, float eps,
                                                                   const void* shift, int64_t ssh, const void* scale,
                                                                   int64_t ssc, bool tab_f32,
                                                                   const int32_t* __restrict__ rows, uint16_t* out,
                                                                   int64_t so, int64_t D, bool vec) {
  __shared__ float smem[kThreads / 32 + 1];
  const int64_t row = blockIdx.x;
  const int64_t r = rows[row];
  const uint16_t* xr = x + row * sx;
  uint16_t* orow = out + row * so;
  const int64_t chunks = (D + 7) / 8;
  const float rrms = row_rrms(xr, D, eps, vec, smem);
  for (int64_t c = threadIdx.x; c < chunks; c += kThreads) {
    const int n = static_cast<int>(D - c * 8 < 8 ? D - c * 8 : 8);
    float v[8], g[8], h[8], o[8];
    load8_bf16(xr + c * 8, vec, n, v);
    load8_bf16(w + c * 8, vec, n, g);
#pragma unroll
    for (int i = 0; i < 8; ++i) h[i] = round_bf16(v[i] * rrms * g[i]);  // rms_norm's output, rounded as its store rounds
    modulate8_bf16(h, n, scale, r * ssc + c * 8, shift, r * ssh + c * 8, tab_f32, o);  // modulate.cu's arithmetic
    store8_bf16(orow + c * 8, vec, n, o);
  }
}

// Whether every row of x, w and out can be read and written with 16-byte loads. They
// only change how bytes arrive, never the order of the sum.
bool rows_vec16(const TensorView& x, const TensorView& w, const TensorView& out) {
  return aligned16(x.data) && aligned16(out.data) && aligned16(w.data) && x.stride[0] % 8 == 0 &&
         out.stride[0] % 8 == 0;
}

}  // namespace

Status cuda_op_rms_norm(CudaContext& ctx, const TensorView& x, const TensorView& w, float eps, const TensorView& out) {
  if (x.dtype != DType::bf16 || w.dtype != DType::bf16 || out.dtype != DType::bf16)
    return unsupported("rms_norm", "needs bf16 x, w, out; got " + x.shape_str() + ", " + w.shape_str() + ", " +
                                       out.shape_str());
  LS_CHECK_MSG(x.ndim == 2 && out.ndim == 2 && w.ndim == 1 && x.shape[0] == out.shape[0] &&
                   x.shape[1] == out.shape[1] && w.shape[0] == x.shape[1] && x.inner_contiguous() &&
                   out.inner_contiguous() && w.inner_contiguous(),
               "rms_norm: " + x.shape_str() + " w " + w.shape_str() + " out " + out.shape_str());
  const int64_t M = x.shape[0], D = x.shape[1];
  if (M == 0) return Status();
  const bool vec = rows_vec16(x, w, out);
  rms_norm_bf16<<<static_cast<unsigned>(M), kThreads, 0, ctx.stream>>>(
      x.ptr<const uint16_t>(), x.stride[0], w.ptr<const uint16_t>(), eps, out.ptr<uint16_t>(), out.stride[0], D, vec);
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

bool cuda_rms_norm_modulate_applies(const TensorView& x, const TensorView& w, const TensorView& shift,
                                    const TensorView& scale, const TensorView& rows, const TensorView& out) {
  return x.dtype == DType::bf16 && w.dtype == DType::bf16 && out.dtype == DType::bf16 && rows.dtype == DType::i32 &&
         x.ndim == 2 && out.ndim == 2 && w.ndim == 1 && rows.ndim == 1 && x.shape[0] == out.shape[0] &&
         x.shape[1] == out.shape[1] && w.shape[0] == x.shape[1] && rows.shape[0] == x.shape[0] &&
         x.inner_contiguous() && out.inner_contiguous() && w.inner_contiguous() &&
         modulation_table_ok(shift, x.shape[1]) && modulation_table_ok(scale, x.shape[1]) && shift.dtype == scale.dtype;
}

Status cuda_op_rms_norm_modulate(CudaContext& ctx, const TensorView& x, const TensorView& w, float eps,
                                 const TensorView& shift, const TensorView& scale, const TensorView& rows,
                                 const TensorView& out) {
  LS_CHECK_MSG(cuda_rms_norm_modulate_applies(x, w, shift, scale, rows, out),
               "rms_norm_modulate: x " + x.shape_str() + " w " + w.shape_str() + " shift " + shift.shape_str() +
                   " scale " + scale.shape_str() + " rows " + rows.shape_str() + " out " + out.shape_str());
  const int64_t M = x.shape[0], D = x.shape[1];
  if (M == 0) return Status();
  const bool vec = rows_vec16(x, w, out);
  rms_norm_modulate_bf16<<<static_cast<unsigned>(M), kThreads, 0, ctx.stream>>>(
      x.ptr<const uint16_t>(), x.stride[0], w.ptr<const uint16_t>(), eps, shift.data, shift.stride[0], scale.data,
      scale.stride[0], shift.dtype == DType::f32, rows.ptr<const int32_t>(), out.ptr<uint16_t>(), out.stride[0], D,
      vec);
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

}  // namespace ls::cuda
