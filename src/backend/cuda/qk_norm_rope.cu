// Per-head RMSNorm over head_dim, then split-half partial RoPE, in place on a strided
// q or k view of the fused qkv buffer (h3-model.md §2.8).
//   rrms = 1 / sqrt(sum_d x_d^2 / Dh + eps); n_d = bf16(x_d * rrms * w_d)
//   j < P: out_j = bf16(c*n_j - s*n_{j+P}), out_{j+P} = bf16(s*n_j + c*n_{j+P}); d >= 2P: n_d
// One warp per (token, head). Sum of squares order (fixed, depends on Dh only): lane l
// sums dims l, l+32, l+64, ... in order, then a xor-shuffle tree (16, 8, 4, 2, 1).
// The rotation's products and difference are separate roundings (-fmad=false), the
// same as the CPU reference built with -ffp-contract=off.
#include "backend/cuda/ops.cuh"

namespace ls::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxDh = 256;

// x: bf16 [M, H, Dh] (row stride sx, head stride sh); w: bf16 [Dh];
// rope: bf16 [M, P, 2] (row stride sr, pair stride sp) or null.
__global__ void __launch_bounds__(kWarps * 32) qk_norm_rope_bf16(uint16_t* x, int64_t sx, int64_t sh, int64_t M,
                                                                 int H, int Dh, const uint16_t* __restrict__ w,
                                                                 const uint16_t* __restrict__ rope, int64_t sr,
                                                                 int64_t sp, int P, float eps) {
  __shared__ float n_s[kWarps][kMaxDh];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + warp;  // (token, head)
  if (item >= M * H) return;
  const int64_t m = item / H;
  const int h = static_cast<int>(item % H);
  uint16_t* xh = x + m * sx + h * sh;
  float ss = 0.0f;
  for (int d = lane; d < Dh; d += 32) {
    const float v = bf16_bits_to_f32(xh[d]);
    ss += v * v;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float rrms = 1.0f / sqrtf(ss / static_cast<float>(Dh) + eps);
  for (int d = lane; d < Dh; d += 32) n_s[warp][d] = round_bf16(bf16_bits_to_f32(xh[d]) * rrms * bf16_bits_to_f32(w[d]));
  __syncwarp();
  for (int d = lane; d < Dh; d += 32) {
    float r = n_s[warp][d];
    if (rope != nullptr && d < 2 * P) {
      const int j = d < P ? d : d - P;
      const uint16_t* cs = rope + m * sr + j * sp;
      const float c = bf16_bits_to_f32(cs[0]), s = bf16_bits_to_f32(cs[1]);
      const float x0 = n_s[warp][j], x1 = n_s[warp][j + P];
      r = d < P ? c * x0 - s * x1 : s * x0 + c * x1;
    }
    xh[d] = f32_to_bf16_bits(r);
  }
}

}  // namespace

Status cuda_op_qk_norm_rope(CudaContext& ctx, const TensorView& x, const TensorView& w, const TensorView& rope,
                            float eps) {
  LS_CHECK_MSG(x.ndim == 3 && x.inner_contiguous() && w.ndim == 1 && w.shape[0] == x.shape[2],
               "qk_norm_rope: x " + x.shape_str() + " w " + w.shape_str());
  if (x.dtype != DType::bf16 || w.dtype != DType::bf16 || (!rope.empty() && rope.dtype != DType::bf16))
    return unsupported("qk_norm_rope", "needs bf16 x, w, rope; got " + x.shape_str() + ", " + w.shape_str());
  const int64_t M = x.shape[0];
  const int H = static_cast<int>(x.shape[1]), Dh = static_cast<int>(x.shape[2]);
  if (Dh > kMaxDh) return unsupported("qk_norm_rope", "head_dim " + std::to_string(Dh) + " > 256");
  int P = 0;
  if (!rope.empty()) {
    LS_CHECK_MSG(rope.ndim == 3 && rope.shape[0] == M && rope.shape[2] == 2 && rope.inner_contiguous() &&
                     2 * rope.shape[1] <= Dh,
                 "qk_norm_rope: rope " + rope.shape_str() + " for x " + x.shape_str());
    P = static_cast<int>(rope.shape[1]);
  }
  if (M == 0) return Status();
  const int64_t items = M * H;
  qk_norm_rope_bf16<<<static_cast<unsigned>(div_up(items, kWarps)), kWarps * 32, 0, ctx.stream>>>(
      x.ptr<uint16_t>(), x.stride[0], x.stride[1], M, H, Dh, w.ptr<const uint16_t>(),
      rope.empty() ? nullptr : rope.ptr<const uint16_t>(), rope.empty() ? 0 : rope.stride[0],
      rope.empty() ? 0 : rope.stride[1], P, eps);
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

}  // namespace ls::cuda
