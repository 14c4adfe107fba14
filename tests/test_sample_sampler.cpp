// Flow Euler sampler on fake denoisers: the order of the latent scalings, the CFG
// combination and its cfg-1 short cut, exactness against an analytic flow, and error
// against a float64 reference on a nonlinear field.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "sample/sampler.h"
#include "sample/schedule.h"

using namespace ls;
using namespace ls::sample;

namespace {

std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// Small integers: every sampler expression on them is exact in fp32.
std::vector<float> int_vec(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(static_cast<int>(g() % 17) - 8);
  return v;
}

double norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

// Returns the exact flow velocity towards a fixed clean state x0 (ComfyUI sign:
// x0 = x - sigma * v), and records every call.
struct TowardsTarget : VelocityModel {
  std::vector<float> x0;
  std::vector<std::vector<float>> inputs;
  std::vector<Prompt> prompts;
  std::vector<float> sigmas;
  Status velocity(std::span<const float> x, float sigma, Prompt prompt, int64_t step, std::span<float> v) override {
    inputs.emplace_back(x.begin(), x.end());
    prompts.push_back(prompt);
    sigmas.push_back(sigma);
    for (size_t i = 0; i < x.size(); ++i) v[i] = (x[i] - x0[i]) / sigma;
    return {};
  }
};

// Constant velocities per prompt.
struct ConstantVelocity : VelocityModel {
  std::vector<float> pos, neg;
  int calls = 0;
  Status velocity(std::span<const float>, float, Prompt prompt, int64_t, std::span<float> v) override {
    ++calls;
    const auto& src = prompt == Prompt::positive ? pos : neg;
    std::copy(src.begin(), src.end(), v.begin());
    return {};
  }
};

struct Failing : VelocityModel {
  Status velocity(std::span<const float>, float, Prompt, int64_t, std::span<float>) override {
    return make_error(ErrorCode::out_of_memory, "fake device out of memory");
  }
};

}  // namespace

TEST(SampleSampler, LatentScalingOrder) {
  // Video 12 values, audio 8: an img2img-style start (sigma_0 = 0.75, non-zero latent).
  const PackedShape shape{12, 8};
  const std::vector<float> noise = int_vec(20, 1), latent = int_vec(20, 2);
  ASSERT_GT(norm(noise), 0);
  ASSERT_GT(norm(latent), 0);
  TowardsTarget m;
  m.x0 = latent;
  for (int64_t i = shape.video; i < shape.total(); ++i) m.x0[static_cast<size_t>(i)] *= 4.0f;  // carried audio target
  const std::vector<float> sigmas = {0.75f, 0.5f, 0.0f};
  auto out = sample_flow_euler(m, sigmas, noise, latent, shape, SamplerOptions{1.0, 4.0});
  ASSERT_TRUE(out.ok()) << out.error().message;
  // The first model input is sigma * noise + (1 - sigma) * latent_in, with ONLY the
  // latent's audio part scaled by 4 (the noise is not scaled).
  ASSERT_EQ(m.inputs.size(), 2u);
  for (size_t i = 0; i < 20; ++i) {
    const float l = i < 12 ? latent[i] : latent[i] * 4.0f;
    EXPECT_EQ(m.inputs[0][i], 0.75f * noise[i] + 0.25f * l) << i;
  }
  // Exact velocity of a linear flow: Euler lands on x0 (dyadic values: exactly), and
  // process_latent_out divides the audio back: the output is the latent itself.
  EXPECT_EQ(std::memcmp(out->data(), latent.data(), 20 * sizeof(float)), 0);
  EXPECT_EQ(m.sigmas, (std::vector<float>{0.75f, 0.5f}));
}

TEST(SampleSampler, T2vaStartsFromPureNoise) {
  const PackedShape shape{6, 4};
  const std::vector<float> noise = random_vec(10, 3);
  TowardsTarget m;
  m.x0 = random_vec(10, 4);
  auto out = sample_flow_euler(m, {1.0f, 0.0f}, noise, {}, shape, SamplerOptions{});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(std::memcmp(m.inputs[0].data(), noise.data(), 10 * sizeof(float)), 0);
  // One step from sigma 1 to 0: x = n + ((n - den) / 1) * (0 - 1), den = fl(n - fl(v*1)).
  for (size_t i = 0; i < 10; ++i) {
    const float v = (noise[i] - m.x0[i]) / 1.0f;
    const float den = noise[i] - v * 1.0f;
    const float d = (noise[i] - den) / 1.0f;
    float x = noise[i] + d * -1.0f;
    if (i >= 6) x /= 4.0f;
    EXPECT_EQ((*out)[i], x) << i;
  }
}

