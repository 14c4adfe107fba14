#include "model/h3/adaln.h"

#include <algorithm>
#include <cmath>

namespace ls::h3 {

std::vector<float> curve_time_embedding(const TensorView& table, const std::vector<float>& t) {
  LS_CHECK(table.ndim == 2 && table.dtype == DType::f32 && table.is_contiguous());
  const int64_t G = table.shape[0], k = table.shape[1];
  LS_CHECK(G >= 2);
  const float* tab = table.ptr<float>();
  std::vector<float> out(t.size() * static_cast<size_t>(k));
  for (size_t m = 0; m < t.size(); ++m) {
    const float tc = std::min(std::max(t[m], 0.0f), 1.0f);
    const float pos = tc * static_cast<float>(G - 1);
    const auto i0 = std::min(static_cast<int64_t>(std::floor(pos)), G - 2);
    const float w = pos - static_cast<float>(i0);
    for (int64_t j = 0; j < k; ++j) {
      const float a = tab[i0 * k + j], b = tab[(i0 + 1) * k + j];
      out[m * static_cast<size_t>(k) + static_cast<size_t>(j)] = std::abs(w) < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w);
    }
  }
  return out;
}

Status adaln_input(Backend& be, const H3Config& cfg, const WeightGetter& w, const TimeEmbedScratch& s,
                   const TensorView& ain) {
  if (cfg.curve_form()) return Status();  // rows were computed on the host (curve_time_embedding)
  const TensorView pin_b = w("time_embedder.proj_in.bias"), pout_b = w("time_embedder.proj_out.bias");
  LS_TRY(be.time_embedding(s.t, s.sinus));  // fp32 [M, tin], cos first
  LS_TRY(be.gemm(s.sinus, w("time_embedder.proj_in.weight"), &pin_b, s.hidden));
  LS_TRY(be.silu(s.hidden));
  LS_TRY(be.gemm(s.hidden, w("time_embedder.proj_out.weight"), &pout_b, s.temb));
  // t_emb is cast to bf16; the AdaLN linears apply SiLU to it in bf16 (fp32 inside, one
  // rounding): widen the bf16 values back to fp32 exactly, silu, round to bf16.
  LS_TRY(be.convert(s.temb, ain));
  LS_TRY(be.convert(ain, s.temb));
  LS_TRY(be.silu(s.temb));
  return be.convert(s.temb, ain);
}

Status adaln_linear(Backend& be, const TensorView& ain, const LinearWeight& weight, const TensorView& bias,
                    const TensorView& out) {
  return linear_lora(be, ain, weight, &bias, out);  // + a LoRA side path, if any
}

}  // namespace ls::h3
