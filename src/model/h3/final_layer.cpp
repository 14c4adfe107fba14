#include "model/h3/final_layer.h"

#include <cmath>
#include <limits>
#include <string>

#include "model/h3/layout.h"

namespace ls::h3 {

Status final_layer_rows(Backend& be, const TensorView& x_rows, const TensorView& rows, int64_t a, int64_t b,
                        const TensorView& shift, const TensorView& scale, const TensorView& norm_w,
                        const TensorView& head_w, const TensorView& head_b, const TensorView& h, const TensorView& mod,
                        const TensorView& out) {
  LS_CHECK(x_rows.rows() == b - a && h.rows() == b - a && mod.rows() == b - a && out.rows() == b - a);
  LS_TRY(be.rms_norm(x_rows, norm_w, 1e-5f, h));  // final_norm_eps 1e-5
  const TensorView r = rows.slice_rows(a, b);
  if (shift.dtype == DType::bf16) {
    // bf16 tables: (norm * bf16(1 + scale)) + shift in bf16, then .to(fp32).
    LS_TRY(be.modulate(h, shift, scale, r, h));
    LS_TRY(be.convert(h, mod));
  } else {
    // fp32 tables: the bf16 norm output promoted to fp32, ops in fp32.
    LS_TRY(be.modulate(h, shift, scale, r, mod));
  }
  return be.gemm(mod, head_w, &head_b, out);  // fp32 GEMM + fp32 bias
}

Expected<EffectiveHead> pdd_effective_head(const TensorView& bank_w, const TensorView& bank_b, int64_t n,
                                           const std::vector<float>& sample_sigmas, double sigma, double shift_v,
                                           double stream_shift) {
  LS_CHECK(bank_w.dtype == DType::f32 && bank_b.dtype == DType::f32 && bank_w.is_contiguous());
  LS_CHECK(n >= 2 && bank_w.shape[0] % n == 0);
  if (sample_sigmas.empty())
    return make_error(ErrorCode::invalid_argument,
                      "this checkpoint has a PDD head bank (" + std::to_string(n) +
                          " heads) which needs the sampling schedule: set Conditioning::sample_sigmas");
  const int64_t out = bank_w.shape[0] / n, D = bank_w.shape[1];
  size_t i = 0;
  double best = std::numeric_limits<double>::infinity();
  for (size_t k = 0; k < sample_sigmas.size(); ++k) {
    const double d = std::abs(static_cast<double>(sample_sigmas[k]) - sigma);
    if (d < best) best = d, i = k;  // first minimum, as argmin
  }
  const double sigma_next = sample_sigmas[std::min(i + 1, sample_sigmas.size() - 1)];
  const auto nd = static_cast<double>(n);
  auto to_index = [&](double s) { return static_cast<int64_t>(std::nearbyint((1.0 - time_shift_sigma(s, shift_v, 1.0)) * nd)); };
  int64_t start = to_index(sigma), stop = to_index(sigma_next);
  start = std::min(start, n - 1);
  stop = std::max(stop, start + 1);
  stop = std::min(stop, n);
  std::vector<double> t(static_cast<size_t>(n + 1));
  for (int64_t k = 0; k <= n; ++k) {
    const double g = 1.0 - static_cast<double>(k) / nd;
    t[static_cast<size_t>(k)] = 1.0 - stream_shift * g / (1.0 + (stream_shift - 1.0) * g);
  }
  double sum = 0.0;
  for (int64_t k = start; k < stop; ++k) sum += t[static_cast<size_t>(k + 1)] - t[static_cast<size_t>(k)];
  EffectiveHead e;
  e.start = start;
  e.stop = stop;
  const float* W = bank_w.ptr<float>();
  const float* B = bank_b.ptr<float>();
  e.w.assign(W, W + out * D);
  e.b.assign(B, B + out);
  for (int64_t k = std::max<int64_t>(start, 1); k < stop; ++k) {
    const auto wk = static_cast<float>((t[static_cast<size_t>(k + 1)] - t[static_cast<size_t>(k)]) / sum);
    const float* R = W + k * out * D;
    for (int64_t j = 0; j < out * D; ++j) e.w[static_cast<size_t>(j)] = e.w[static_cast<size_t>(j)] + wk * R[j];
    for (int64_t j = 0; j < out; ++j) e.b[static_cast<size_t>(j)] = e.b[static_cast<size_t>(j)] + wk * B[k * out + j];
  }
  return e;
}

}  // namespace ls::h3
