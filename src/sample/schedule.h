// Sigma schedules for H3's flow model (h3-model.md §6.1, §6.2, Appendix A).
//
// Everything here is a pure function evaluated in fp32 with the exact operation order
// PyTorch uses in ComfyUI, so the tables are bit-identical to ComfyUI's (the tests
// check the printed 6-significant-digit tables of h3-model.md; the operation order is
// written beside each function).
//
// Video and audio streams use different flow shifts (12 and 3). The sampler walks ONE
// schedule (the video sigmas); the audio stream's sigma at each step is derived from
// the video sigma with time_shift_sigma (that happens inside the model, §2.2). The
// audio column here is for display and for tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace ls::sample {

constexpr int64_t kFlowTimesteps = 1000;  // ModelSamplingDiscreteFlow table length
constexpr double kVideoShift = 12.0;      // sigma_shift_video
constexpr double kAudioShift = 3.0;       // sigma_shift_audio

// sigma(t) = shift*t / (1 + (shift-1)*t) for one fp32 t, as PyTorch evaluates it on
// an fp32 tensor with Python-float scalars: num = fl(shift*t), den = fl(1 + fl((shift-1)*t)),
// sigma = fl(num / den). shift == 1 returns t (ComfyUI's time_snr_shift short-cut).
float flow_shift_sigma(float t, double shift);

// ModelSamplingDiscreteFlow's 1000-entry table: entry i (0-based) is sigma(t_i) with
//   t_i = fl(fl(fl(float(i+1) / 1000) * 1000) / 1000)
// (torch.arange(1, 1001) / 1000 gives fp32, times the multiplier 1000, and sigma()
// divides by the multiplier again). Ascending; entry 999 is exactly 1.
std::vector<float> flow_sigma_table(double shift);

// time_shift_sigma(sigma, f, g) in fp32 (h3-model.md §2.2): the unshifted base
// b = sigma / (f + sigma*(1-f)), re-shifted by g: g*b / (1 + (g-1)*b). Each product,
// sum and quotient rounded to fp32 in that order.
float time_shift_sigma(float sigma, double from_shift, double to_shift);
// The same formula in double precision: what _forward uses for the audio stream's
// timestep t_a = 1 - time_shift_sigma(sigma_v) (h3-model.md §2.3 step 4, Python floats).
double time_shift_sigma_f64(double sigma, double from_shift, double to_shift);

// ComfyUI's "simple" scheduler over a sigma table of length n: for x = 0..steps-1,
// sigmas[n - 1 - int(x * (n / steps))] where n / steps is a double and int() truncates,
// then a terminal 0. Returns steps + 1 values, descending. steps must be >= 1.
std::vector<float> simple_schedule(const std::vector<float>& table, int64_t steps);

// The schedule a generate run uses: video sigmas (simple, shift 12) and the audio
// sigma the model derives for each, in double as the model's audio timestep does
// (time_shift_sigma_f64(double(video[i]), 12, 3); h3-model.md's printed audio
// columns are exactly these values). The fp32 carry factor inside the model uses the
// fp32 variant and may differ from these by an ulp.
struct Schedule {
  std::vector<float> video;   // steps + 1 values, video[steps] == 0
  std::vector<double> audio;  // same length
  int64_t steps() const { return static_cast<int64_t>(video.size()) - 1; }
};
// Fails (invalid_argument) for steps < 1 or steps > 1000 (the table has 1000 entries:
// more steps would repeat sigmas) or a non-positive shift.
Expected<Schedule> make_simple_schedule(int64_t steps, double video_shift = kVideoShift,
                                        double audio_shift = kAudioShift);

// "1, 0.972973, 0.923077, 0.8, 0" (6 significant digits).
std::string format_sigmas(const std::vector<float>& sigmas);
std::string format_sigmas(const std::vector<double>& sigmas);

}  // namespace ls::sample