TEST(SampleSampler, AnalyticFlowAgainstFloat64) {
  // x0 random, 8 steps of the real schedule: Euler on an exact linear flow converges
  // to x0; the fp32 result's error vs x0 stays at the level of a few fp32 roundings.
  const PackedShape shape{384, 128};
  const std::vector<float> noise = random_vec(512, 5);
  TowardsTarget m;
  m.x0 = random_vec(512, 6, 0.5f);
  auto sched = make_simple_schedule(8);
  ASSERT_TRUE(sched.ok());
  auto out = sample_flow_euler(m, sched->video, noise, {}, shape, SamplerOptions{1.0, 4.0});
  ASSERT_TRUE(out.ok());
  double err = 0, ref = 0;
  for (size_t i = 0; i < 512; ++i) {
    const double want = i < 384 ? m.x0[i] : m.x0[i] / 4.0;
    err += ((*out)[i] - want) * ((*out)[i] - want);
    ref += want * want;
  }
  EXPECT_LT(std::sqrt(err / ref), 1e-6);
  EXPECT_EQ(m.inputs.size(), 8u);
  EXPECT_EQ(m.sigmas.front(), 1.0f);
}

TEST(SampleSampler, NonlinearFieldAgainstFloat64Reference) {
  // v(x, sigma) = sin(x) + sigma * x (fp32 model, computed per element); the same Euler
  // recursion in float64 on the float64 field is the reference. The fp32 sampler's
  // error must be within a small multiple of the fp32 model's own rounding.
  struct Field : VelocityModel {
    Status velocity(std::span<const float> x, float sigma, Prompt, int64_t, std::span<float> v) override {
      for (size_t i = 0; i < x.size(); ++i) v[i] = std::sin(x[i]) + sigma * x[i];
      return {};
    }
  } field;
  const PackedShape shape{200, 56};
  const std::vector<float> noise = random_vec(256, 7);
  auto sched = make_simple_schedule(30);
  ASSERT_TRUE(sched.ok());
  auto out = sample_flow_euler(field, sched->video, noise, {}, shape, SamplerOptions{1.0, 4.0});
  ASSERT_TRUE(out.ok());
  std::vector<double> x(noise.begin(), noise.end());
  const auto& s = sched->video;
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    for (double& xi : x) {
      const double v = std::sin(xi) + s[i] * xi;
      const double den = xi - v * s[i];
      xi = xi + (xi - den) / s[i] * (static_cast<double>(s[i + 1]) - s[i]);
    }
  }
  double err = 0, ref = 0;
  for (size_t i = 0; i < 256; ++i) {
    const double want = i < 200 ? x[i] : x[i] / 4.0;
    err += ((*out)[i] - want) * ((*out)[i] - want);
    ref += want * want;
  }
  ASSERT_GT(ref, 0);
  // 30 steps x ~5 roundings of 6e-8 each, amplified mildly by the field.
  EXPECT_LT(std::sqrt(err / ref), 3e-5);
}

