// The ConvRot rotation: an fp32 fast Hadamard transform of one group of G values
// (comfyui-and-quantized-weights.md §2.2; issue 14). ONE definition, used by the CPU
// int8 linear (activations), the synthetic int8 weights (make-model) and as the order
// every other backend reproduces.
//
// H_G = (h4 (x) h4 (x) ... (x) h4) / sqrt(G), log4(G) factors, h4 = [[1,1,1,-1],[1,1,-1,1],
// [1,-1,1,1],[-1,1,1,1]] (symmetric, orthogonal up to the factor 2). Evaluated as radix-4
// stages with strides 1, 4, 16, ... (ascending), each out of place: element i of the
// stage with stride s has digit d = (i / s) % 4 and base b = i - d * s, and becomes
//   fl32(0.5f * t),  t = the left-to-right fp32 sum of the four terms
//   +-v[b], +-v[b + s], +-v[b + 2s], +-v[b + 3s] with the signs of h4 row d
//   (row 0: + + + -, row 1: + + - +, row 2: + - + +, row 3: - + + +).
// Every operation is a correctly rounded fp32 add or a multiply by 0.5 (exact unless it
// underflows), so the bits are the same on every machine and compiler (-ffp-contract=off).
#pragma once

#include <cstdint>

namespace ls {

// True when G is a power of 4 (>= 4) no larger than kMaxHadamardGroup.
constexpr int64_t kMaxHadamardGroup = 4096;
bool hadamard_group_ok(int64_t G);

// In place on v[0 .. G): v = v * H_G (a row vector times H_G; H_G is symmetric).
// tmp: G floats of scratch. LS_CHECK that G is valid.
void hadamard_f32(float* v, float* tmp, int64_t G);

}  // namespace ls
