// The sampler's noise generator: PyTorch's well-known seed-0 values (to the 4 printed
// decimals), agreement with the model's one-shot restatement, stream continuation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "model/h3/torch_random.h"
#include "sample/noise.h"

using ls::sample::packed_noise;
using ls::sample::TorchCpuGenerator;

TEST(SampleNoise, TorchSeedZeroSmall) {
  // torch.manual_seed(0); torch.randn(5) -> [1.5410, -0.2934, -2.1788, 0.5684, -1.0845]
  // (n < 16: the double normal_distribution path with its cached second value).
  TorchCpuGenerator g(0);
  const std::vector<float> v = g.randn(5);
  const double want[] = {1.5410, -0.2934, -2.1788, 0.5684, -1.0845};
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(v[static_cast<size_t>(i)], want[i], 5e-5) << i;
}

TEST(SampleNoise, TorchSeedZeroBlock) {
  // torch.manual_seed(0); torch.randn(4, 4) (n = 16: the Box-Muller block path).
  TorchCpuGenerator g(0);
  const std::vector<float> v = g.randn(16);
  const double want[] = {-1.1258, -1.1524, -0.2506, -0.4339, 0.8487, 0.6920, -0.3160, -2.1152,
                         0.3223,  -1.2633, 0.3500,  0.3081,  0.1198, 1.2377, 1.1168,  -0.2473};
  for (int i = 0; i < 16; ++i) EXPECT_NEAR(v[static_cast<size_t>(i)], want[i], 5e-5) << i;
}

TEST(SampleNoise, AgreesWithModelRestatement) {
  for (int64_t n : {16, 17, 31, 32, 100, 1000, 4097}) {
    for (uint64_t seed : {0ull, 1ull, 42ull, 0x1234567890ull}) {
      TorchCpuGenerator g(seed);
      const std::vector<float> ours = g.randn(n);
      const std::vector<float> theirs = ls::h3::torch_cpu_randn(seed, n);
      ASSERT_EQ(ours.size(), theirs.size());
      EXPECT_EQ(std::memcmp(ours.data(), theirs.data(), ours.size() * sizeof(float)), 0) << n << " " << seed;
    }
  }
}

TEST(SampleNoise, PackedNoiseContinuesTheStream) {
  const int64_t nv = 24 * 2 * 4 * 4, na = 32 * 2 * 3;
  const std::vector<float> packed = packed_noise(7, nv, na);
  ASSERT_EQ(static_cast<int64_t>(packed.size()), nv + na);
  TorchCpuGenerator g(7);
  const std::vector<float> video = g.randn(nv);
  const std::vector<float> audio = g.randn(na);
  EXPECT_EQ(std::memcmp(packed.data(), video.data(), video.size() * 4), 0);
  EXPECT_EQ(std::memcmp(packed.data() + nv, audio.data(), audio.size() * 4), 0);
  // The audio part is NOT a fresh stream.
  const std::vector<float> fresh = ls::h3::torch_cpu_randn(7, na);
  EXPECT_NE(std::memcmp(packed.data() + nv, fresh.data(), fresh.size() * 4), 0);
  // Roughly standard normal, finite, non-zero.
  double sum = 0, sq = 0;
  for (float v : packed) {
    ASSERT_TRUE(std::isfinite(v));
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>(packed.size());
  EXPECT_LT(std::fabs(sum / n), 0.15);
  EXPECT_NEAR(sq / n, 1.0, 0.15);
  // A different seed gives different noise.
  const std::vector<float> other = packed_noise(8, nv, na);
  EXPECT_NE(std::memcmp(packed.data(), other.data(), packed.size() * 4), 0);
}
