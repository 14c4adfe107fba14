// PyTorch's CPU normal generator, restated (h3-model.md §2.7: condition noise
// augmentation draws torch.randn(rows.shape) from a CPU generator seeded with the sampler seed).
//
// Algorithm (torch.manual_seed(seed); torch.randn(n) for fp32 on the CPU):
//  - engine: MT19937 initialised with the low 32 bits of the seed (the standard init);
//  - n uniforms u_i = (next32() & (2^24 - 1)) * 2^-24 (exact fp32), in order;
//  - Box-Muller over blocks of 16: for j < 8: u1 = 1 - u[j], u2 = u[j + 8],
//    radius = sqrt(-2 log u1), theta = fl32(fl32(2 pi) * u2) (x86's AVX2 form), out[j] = radius cos theta,
//    out[j + 8] = radius sin theta (fp32 libm);
//  - if n % 16 != 0, the last 16 values are recomputed from 16 fresh uniforms;
//  - n < 16 uses torch's double-precision normal_distribution path (random64 pairs,
//    Box-Muller in double, caching the second value), restated as well.
// Bits: the uniform stream is exact; x86 PyTorch builds run the block transform with
// AVX2 SLEEF log/cos/sin (1-ulp functions), this restatement with glibc's. Measured
// against PyTorch 1.13's CPU randn (628k values, 43 seeds x 12 sizes): every n < 16 value
// is bit-exact; for n >= 16, 16.5 % of the values differ, by 1 ulp (14.3 %), 2 (2.1 %)
// or 3 ulps (0.07 %). Documented in docs/exactness.md. Callers that need torch's bits
// hand torch's draws in (h3::ConditionNoise).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace ls::h3 {

// The generator as a stream (torch.manual_seed(seed), then torch.randn calls that
// continue it): the sampler's initial noise draws video then audio from one
// (sample/noise.h). A fresh generator's first randn(n) is torch_cpu_randn(seed, n).
class TorchCpuGenerator {
 public:
  explicit TorchCpuGenerator(uint64_t seed);
  // torch.randn(n) (fp32, contiguous) from the current state; the state advances.
  std::vector<float> randn(int64_t n);

 private:
  float uniform24();
  double uniform53();
  std::mt19937 engine_;
  bool have_cached_normal_ = false;
  double cached_normal_ = 0.0;
};

// torch.randn(n) of a generator seeded with `seed` (empty for n <= 0).
std::vector<float> torch_cpu_randn(uint64_t seed, int64_t n);

// The Box-Muller step above on one block of 16 uniforms, in place (pairs j, j + 8).
// (TorchCpuGenerator's block transform.)
void torch_box_muller_16(float* d);

}  // namespace ls::h3
