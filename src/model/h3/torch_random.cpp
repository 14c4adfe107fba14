#include "model/h3/torch_random.h"

#include <cmath>
#include <random>

namespace ls::h3 {

namespace {
constexpr double kPi = 3.14159265358979323846;

float uniform24(std::mt19937& g) { return static_cast<float>(g() & ((1u << 24) - 1)) * (1.0f / 16777216.0f); }

}  // namespace

void torch_box_muller_16(float* d) {
  for (int j = 0; j < 8; ++j) {
    const float u1 = 1.0f - d[j];  // [0, 1) -> (0, 1] for the log
    const float u2 = d[j + 8];
    const float radius = std::sqrt(-2.0f * std::log(u1));
    // x86 PyTorch runs this block with AVX2 (SLEEF): theta = fl32(fl32(2*pi) * u2),
    // measured against torch 1.13's draws (tests/data/golden/torch_randn_v1).
    const float theta = static_cast<float>(2.0 * kPi) * u2;
    d[j] = radius * std::cos(theta);
    d[j + 8] = radius * std::sin(theta);
  }
}

std::vector<float> torch_cpu_randn(uint64_t seed, int64_t n) {
  std::mt19937 gen(static_cast<uint32_t>(seed & 0xffffffffu));
  std::vector<float> out(static_cast<size_t>(n > 0 ? n : 0));
  if (n <= 0) return out;
  if (n >= 16) {
    for (auto& v : out) v = uniform24(gen);
    for (int64_t i = 0; i + 16 <= n; i += 16) torch_box_muller_16(out.data() + i);
    if (n % 16 != 0) {
      float* d = out.data() + n - 16;
      for (int j = 0; j < 16; ++j) d[j] = uniform24(gen);
      torch_box_muller_16(d);
    }
    return out;
  }
  // Small tensors: normal_distribution<double> per element: uniform doubles from
  // random64 (53 bits), Box-Muller in double; the second value of a pair is cached.
  auto random64 = [&]() {
    const uint64_t hi = gen(), lo = gen();  // first draw is the high half
    return (hi << 32) | lo;
  };
  auto uniform53 = [&]() {
    return static_cast<double>(random64() & ((uint64_t{1} << 53) - 1)) * (1.0 / 9007199254740992.0);
  };
  bool cached = false;
  double cache = 0;
  for (auto& v : out) {
    if (cached) {
      v = static_cast<float>(cache);
      cached = false;
      continue;
    }
    const double u1 = uniform53(), u2 = uniform53();
    const double r = std::sqrt(-2.0 * std::log1p(-u2));
    const double theta = 2.0 * kPi * u1;
    cache = r * std::sin(theta);
    cached = true;
    v = static_cast<float>(r * std::cos(theta));
  }
  return out;
}

}  // namespace ls::h3
