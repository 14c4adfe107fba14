// generate() on the engine with the tiny synthetic model: every plan gives the same
// bytes through a whole sampling run (the sampler adds no plan dependence), the AdaLN
// tables are precomputed for every step, CFG runs both prompts (also of different
// lengths), cfg 1 never evaluates the negative, and plan failures come before work.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "exec/engine.h"
#include "model/h3/checkpoint.h"
#include "model/h3/config.h"
#include "sample/generate.h"
#include "sample/schedule.h"

using namespace ls;

namespace {

struct Fixture {
  std::unique_ptr<h3::H3SyntheticSource> src;
  std::unique_ptr<Backend> be;
  std::unique_ptr<exec::Engine> engine;
  std::vector<float> text, negative;
  sample::GenerateRequest req;

  // 5 frames at 64x64, L 6: T 2, latent 4x4 (8 video rows), A 8 (16 audio rows), S 30.
  explicit Fixture(int steps, double cfg, int64_t neg_L = 6) {
    auto c = h3::h3_preset("tiny");
    LS_CHECK(c.ok());
    src = std::make_unique<h3::H3SyntheticSource>(*c, 3);
    be = make_cpu_backend();
    auto e = exec::Engine::create(*src, *be);
    LS_CHECK(e.ok());
    engine = std::move(e).value();
    const int64_t L = 6;
    auto g = h3::clip_geometry(5, 64, 64, L);
    LS_CHECK(g.ok());
    req.cond.geometry = *g;
    text = sample::standin_text_states(11, 0, L, c->text_dim);
    negative = sample::standin_text_states(11, 1, neg_L, c->text_dim);
    req.text = TensorView(text.data(), DType::f32, {L, c->text_dim});
    req.negative = TensorView(negative.data(), DType::f32, {neg_L, c->text_dim});
    auto s = sample::make_simple_schedule(steps);
    LS_CHECK(s.ok());
    req.sigmas = s->video;
    req.cfg = cfg;
    req.seed = 5;
  }
};

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

double norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

}  // namespace

TEST(SampleGenerate, PlansGiveIdenticalBytes) {
  Fixture f(2, 1.0);
  auto stock = sample::generate(*f.engine, f.req);
  ASSERT_TRUE(stock.ok()) << stock.error().message;
  ASSERT_GT(norm(stock->video), 0);
  ASSERT_GT(norm(stock->audio), 0);
  for (float v : stock->video) ASSERT_TRUE(std::isfinite(v));
  EXPECT_TRUE(stock->plan.stock());
  const int64_t S = stock->plan.sizes.S;
  // Awkward slices: one row, a non-divisor, the whole sequence minus one.
  const exec::PlanKnobs plans[] = {
      {1, 1, 1, 1024}, {7, 13, 5, 1024}, {S - 1, S - 1, S - 1, 1024}, {0, 16, 0, 1024}};
  for (const exec::PlanKnobs& k : plans) {
    f.req.knobs = k;
    auto r = sample::generate(*f.engine, f.req);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_FALSE(r->plan.stock());
    EXPECT_TRUE(same(r->video, stock->video)) << k.mlp_chunk_tokens << "/" << k.attn_chunk_tokens;
    EXPECT_TRUE(same(r->audio, stock->audio)) << k.mlp_chunk_tokens << "/" << k.attn_chunk_tokens;
  }
  // A budget plan too.
  f.req.knobs = {};
  f.req.budget_bytes = stock->plan.predicted_peak_bytes * 2 / 3;
  auto b = sample::generate(*f.engine, f.req);
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_LE(b->plan.predicted_peak_bytes, f.req.budget_bytes);
  EXPECT_TRUE(same(b->video, stock->video));
  // Another seed changes the result (the comparison above is not vacuous).
  f.req.budget_bytes = 0;
  f.req.seed = 6;
  auto other = sample::generate(*f.engine, f.req);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(same(other->video, stock->video));
}

TEST(SampleGenerate, AdalnPrecomputedAndOneForwardPerStepAtCfg1) {
  Fixture f(3, 1.0);
  auto r = sample::generate(*f.engine, f.req);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->forwards.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r->forwards[i].prompt, sample::Prompt::positive);
    EXPECT_EQ(r->forwards[i].step, static_cast<int64_t>(i));
    EXPECT_EQ(r->forwards[i].sigma, f.req.sigmas[i]);
    EXPECT_TRUE(r->forwards[i].report.adaln_precomputed) << i;
    EXPECT_LE(r->forwards[i].report.measured_peak_bytes, r->forwards[i].report.predicted_peak_bytes);
  }
  EXPECT_FALSE(r->guided());
}

TEST(SampleGenerate, CfgWithNegativeOfAnotherLength) {
  Fixture f(2, 2.5, /*neg_L=*/9);
  auto r = sample::generate(*f.engine, f.req);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_TRUE(r->guided());
  EXPECT_EQ(r->negative_plan->sizes.S, r->plan.sizes.S + 3);
  ASSERT_EQ(r->forwards.size(), 4u);
  EXPECT_EQ(r->forwards[1].prompt, sample::Prompt::negative);
  EXPECT_EQ(r->forwards[1].report.S, r->plan.sizes.S + 3);
  // The negative's calls are covered by the precomputed tables (same timesteps).
  EXPECT_TRUE(r->forwards[1].report.adaln_precomputed);
  // Guidance changes the result, and slicing still does not.
  Fixture g(2, 1.0, 9);
  auto unguided = sample::generate(*g.engine, g.req);
  ASSERT_TRUE(unguided.ok());
  EXPECT_FALSE(same(unguided->video, r->video));
  f.req.knobs = {5, 11, 3, 1024};
  auto sliced = sample::generate(*f.engine, f.req);
  ASSERT_TRUE(sliced.ok()) << sliced.error().message;
  EXPECT_TRUE(same(sliced->video, r->video));
  EXPECT_TRUE(same(sliced->audio, r->audio));
}

TEST(SampleGenerate, ErrorsBeforeWork) {
  Fixture f(2, 2.0);
  // cfg != 1 without a negative prompt.
  f.req.negative = TensorView();
  auto r = sample::generate(*f.engine, f.req);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("negative"), std::string::npos);
  // Budget too small: out_of_budget naming the smallest budget.
  Fixture b(2, 1.0);
  b.req.budget_bytes = 1024;
  auto rb = sample::generate(*b.engine, b.req);
  ASSERT_FALSE(rb.ok());
  EXPECT_EQ(rb.error().code, ErrorCode::out_of_budget);
  EXPECT_NE(rb.error().message.find("smallest budget"), std::string::npos);
  // Text width and length mismatches.
  Fixture w(2, 1.0);
  w.req.text = TensorView(w.text.data(), DType::f32, {3, 32});
  EXPECT_FALSE(sample::generate(*w.engine, w.req).ok());
  Fixture l(2, 1.0);
  l.req.cond.geometry.text_tokens = 5;
  auto rl = sample::generate(*l.engine, l.req);
  ASSERT_FALSE(rl.ok());
  EXPECT_NE(rl.error().message.find("text tokens"), std::string::npos);
}
