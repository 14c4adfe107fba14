// Final layer on the target rows (h3-model.md §2.12): RMSNorm (bf16), modulation with
// the final AdaLN table in the table's dtype (bf16 unpruned: bf16 ops, then widened to
// fp32; fp32 curve form: ops in fp32), then the fp32 output head (+ bias).
// PDD head bank (cfg.pdd_heads = n > 1, on both heads): each effective head is R_0 plus a
// weighted sum of the bank's offset blocks for the current step (pdd_effective_head),
// formed on the host.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "core/tensor.h"
#include "model/h3/config.h"

namespace ls::h3 {

// Rows [a, b) of the sequence (all of one stream):
//   x_rows bf16 [b - a, D]: the residual rows [a, b); rows i32 [S] (final-table row = t_index per token);
//   shift, scale bf16|f32 [M, D]; norm_w bf16 [D]; head_w f32 [out, D]; head_b f32 [out];
//   scratch h bf16 [n, D], mod f32 [n, D]; out f32 [n, out].
Status final_layer_rows(Backend& be, const TensorView& x_rows, const TensorView& rows, int64_t a, int64_t b,
                        const TensorView& shift, const TensorView& scale, const TensorView& norm_w,
                        const TensorView& head_w, const TensorView& head_b, const TensorView& h, const TensorView& mod,
                        const TensorView& out);

// The PDD effective head of one stream, host fp32: W_eff [out, D], b_eff [out]
// (ComfyUI's FinalLayer / _pdd_head; both heads are banked with the same n and use the
// same [start, stop), each with its own stream shift in the weights):
//   i = argmin |sample_sigmas - sigma| (fp32), sigma_next = sample_sigmas[min(i + 1, last)];
//   start = round((1 - time_shift_sigma(sigma, shift_v, 1)) * n) (float64), stop likewise
//   from sigma_next in fp32 tensor arithmetic (round half even, as Python);
//   start = min(start, n - 1); stop = max(stop, start + 1);
//   g = torch.linspace(1, 0, n + 1) (float64), t_k = 1 - f g_k / (1 + (f - 1) g_k),
//   f = the stream's shift; dt = diff(t)[start:stop]; w = fl32(dt / sum dt);
//   W_eff = R_0 + sum_{k = max(start, 1)}^{stop - 1} w[k - start] R_k (the sum accumulated
//   in fp32, k ascending, one fma per term; then one add to R_0), same for the bias.
// bank_w: f32 [n * out, D]; bank_b: f32 [n * out].
struct EffectiveHead {
  std::vector<float> w, b;
  int64_t start = 0, stop = 0;
};
Expected<EffectiveHead> pdd_effective_head(const TensorView& bank_w, const TensorView& bank_b, int64_t n,
                                           const std::vector<float>& sample_sigmas, double sigma, double shift_v,
                                           double stream_shift);

}  // namespace ls::h3
