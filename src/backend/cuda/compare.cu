// count_unequal (cuda_ext.h): bytewise comparison of two device views, for tests.
#include "backend/cuda/cuda_ext.h"
#include "backend/cuda/ops.cuh"

namespace ls::cuda {
namespace {

__global__ void count_unequal_rows(const uint8_t* x, int64_t sx, const uint8_t* y, int64_t sy, int64_t M,
                                   int64_t row_bytes, int es, unsigned long long* counter) {
  unsigned long long n = 0;
  for (int64_t m = blockIdx.x; m < M; m += gridDim.x) {
    for (int64_t e = threadIdx.x; e < row_bytes / es; e += blockDim.x) {
      bool diff = false;
      for (int i = 0; i < es; ++i) diff |= x[m * sx + e * es + i] != y[m * sy + e * es + i];
      n += diff ? 1 : 0;
    }
  }
  if (n) atomicAdd(counter, n);
}

}  // namespace

Status count_unequal(Backend& b, const TensorView& x, const TensorView& y, const TensorView& counter) {
  LS_CHECK_MSG(x.dtype == y.dtype && x.ndim == 2 && y.ndim == 2 && x.shape[0] == y.shape[0] &&
                   x.shape[1] == y.shape[1] && x.inner_contiguous() && y.inner_contiguous() && counter.numel() >= 1 &&
                   counter.elem_size() == 8,
               "count_unequal: " + x.shape_str() + " vs " + y.shape_str() + " counter " + counter.shape_str());
  cudaStream_t s = compute_stream(b);
  LS_CHECK_MSG(s != nullptr, "count_unequal needs a CUDA backend");
  const int64_t M = x.shape[0];
  if (M == 0) return Status();
  const int es = static_cast<int>(x.elem_size());
  const unsigned blocks = static_cast<unsigned>(M < 4096 ? M : 4096);
  count_unequal_rows<<<blocks, 256, 0, s>>>(x.ptr<const uint8_t>(), x.stride[0] * es, y.ptr<const uint8_t>(),
                                            y.stride[0] * es, M, x.shape[1] * es, es,
                                            counter.ptr<unsigned long long>());
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

}  // namespace ls::cuda
