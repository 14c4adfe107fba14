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

namespace {
// torch.linspace(start, end, steps, float64) on the CPU: the first half of the points
// as start + step * i, the second half as end - step * (steps - 1 - i), so the end
// points are exact (step = (end - start) / (steps - 1), halfway = steps / 2).
std::vector<double> torch_linspace(double start, double end, int64_t steps) {
  std::vector<double> v(static_cast<size_t>(steps));
  const double step = (end - start) / static_cast<double>(steps - 1);
  const int64_t halfway = steps / 2;
  for (int64_t i = 0; i < steps; ++i)
    v[static_cast<size_t>(i)] = i < halfway ? start + step * static_cast<double>(i)
                                            : end - step * static_cast<double>(steps - 1 - i);
  return v;
}
}  // namespace

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
  // i = argmin |sample_sigmas - sigma|: an fp32 tensor minus a Python float, so
  // |fl32(s_k - fl32(sigma))| in fp32; the first minimum.
  size_t i = 0;
  float best = std::numeric_limits<float>::infinity();
  const auto sigma32 = static_cast<float>(sigma);
  for (size_t k = 0; k < sample_sigmas.size(); ++k) {
    const float d = std::fabs(sample_sigmas[k] - sigma32);
    if (d < best) best = d, i = k;
  }
  const float sigma_next = sample_sigmas[std::min(i + 1, sample_sigmas.size() - 1)];
  const auto nd = static_cast<double>(n);
  // start from sigma (a Python float: float64 arithmetic); stop from sigma_next (an
  // element of the fp32 schedule tensor: time_shift_sigma(., f, 1) in fp32 tensor ops,
  // 1 - that in fp32, then float() * n in float64). Python's round: half to even.
  const int64_t start_raw = static_cast<int64_t>(std::nearbyint((1.0 - time_shift_sigma(sigma, shift_v, 1.0)) * nd));
  const auto fv = static_cast<float>(shift_v);
  const float base = sigma_next / (fv + sigma_next * static_cast<float>(1.0 - shift_v));
  const int64_t stop_raw = static_cast<int64_t>(std::nearbyint(static_cast<double>(1.0f - base) * nd));
  int64_t start = std::min(start_raw, n - 1);
  int64_t stop = std::max(stop_raw, start + 1);
  stop = std::min(stop, n);
  // The stream's flow-time grid: g = linspace(1, 0, n + 1) (float64),
  // t_k = 1 - f g_k / (1 + (f - 1) g_k); dt = diff(t)[start:stop]; w = fl32(dt / sum dt).
  const std::vector<double> g = torch_linspace(1.0, 0.0, n + 1);
  std::vector<double> t(static_cast<size_t>(n + 1));
  for (int64_t k = 0; k <= n; ++k) {
    const double gk = g[static_cast<size_t>(k)];
    t[static_cast<size_t>(k)] = 1.0 - stream_shift * gk / (1.0 + (stream_shift - 1.0) * gk);
  }
  double sum = 0.0;
  for (int64_t k = start; k < stop; ++k) sum += t[static_cast<size_t>(k + 1)] - t[static_cast<size_t>(k)];
  EffectiveHead e;
  e.start = start;
  e.stop = stop;
  const float* W = bank_w.ptr<float>();
  const float* B = bank_b.ptr<float>();
  // W_eff = R_0 + einsum(w, R_first..R_{stop-1}), first = max(start, 1): the weighted
  // sum of the offset blocks accumulated in fp32 in ascending k (one fused
  // multiply-add per term, as a K <= n fp32 GEMM does), then added to R_0 once.
  const int64_t first = std::max<int64_t>(start, 1);
  std::vector<float> acc_w(static_cast<size_t>(out * D), 0.0f), acc_b(static_cast<size_t>(out), 0.0f);
  for (int64_t k = first; k < stop; ++k) {
    const auto wk = static_cast<float>((t[static_cast<size_t>(k + 1)] - t[static_cast<size_t>(k)]) / sum);
    const float* R = W + k * out * D;
    for (int64_t j = 0; j < out * D; ++j) acc_w[static_cast<size_t>(j)] = std::fma(wk, R[j], acc_w[static_cast<size_t>(j)]);
    for (int64_t j = 0; j < out; ++j) acc_b[static_cast<size_t>(j)] = std::fma(wk, B[k * out + j], acc_b[static_cast<size_t>(j)]);
  }
  e.w.resize(static_cast<size_t>(out * D));
  e.b.resize(static_cast<size_t>(out));
  for (int64_t j = 0; j < out * D; ++j) e.w[static_cast<size_t>(j)] = W[j] + acc_w[static_cast<size_t>(j)];
  for (int64_t j = 0; j < out; ++j) e.b[static_cast<size_t>(j)] = B[j] + acc_b[static_cast<size_t>(j)];
  return e;
}

}  // namespace ls::h3
