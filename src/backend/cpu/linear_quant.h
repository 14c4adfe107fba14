// The quantised linears (Backend::linear for int8_convrot and fp8_e4m3, backend.h) on the
// CPU, and the argument checks every backend shares (so the refusals and their messages
// agree between backends). Numerics: docs/numerics.md "Quantised linears"; the element
// arithmetic is src/backend/cpu/linear_quant_math.h, shared with CUDA.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace ls {

// The largest K (input features) the quantised linears take: the CPU quantises a tile of
// rows into a fixed 64 KiB stack buffer (docs/numerics.md); H3's largest is 14336 (fc2).
constexpr int64_t kLinearQuantMaxK = 65536;

// Checks the arguments of Backend::linear for a quantised format (w.format int8_convrot or
// fp8_e4m3; bf16 never reaches it). `who` names the backend in messages ("cpu", "cuda").
// Status (unsupported / invalid_argument) for what bad input or an unsupported combination
// causes: an unknown format, dtypes other than x bf16, w i8 | f8e4m3, scale f32, bias
// f32|bf16, out bf16; a ConvRot group that is not a power of 4 in [4, 4096] dividing K; a
// scale with the wrong number of elements (int8: 1 or N; fp8: 1); a non-finite or
// non-positive fp8 input_scale; swiglu_input with fp8; K above kLinearQuantMaxK. LS_CHECK
// (a bug) for shapes that do not fit each other (x [M, K] or [M, 2K] with swiglu_input,
// w [N, K], out [M, N], bias [N]) or rows that are not contiguous.
// On success *K_out is the weight's K (the quantised row length).
Status check_linear_quant_args(const char* who, const TensorView& x, const LinearWeight& w, const TensorView* bias,
                               const TensorView& out, const LinearOptions& opts, int64_t* K_out);

namespace cpu {
Status cpu_op_linear(const TensorView& x, const LinearWeight& w, const TensorView* bias, const TensorView& out,
                     const LinearOptions& opts);
}  // namespace cpu

}  // namespace ls
