#include "model/h3/torch_random.h"

#include <cmath>
#include <random>

#include "core/status.h"

namespace ls::h3 {

namespace {
constexpr double kPi = 3.14159265358979323846;
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

TorchCpuGenerator::TorchCpuGenerator(uint64_t seed) : engine_(static_cast<uint32_t>(seed & 0xffffffffu)) {}

float TorchCpuGenerator::uniform24() {
  return static_cast<float>(engine_() & ((1u << 24) - 1)) * (1.0f / 16777216.0f);
}

double TorchCpuGenerator::uniform53() {
  // random64(): the first 32-bit draw is the high word.
  const uint64_t hi = engine_();
  const uint64_t lo = engine_();
  const uint64_t r = (hi << 32) | lo;
  return static_cast<double>(r & ((uint64_t{1} << 53) - 1)) * (1.0 / 9007199254740992.0);
}

std::vector<float> TorchCpuGenerator::randn(int64_t n) {
  LS_CHECK(n >= 0);
  std::vector<float> out(static_cast<size_t>(n));
  if (n >= 16) {
    for (float& v : out) v = uniform24();
    for (int64_t i = 0; i + 16 <= n; i += 16) torch_box_muller_16(out.data() + i);
    if (n % 16 != 0) {
      float* tail = out.data() + (n - 16);
      for (int j = 0; j < 16; ++j) tail[j] = uniform24();
      torch_box_muller_16(tail);
    }
    return out;
  }
  // Small tensors: normal_distribution<double> per element: uniform doubles from
  // random64 (53 bits), Box-Muller in double; the second value of a pair is cached.
  for (float& v : out) {
    if (have_cached_normal_) {
      have_cached_normal_ = false;
      v = static_cast<float>(cached_normal_);
      continue;
    }
    const double u1 = uniform53();
    const double u2 = uniform53();
    const double r = std::sqrt(-2.0 * std::log1p(-u2));
    const double theta = 2.0 * kPi * u1;
    cached_normal_ = r * std::sin(theta);
    have_cached_normal_ = true;
    v = static_cast<float>(r * std::cos(theta));
  }
  return out;
}

std::vector<float> torch_cpu_randn(uint64_t seed, int64_t n) {
  if (n <= 0) return {};
  TorchCpuGenerator g(seed);
  return g.randn(n);
}

}  // namespace ls::h3
