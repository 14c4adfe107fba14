#include "sample/sampler.h"

#include <cmath>
#include <string>

namespace ls::sample {

namespace {
// The audio scale as PyTorch applies a Python float to an fp32 tensor: converted to fp32.
float scale_f32(double audio_scale) { return static_cast<float>(audio_scale); }
}  // namespace

void process_latent_in(std::span<float> x, const PackedShape& shape, double audio_scale) {
  LS_CHECK(static_cast<int64_t>(x.size()) == shape.total());
  const float s = scale_f32(audio_scale);
  for (int64_t i = shape.video; i < shape.total(); ++i) x[static_cast<size_t>(i)] *= s;
}

void process_latent_out(std::span<float> x, const PackedShape& shape, double audio_scale) {
  LS_CHECK(static_cast<int64_t>(x.size()) == shape.total());
  const float s = scale_f32(audio_scale);
  for (int64_t i = shape.video; i < shape.total(); ++i) x[static_cast<size_t>(i)] /= s;
}

std::vector<float> noise_scaling(float sigma, std::span<const float> noise, std::span<const float> latent) {
  LS_CHECK(latent.empty() || latent.size() == noise.size());
  const float keep = 1.0f - sigma;
  std::vector<float> x(noise.size());
  for (size_t i = 0; i < noise.size(); ++i) {
    const float l = latent.empty() ? 0.0f : latent[i];
    const float a = sigma * noise[i];
    const float b = keep * l;
    x[i] = a + b;
  }
  return x;
}

void denoised_from_velocity(std::span<const float> x, std::span<const float> v, float sigma,
                            std::span<float> den) {
  LS_CHECK(x.size() == v.size() && x.size() == den.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float vs = v[i] * sigma;
    den[i] = x[i] - vs;
  }
}

void cfg_combine(std::span<float> den_pos, std::span<const float> den_neg, double cfg) {
  LS_CHECK(den_pos.size() == den_neg.size());
  const float s = static_cast<float>(cfg);
  for (size_t i = 0; i < den_pos.size(); ++i) {
    const float diff = den_pos[i] - den_neg[i];
    const float scaled = diff * s;
    den_pos[i] = den_neg[i] + scaled;
  }
}

void euler_step(std::span<float> x, std::span<const float> den, float sigma, float sigma_next) {
  LS_CHECK(x.size() == den.size());
  const float dt = sigma_next - sigma;
  for (size_t i = 0; i < x.size(); ++i) {
    const float d = (x[i] - den[i]) / sigma;
    const float step = d * dt;
    x[i] = x[i] + step;
  }
}

void inverse_noise_scaling(std::span<float> x, float sigma) {
  const float keep = 1.0f - sigma;
  for (float& v : x) v = v / keep;
}

bool cfg_is_one(double cfg) {
  // math.isclose(a, b) with rel_tol 1e-9, abs_tol 0.
  return std::fabs(cfg - 1.0) <= 1e-9 * std::fmax(std::fabs(cfg), 1.0);
}

Expected<std::vector<float>> sample_flow_euler(VelocityModel& model, const std::vector<float>& sigmas,
                                               std::span<const float> noise, std::span<const float> latent,
                                               const PackedShape& shape, const SamplerOptions& options,
                                               const StepCallback& on_step) {
  const int64_t steps = static_cast<int64_t>(sigmas.size()) - 1;
  if (steps < 1) return make_error(ErrorCode::invalid_argument, "a schedule needs at least 2 sigmas");
  for (int64_t i = 0; i < steps; ++i)
    if (!(sigmas[static_cast<size_t>(i)] > 0.0f))
      return make_error(ErrorCode::invalid_argument,
                        "sigma " + std::to_string(i) + " of the schedule is not positive (only the last may be 0)");
  if (static_cast<int64_t>(noise.size()) != shape.total())
    return make_error(ErrorCode::invalid_argument, "noise has " + std::to_string(noise.size()) +
                                                       " values, the packed latent " + std::to_string(shape.total()));
  if (!latent.empty() && static_cast<int64_t>(latent.size()) != shape.total())
    return make_error(ErrorCode::invalid_argument, "the initial latent has " + std::to_string(latent.size()) +
                                                       " values, the packed latent " + std::to_string(shape.total()));

  // 1. process_latent_in (skipped for an all-zero latent, as ComfyUI does).
  std::vector<float> latent_in(latent.begin(), latent.end());
  bool nonzero = false;
  for (float v : latent_in) nonzero = nonzero || v != 0.0f;
  if (nonzero) process_latent_in(latent_in, shape, options.audio_scale);
  else latent_in.clear();

  // 2. noise_scaling at sigma_0.
  std::vector<float> x = noise_scaling(sigmas[0], noise, latent_in);

  // 3. Euler steps.
  const bool guided = !cfg_is_one(options.cfg);
  const size_t n = x.size();
  std::vector<float> v(n), den(n), den_neg(guided ? n : 0);
  for (int64_t i = 0; i < steps; ++i) {
    const float sigma = sigmas[static_cast<size_t>(i)];
    const float sigma_next = sigmas[static_cast<size_t>(i + 1)];
    LS_TRY(model.velocity(x, sigma, Prompt::positive, i, v));
    denoised_from_velocity(x, v, sigma, den);
    if (guided) {
      LS_TRY(model.velocity(x, sigma, Prompt::negative, i, v));
      denoised_from_velocity(x, v, sigma, den_neg);
      cfg_combine(den, den_neg, options.cfg);
    }
    euler_step(x, den, sigma, sigma_next);
    if (on_step) on_step(StepEvent{i, steps, sigma, sigma_next, &x});
  }

  // 4. inverse_noise_scaling at the last sigma; 5. process_latent_out.
  inverse_noise_scaling(x, sigmas.back());
  process_latent_out(x, shape, options.audio_scale);
  return x;
}

}  // namespace ls::sample
