// Entry points of the quantised linears for benchmarks and tests (plain C++: no CUDA
// headers, so bench/bench_linear_quant.cpp compiles with the host compiler; a build with
// LAYERSTREAM_CUDA links them from src/backend/cuda/linear_quant.cu).
#pragma once

#include <cstddef>

#include "backend/backend.h"

namespace ls::cuda {

// The linear region of the CUDA backend's workspace (after the GEMM's): the quantised
// linears' cuBLASLt workspace and their row-chunk scratch, a constant.
size_t linear_quant_workspace_bytes();

// The quantised GEMM alone, with the algorithm the linear pins for w's K:
//   fp8 = false: acc i32 [M, N] = q i8 [M, K] * w i8 [N, K]^T (int8 tensor cores, exact);
//   fp8 = true:  acc f32 [M, N] = q e4m3 [M, K] * w e4m3 [N, K]^T (fp32 accumulation).
// Queued on b's compute stream (b must be a CUDA backend); q and acc contiguous.
Status bench_quant_gemm_only(Backend& b, bool fp8, const TensorView& q, const TensorView& w, const TensorView& acc);

// The stages around the GEMM alone, as Backend::linear runs them (bench_linear_quant's
// per-stage split):
//   activations: q (i8 | e4m3 [M, K], contiguous) and the row scales rs f32 [M] from x
//                (bf16 [M, K], or u [M, 2K] with swiglu for int8), with w's format, group and
//                activation scale;
//   epilogue:    out bf16 [M, N] from acc (i32 | f32 [M, ld], ld = N rounded up to 4,
//                contiguous), rs and w.scale, no bias.
Status bench_quant_activations(Backend& b, const TensorView& x, const LinearWeight& w, bool swiglu, const TensorView& q,
                               const TensorView& rs);
Status bench_quant_epilogue(Backend& b, const TensorView& acc, const TensorView& rs, const LinearWeight& w,
                            const TensorView& out);

}  // namespace ls::cuda
