#include "sample/schedule.h"

#include <cmath>
#include <cstdio>

namespace ls::sample {

// Python-float scalars meet fp32 tensors: PyTorch converts the scalar to fp32 (the
// op's math type for fp32) and computes in fp32. The shift constants are formed in
// double first (Python evaluates `shift - 1` on floats) and then converted.
float flow_shift_sigma(float t, double shift) {
  if (shift == 1.0) return t;
  const float a = static_cast<float>(shift);
  const float a_minus_1 = static_cast<float>(shift - 1.0);
  const float num = a * t;
  const float den = 1.0f + a_minus_1 * t;
  return num / den;
}

std::vector<float> flow_sigma_table(double shift) {
  std::vector<float> table(static_cast<size_t>(kFlowTimesteps));
  const float steps = static_cast<float>(kFlowTimesteps);  // 1000.0f, exact
  for (int64_t i = 0; i < kFlowTimesteps; ++i) {
    // torch.arange(1, 1001) / 1000 -> fp32; * multiplier (1000); / multiplier.
    const float t0 = static_cast<float>(i + 1) / steps;
    const float ts = t0 * steps;
    const float t = ts / steps;
    table[static_cast<size_t>(i)] = flow_shift_sigma(t, shift);
  }
  return table;
}

float time_shift_sigma(float sigma, double from_shift, double to_shift) {
  const float f = static_cast<float>(from_shift);
  const float one_minus_f = static_cast<float>(1.0 - from_shift);
  const float g = static_cast<float>(to_shift);
  const float g_minus_1 = static_cast<float>(to_shift - 1.0);
  const float b = sigma / (f + sigma * one_minus_f);
  return (g * b) / (1.0f + g_minus_1 * b);
}

double time_shift_sigma_f64(double sigma, double from_shift, double to_shift) {
  const double b = sigma / (from_shift + sigma * (1.0 - from_shift));
  return to_shift * b / (1.0 + (to_shift - 1.0) * b);
}

std::vector<float> simple_schedule(const std::vector<float>& table, int64_t steps) {
  LS_CHECK(steps >= 1 && !table.empty());
  const int64_t n = static_cast<int64_t>(table.size());
  // ss = len(sigmas) / steps (a Python double); index -(1 + int(x * ss)) from the end.
  const double ss = static_cast<double>(n) / static_cast<double>(steps);
  std::vector<float> out;
  out.reserve(static_cast<size_t>(steps + 1));
  for (int64_t x = 0; x < steps; ++x) {
    const int64_t back = static_cast<int64_t>(static_cast<double>(x) * ss);  // int() truncates (x*ss >= 0)
    out.push_back(table[static_cast<size_t>(n - 1 - back)]);
  }
  out.push_back(0.0f);
  return out;
}

Expected<Schedule> make_simple_schedule(int64_t steps, double video_shift, double audio_shift) {
  if (steps < 1 || steps > kFlowTimesteps)
    return make_error(ErrorCode::invalid_argument,
                      "--steps must be between 1 and " + std::to_string(kFlowTimesteps) + " (got " +
                          std::to_string(steps) + ")");
  if (!(video_shift > 0.0) || !(audio_shift > 0.0))
    return make_error(ErrorCode::invalid_argument, "flow shifts must be positive");
  Schedule s;
  s.video = simple_schedule(flow_sigma_table(video_shift), steps);
  s.audio.reserve(s.video.size());
  for (float v : s.video) s.audio.push_back(time_shift_sigma_f64(static_cast<double>(v), video_shift, audio_shift));
  return s;
}

std::string format_sigmas(const std::vector<double>& sigmas) {
  std::string out;
  char buf[32];
  for (size_t i = 0; i < sigmas.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%.6g", sigmas[i]);
    if (i) out += ", ";
    out += buf;
  }
  return out;
}

std::string format_sigmas(const std::vector<float>& sigmas) {
  return format_sigmas(std::vector<double>(sigmas.begin(), sigmas.end()));
}

}  // namespace ls::sample
