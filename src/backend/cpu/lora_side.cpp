// The LoRA side path of a quantised linear on the CPU: the reference (backend.h,
// Backend::lora_side; docs/numerics.md "LoRA side path").
//
// Per row m: t_r = sum_k fl32(a_k * down[k, r]) with k ascending, then y_n = sum_r
// fl32(t_r * up[n, r]) with r ascending, then out = bf16(fl32(out + y_n)). Each product and
// each sum is one fp32 operation (the build has -ffp-contract=off: no FMA), the input a_k
// is bf16 x widened or, with a fused swiglu input, lq_swiglu (the int8 linear's own fp32
// formula, shared with the CUDA kernel), and the final rounding is lq::bf16_bits, so the
// CUDA kernel (src/backend/cuda/lora_side.cu) gives the same bits.
//
// Speed without changing the order: rows go in blocks of kRows; stage 1 runs r in the
// vector lanes (every lane its own k-ascending sum), stage 2 runs the block's rows in the
// lanes (every lane its own r-ascending sum). Scratch: t of one row block on the stack
// (kRows x kLoraSideMaxRank floats = 16 KiB).
#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/linear_quant_math.h"
#include "core/thread_pool.h"

namespace ls::cpu {

namespace {
constexpr int64_t kRows = 16;
}  // namespace

Status CpuBackend::lora_side(const TensorView& x, const LoraSide& side, const TensorView& out,
                             const LinearOptions& opts) {
  LS_TRY(check_lora_side_args("cpu", x, side, out, opts));
  const int64_t M = x.size(0), K = side.down.size(0), R = side.down.size(1), N = side.up.size(0);
  if (M == 0 || N == 0) return Status();
  const float* down = side.down.ptr<const float>();  // [K, R] contiguous
  const float* up = side.up.ptr<const float>();
  const int64_t up_ld = side.up.stride[0];
  const uint16_t* xs = x.ptr<const uint16_t>();
  const int64_t x_ld = x.stride[0];
  uint16_t* os = out.ptr<uint16_t>();
  const int64_t o_ld = out.stride[0];
  const bool swiglu = opts.swiglu_input;
  parallel_for((M + kRows - 1) / kRows, 1, [&](int64_t b0, int64_t b1) {
    alignas(64) float tr[kLoraSideMaxRank];          // t of one row, [R]
    alignas(64) float tt[kLoraSideMaxRank * kRows];  // t of the block, [R][kRows]
    alignas(64) float y[kRows];
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t m0 = blk * kRows, rows = std::min(kRows, M - m0);
      // Stage 1: t = a . down, k ascending, one row at a time (r in the lanes).
      for (int64_t i = 0; i < rows; ++i) {
        const uint16_t* xr = xs + (m0 + i) * x_ld;
        std::fill(tr, tr + R, 0.0f);
        for (int64_t k = 0; k < K; ++k) {
          const float a = swiglu ? lq::lq_swiglu(lq::bf16_widen(xr[k]), lq::bf16_widen(xr[K + k])) : lq::bf16_widen(xr[k]);
          const float* dk = down + k * R;
          for (int64_t r = 0; r < R; ++r) tr[r] = tr[r] + a * dk[r];
        }
        for (int64_t r = 0; r < R; ++r) tt[r * kRows + i] = tr[r];
      }
      for (int64_t i = rows; i < kRows; ++i)
        for (int64_t r = 0; r < R; ++r) tt[r * kRows + i] = 0.0f;  // unused lanes (never stored)
      // Stage 2: y = t . up^T, r ascending, the block's rows in the lanes.
      for (int64_t n = 0; n < N; ++n) {
        const float* un = up + n * up_ld;
        for (int64_t i = 0; i < kRows; ++i) y[i] = 0.0f;
        for (int64_t r = 0; r < R; ++r) {
          const float u = un[r];
          const float* tk = tt + r * kRows;
          for (int64_t i = 0; i < kRows; ++i) y[i] = y[i] + tk[i] * u;
        }
        for (int64_t i = 0; i < rows; ++i) {
          uint16_t* o = os + (m0 + i) * o_ld + n;
          *o = lq::bf16_bits(lq::bf16_widen(*o) + y[i]);
        }
      }
    }
  });
  return Status();
}

}  // namespace ls::cpu
