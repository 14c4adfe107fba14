// Sinusoidal time embedding, cos first (h3-model.md §2.5), fp32:
//   half = N/2; e_j = (-ln(10000) * j) / half; freq_j = exp(e_j); arg = t * freq_j
//   out[m] = [cos(arg_0..half-1), sin(arg_0..half-1)]
// expf/cosf/sinf are CUDA's accurate versions (a few ulp), not the fast intrinsics.
#include "backend/cuda/ops.cuh"

namespace ls::cuda {
namespace {

// t: f32 [M]; out: f32 [M, N].
__global__ void time_embedding_f32(const float* __restrict__ t, int64_t st, float* __restrict__ out, int64_t so,
                                   int half) {
  const int64_t m = blockIdx.x;
  const float tv = t[m * st];
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    const float e = (-9.21034037198f * static_cast<float>(j)) / static_cast<float>(half);
    const float arg = tv * expf(e);
    out[m * so + j] = cosf(arg);
    out[m * so + half + j] = sinf(arg);
  }
}

}  // namespace

Status cuda_op_time_embedding(CudaContext& ctx, const TensorView& t, const TensorView& out) {
  LS_CHECK_MSG(t.ndim == 1 && out.ndim == 2 && out.shape[0] == t.shape[0] && out.shape[1] % 2 == 0 &&
                   out.inner_contiguous(),
               "time_embedding: t " + t.shape_str() + " out " + out.shape_str());
  if (t.dtype != DType::f32 || out.dtype != DType::f32)
    return unsupported("time_embedding", "needs f32; got " + t.shape_str() + " -> " + out.shape_str());
  if (t.shape[0] == 0) return Status();
  time_embedding_f32<<<static_cast<unsigned>(t.shape[0]), 128, 0, ctx.stream>>>(
      t.ptr<const float>(), t.stride[0], out.ptr<float>(), out.stride[0], static_cast<int>(out.shape[1] / 2));
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

}  // namespace ls::cuda
