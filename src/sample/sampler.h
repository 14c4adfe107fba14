// Flow Euler sampling of H3's packed audio-video latent, as ComfyUI runs it
// (KSampler / CFGGuider with sampler "euler", ModelSamplingAV + CONST; h3-model.md
// §2.1, §6.1, §10 item 10).
//
// The state is ONE fp32 vector: the video latent [Cv, T, Hl, Wl] flattened, then the
// audio latent [Ca, 2, A] flattened (ComfyUI's pack_latents). Every operation below is
// elementwise fp32 with one rounding per PyTorch op, in PyTorch's operand order, so a
// run reproduces ComfyUI's sampler arithmetic exactly given the same velocities.
//
// Order of one run (CFGGuider.inner_sample -> KSAMPLER.sample -> sample_euler):
//   1. latent_in = process_latent_in(latent): audio part * audio_scale (4.0). ComfyUI
//      skips this for an all-zero latent (t2va); multiplying zeros changes nothing.
//   2. x = noise_scaling(sigma_0, noise, latent_in) = fl(sigma_0 * noise) + fl(fl(1 - sigma_0) * latent_in)
//      The noise is NOT scaled by audio_scale: the audio part of x is the carried
//      variable y = sigma * eps + (1 - sigma) * audio_scale * z0 (h3-model.md §2.2).
//   3. for i in 0..steps-1 (sigma = sigmas[i], sigma_next = sigmas[i+1]):
//        v_pos = model(x, sigma, positive)           velocity, ComfyUI sign
//        den_pos = fl(x - fl(v_pos * sigma))          CONST.calculate_denoised
//        if cfg != 1:  v_neg = model(x, sigma, negative); den_neg likewise;
//                      den = fl(den_neg + fl(fl(den_pos - den_neg) * cfg))   cfg_function
//        else:         den = den_pos                  (ComfyUI's cfg1 optimisation:
//                                                      the negative is never evaluated)
//        d  = fl(fl(x - den) / sigma)                 to_d
//        dt = fl(sigma_next - sigma)
//        x  = fl(x + fl(d * dt))                      Euler
//      The last step (sigma_next = 0) is the same formula (not x = den).
//   4. x = inverse_noise_scaling(sigma_last, x) = x / fl(1 - sigma_last) (sigma_last = 0: exact)
//   5. out = process_latent_out(x): audio part / audio_scale.
// cfg "== 1" uses Python's math.isclose(cfg, 1.0) (relative 1e-9), like ComfyUI.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/status.h"

namespace ls::sample {

// Sizes of the two parts of the packed state.
struct PackedShape {
  int64_t video = 0;  // Cv * T * Hl * Wl
  int64_t audio = 0;  // Ca * 2 * A
  int64_t total() const { return video + audio; }
};

enum class Prompt { positive = 0, negative = 1 };

// What the sampler drives: one denoiser call.
class VelocityModel {
 public:
  virtual ~VelocityModel() = default;
  // Writes the velocity (ComfyUI sign: x0 = x - sigma * v) for state x at `sigma`
  // under `prompt` into v (fp32, same size as x). `step` is the step index (for
  // progress and reports).
  virtual Status velocity(std::span<const float> x, float sigma, Prompt prompt, int64_t step,
                          std::span<float> v) = 0;
};

// ---- the elementwise pieces (each one PyTorch expression, fp32) -----------------
void process_latent_in(std::span<float> x, const PackedShape& shape, double audio_scale);
void process_latent_out(std::span<float> x, const PackedShape& shape, double audio_scale);
// x = fl(sigma * noise) + fl(fl(1 - sigma) * latent); latent empty = zeros.
std::vector<float> noise_scaling(float sigma, std::span<const float> noise, std::span<const float> latent);
// den = fl(x - fl(v * sigma))
void denoised_from_velocity(std::span<const float> x, std::span<const float> v, float sigma,
                            std::span<float> den);
// In place on den_pos: den_pos = fl(den_neg + fl(fl(den_pos - den_neg) * fl32(cfg)))
void cfg_combine(std::span<float> den_pos, std::span<const float> den_neg, double cfg);
// In place on x: x = fl(x + fl(fl(fl(x - den) / sigma) * fl(sigma_next - sigma)))
void euler_step(std::span<float> x, std::span<const float> den, float sigma, float sigma_next);
// x = x / fl(1 - sigma)
void inverse_noise_scaling(std::span<float> x, float sigma);
// Python's math.isclose(cfg, 1.0): one forward per step.
bool cfg_is_one(double cfg);

struct SamplerOptions {
  double cfg = 1.0;          // guidance scale; the negative prompt is used when !cfg_is_one(cfg)
  double audio_scale = 4.0;  // shift_video / shift_audio (h3-model.md §6.1)
};

struct StepEvent {
  int64_t step = 0;   // 0-based
  int64_t steps = 0;
  float sigma = 0, sigma_next = 0;
  const std::vector<float>* x = nullptr;  // state after the step
};
using StepCallback = std::function<void(const StepEvent&)>;

// Steps 1-5 above. `sigmas`: steps + 1 values, descending, sigmas[i] > 0 for i < steps.
// `noise`: packed [shape.total()]; `latent`: empty (t2va: zeros) or packed, unscaled.
// Returns the final packed latent (process_latent_out applied), or the model's error.
Expected<std::vector<float>> sample_flow_euler(VelocityModel& model, const std::vector<float>& sigmas,
                                               std::span<const float> noise, std::span<const float> latent,
                                               const PackedShape& shape, const SamplerOptions& options,
                                               const StepCallback& on_step = {});

}  // namespace ls::sample
