// count_nonfinite (backend.h) on the GPU: elements whose exponent bits are all ones
// (NaN, +inf, -inf), tested on the bits as the CPU reference does, so the counts agree
// exactly (tests/cuda/test_backend_ops.cpp):
//   bf16: (h & 0x7f80) == 0x7f80     f16: (h & 0x7c00) == 0x7c00
//   f32:  (u & 0x7f800000) == 0x7f800000
//
// Layout: the host merges the view's dimensions where they are packed (size-1 dims
// dropped, dim i folded into i+1 when stride[i] == stride[i+1] * size[i+1]), leaving up
// to 3 outer dims and one inner run of `inner` elements at `inner_stride`. A contiguous
// view (the residual) is one run. Work items are (outer row, chunk of the run); each
// block walks items grid-stride, each thread reads 16 bytes per item when the runs are
// 16-byte aligned with stride 1 (vec), else 8 elements `kThreads` apart. Per-thread
// counts go through a warp sum and one atomicAdd per warp into the backend's counter.
//
// The counter: one unsigned long long on the device, made with the backend
// (CudaContext::nonfinite_counter, cuda_backend.cu), zeroed on the compute stream
// before each count and read back after it. It is not taken from the caller's
// workspace because the workspace is optional (callers without a GEMM never set one)
// and an op that needs none must not fail for lack of it; and ops never allocate.
// 8 bytes outside the arenas, like the streams and the cuBLASLt handle.
#include <algorithm>
#include <string>

#include "backend/cuda/ops.cuh"

namespace ls::cuda {
namespace {

constexpr int kThreads = 256;

struct Outer {
  int n = 0;              // outer dims (0..3), outermost first
  int64_t size[3] = {};   // elements
  int64_t stride[3] = {};
};

template <typename Bits>
__global__ void __launch_bounds__(kThreads)
    count_nonfinite_kernel(const Bits* __restrict__ p, Outer outer, int64_t inner, int64_t inner_stride,
                           int64_t chunk, int64_t chunks, int64_t items, Bits mask, bool vec,
                           unsigned long long* counter) {
  unsigned long long n = 0;
  for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
    const int64_t row = it / chunks, c = it % chunks;
    int64_t rem = row, off = 0;
    for (int i = outer.n - 1; i >= 0; --i) {
      off += (rem % outer.size[i]) * outer.stride[i];
      rem /= outer.size[i];
    }
    const Bits* r = p + off;
    if (vec) {
      constexpr int kPer = 16 / static_cast<int>(sizeof(Bits));
      const int64_t e = c * chunk + static_cast<int64_t>(threadIdx.x) * kPer;
      if (e < inner) {  // inner is a multiple of kPer here
        const uint4 v = *reinterpret_cast<const uint4*>(r + e);
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if constexpr (sizeof(Bits) == 2) {
            n += (static_cast<Bits>(w[i] & 0xffffu) & mask) == mask;
            n += (static_cast<Bits>(w[i] >> 16) & mask) == mask;
          } else {
            n += (w[i] & mask) == mask;
          }
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int64_t e = c * chunk + k * kThreads + threadIdx.x;
        if (e < inner) n += (r[e * inner_stride] & mask) == mask;
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) n += __shfl_down_sync(0xffffffffu, n, o);
  if ((threadIdx.x & 31) == 0 && n != 0) atomicAdd(counter, n);
}

}  // namespace

Expected<int64_t> cuda_op_count_nonfinite(CudaContext& ctx, const TensorView& t) {
  if (t.dtype != DType::bf16 && t.dtype != DType::f16 && t.dtype != DType::f32)
    return unsupported("count_nonfinite", "needs bf16, f16 or f32; got " + t.shape_str()).error();
  if (t.empty() || t.numel() == 0) return int64_t{0};
  if (!(t.device == Device{DeviceKind::cuda, ctx.device}))
    return unsupported("count_nonfinite", "the view lives on " + t.device.str() + ", not cuda:" +
                                              std::to_string(ctx.device))
        .error();
  LS_CHECK_MSG(ctx.nonfinite_counter != nullptr, "count_nonfinite: the backend has no counter");
  // Merge packed dimensions (see the top of the file).
  int64_t size[kMaxDims], stride[kMaxDims];
  int nd = 0;
  for (int i = 0; i < t.ndim; ++i) {
    const int64_t s = t.shape[static_cast<size_t>(i)], st = t.stride[static_cast<size_t>(i)];
    if (s == 1) continue;
    size[nd] = s, stride[nd] = st, ++nd;
  }
  int m = 0;
  for (int i = 0; i < nd; ++i) {
    if (m > 0 && stride[m - 1] == stride[i] * size[i]) {
      size[m - 1] *= size[i];
      stride[m - 1] = stride[i];
    } else {
      size[m] = size[i], stride[m] = stride[i], ++m;
    }
  }
  if (m == 0) size[0] = 1, stride[0] = 1, m = 1;  // one element
  Outer outer;
  outer.n = m - 1;
  int64_t rows = 1;
  for (int i = 0; i < outer.n; ++i) outer.size[i] = size[i], outer.stride[i] = stride[i], rows *= size[i];
  const int64_t inner = size[m - 1], inner_stride = stride[m - 1];
  const int64_t es = t.elem_size();
  bool vec = inner_stride == 1 && aligned16(t.data) && (inner * es) % 16 == 0;
  for (int i = 0; i < outer.n; ++i) vec = vec && (outer.stride[i] * es) % 16 == 0;
  const int64_t chunk = vec ? kThreads * (16 / es) : kThreads * 8;
  const int64_t chunks = div_up(inner, chunk), items = rows * chunks;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(items, int64_t{8} * std::max(ctx.sm_count, 1)));

  unsigned long long* counter = ctx.nonfinite_counter;
  cudaError_t e = cudaMemsetAsync(counter, 0, sizeof *counter, ctx.stream);
  if (e != cudaSuccess) return cuda_error(e, "count_nonfinite: zero the counter");
  if (t.dtype == DType::f32) {
    count_nonfinite_kernel<uint32_t><<<blocks, kThreads, 0, ctx.stream>>>(
        t.ptr<const uint32_t>(), outer, inner, inner_stride, chunk, chunks, items, 0x7f800000u, vec, counter);
  } else {
    const uint16_t mask = t.dtype == DType::bf16 ? uint16_t{0x7f80} : uint16_t{0x7c00};
    count_nonfinite_kernel<uint16_t><<<blocks, kThreads, 0, ctx.stream>>>(
        t.ptr<const uint16_t>(), outer, inner, inner_stride, chunk, chunks, items, mask, vec, counter);
  }
  LS_CUDA_CHECK_LAUNCH();
  unsigned long long host = 0;
  e = cudaMemcpyAsync(&host, counter, sizeof host, cudaMemcpyDeviceToHost, ctx.stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(ctx.stream);
  if (e != cudaSuccess) return cuda_error(e, "count_nonfinite of " + t.shape_str() + " on cuda:" + std::to_string(ctx.device));
  return static_cast<int64_t>(host);
}

}  // namespace ls::cuda