TEST(SampleSampler, CfgCombination) {
  const PackedShape shape{10, 6};
  const std::vector<float> noise = int_vec(16, 8);
  ConstantVelocity m;
  m.pos = int_vec(16, 9);
  m.neg = int_vec(16, 10);
  ASSERT_NE(m.pos, m.neg);
  // One step 1 -> 0 with cfg 3: den = neg_den + (pos_den - neg_den) * 3, all exact here.
  auto out = sample_flow_euler(m, {1.0f, 0.0f}, noise, {}, shape, SamplerOptions{3.0, 1.0});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(m.calls, 2);
  for (size_t i = 0; i < 16; ++i) {
    const float dp = noise[i] - m.pos[i], dn = noise[i] - m.neg[i];
    const float den = dn + (dp - dn) * 3.0f;
    EXPECT_EQ((*out)[i], noise[i] + (noise[i] - den) * -1.0f) << i;
  }
  // Elementwise: cfg 0 gives the negative bit for bit. cfg 1 does NOT give the
  // positive bit for bit (fl(neg + fl(pos - neg)) != pos in general), which is one
  // reason the sampler, like ComfyUI, skips the negative entirely at cfg 1.
  std::vector<float> a = random_vec(64, 11), b = random_vec(64, 12);
  std::vector<float> c = a;
  cfg_combine(c, b, 1.0);
  EXPECT_NE(std::memcmp(c.data(), a.data(), 256), 0);
  c = a;
  cfg_combine(c, b, 0.0);
  EXPECT_EQ(std::memcmp(c.data(), b.data(), 256), 0);
  // Operand order: fl(neg + fl(fl(pos - neg) * s)), not pos * s + neg * (1 - s).
  c = a;
  cfg_combine(c, b, 4.5);
  for (size_t i = 0; i < 64; ++i) {
    const float diff = a[i] - b[i];
    const float scaled = diff * 4.5f;
    EXPECT_EQ(c[i], b[i] + scaled) << i;
  }
}

TEST(SampleSampler, CfgOneRunsOnlyThePositive) {
  const PackedShape shape{8, 8};
  const std::vector<float> noise = random_vec(16, 13);
  TowardsTarget m;
  m.x0 = random_vec(16, 14);
  auto out = sample_flow_euler(m, {1.0f, 0.8f, 0.4f, 0.0f}, noise, {}, shape, SamplerOptions{1.0 + 1e-12, 4.0});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(m.prompts, std::vector<Prompt>(3, Prompt::positive));
  TowardsTarget g;
  g.x0 = m.x0;
  auto out2 = sample_flow_euler(g, {1.0f, 0.8f, 0.4f, 0.0f}, noise, {}, shape, SamplerOptions{2.0, 4.0});
  ASSERT_TRUE(out2.ok());
  EXPECT_EQ(g.prompts, (std::vector<Prompt>{Prompt::positive, Prompt::negative, Prompt::positive, Prompt::negative,
                                            Prompt::positive, Prompt::negative}));
  EXPECT_TRUE(cfg_is_one(1.0));
  EXPECT_FALSE(cfg_is_one(1.001));
}

TEST(SampleSampler, StepCallbackAndErrors) {
  const PackedShape shape{4, 4};
  const std::vector<float> noise = random_vec(8, 15);
  TowardsTarget m;
  m.x0 = random_vec(8, 16);
  std::vector<int64_t> seen;
  auto out = sample_flow_euler(m, {1.0f, 0.5f, 0.0f}, noise, {}, shape, SamplerOptions{},
                               [&](const StepEvent& e) {
                                 seen.push_back(e.step);
                                 EXPECT_EQ(e.steps, 2);
                                 ASSERT_NE(e.x, nullptr);
                               });
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1}));

  Failing f;
  auto bad = sample_flow_euler(f, {1.0f, 0.0f}, noise, {}, shape, SamplerOptions{});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::out_of_memory);

  EXPECT_FALSE(sample_flow_euler(m, {1.0f}, noise, {}, shape, SamplerOptions{}).ok());
  EXPECT_FALSE(sample_flow_euler(m, {1.0f, 0.0f, 0.0f}, noise, {}, shape, SamplerOptions{}).ok());
  EXPECT_FALSE(sample_flow_euler(m, {1.0f, 0.0f}, std::vector<float>(7), {}, shape, SamplerOptions{}).ok());
}

TEST(SampleSampler, InverseNoiseScalingAndLatentOut) {
  std::vector<float> x = {1.0f, 2.0f, 3.0f, 4.0f};
  inverse_noise_scaling(x, 0.0f);
  EXPECT_EQ(x, (std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f}));
  inverse_noise_scaling(x, 0.5f);
  EXPECT_EQ(x, (std::vector<float>{2.0f, 4.0f, 6.0f, 8.0f}));
  process_latent_out(x, PackedShape{2, 2}, 4.0);
  EXPECT_EQ(x, (std::vector<float>{2.0f, 4.0f, 1.5f, 2.0f}));
  process_latent_in(x, PackedShape{2, 2}, 4.0);
  EXPECT_EQ(x, (std::vector<float>{2.0f, 4.0f, 6.0f, 8.0f}));
}
