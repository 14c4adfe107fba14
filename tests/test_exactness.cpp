// The exactness contract (DESIGN.md §1) as a property: for random tiny H3
// configurations (heads, head_dim, layers, curve form, PDD heads, text width) and random
// layouts (t2va, keyframes, references, masks, text tags), every plan (slice sizes from 1
// to S, non-divisors, a last slice of one row) gives the stock plan's bytes (memcmp); the
// measured arena peak never exceeds the prediction; the same inputs give the same bytes;
// 1 thread gives the bytes of all threads; AdaLN precompute gives the per-step bytes.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>

#include "core/thread_pool.h"
#include "exactness_util.h"

using namespace ls;

namespace {

struct Case {
  h3::H3Config cfg;
  std::unique_ptr<h3::H3SyntheticSource> src;
  std::unique_ptr<Backend> be;
  std::unique_ptr<exec::Engine> engine;
  h3::Conditioning cond;
  test::Inputs in;
  exec::RefinedText text;
  float sigma = 0.8f;
};

// int8: the backend runs attention int8 (a power-of-two head dim: 32).
std::unique_ptr<Case> make_case(uint64_t seed, bool vary, bool extras, bool all_modes = false, bool int8 = false) {
  std::mt19937_64 rng(seed);
  auto c = std::make_unique<Case>();
  c->cfg = test::tiny_cfg(rng, vary);
  if (all_modes) c->cfg.pdd_heads = 4;
  if (int8) c->cfg.head_dim = 32;
  c->src = std::make_unique<h3::H3SyntheticSource>(c->cfg, seed);
  c->be = make_cpu_backend();
  if (int8) {
    Numerics n;
    n.attention = AttentionAlgorithm::int8;
    EXPECT_TRUE(c->be->set_numerics(n, {}).ok());
  }
  auto e = exec::Engine::create(*c->src, *c->be);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().message);
  if (!e.ok()) return nullptr;
  c->engine = std::move(*e);
  c->cond = test::random_cond(rng, c->cfg, extras);
  if (all_modes) test::add_all_modes(rng, c->cfg, c->cond);
  c->in = test::random_inputs(rng, c->cfg, c->cond);
  auto t = c->engine->refine_text(c->in.text_view(c->cfg, c->cond));
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().message);
  if (!t.ok()) return nullptr;
  c->text = std::move(*t);
  const float sigmas[] = {1.0f, 0.95f, 0.8f, 0.5f, 0.1f};
  c->sigma = sigmas[std::uniform_int_distribution<int>(0, 4)(rng)];
  return c;
}

exec::ForwardResult run(Case& c, const exec::Plan& p) {
  auto r = c.engine->forward(c.cond, c.text, c.in.video_view(c.cfg, c.cond), c.in.audio_view(c.cfg, c.cond), c.sigma, p);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  if (!r.ok()) return {};
  EXPECT_LE(r->report.measured_peak_bytes, r->report.predicted_peak_bytes);
  return std::move(*r);
}

int64_t random_slice(std::mt19937_64& rng, int64_t n) {
  switch (std::uniform_int_distribution<int>(0, 5)(rng)) {
    case 0: return 1;
    case 1: return n;  // one slice
    case 2: return n > 1 ? n - 1 : 1;  // a last slice of one row
    case 3: return 0;  // stock for this knob
    default: return std::uniform_int_distribution<int64_t>(1, std::max<int64_t>(1, n))(rng);
  }
}

void check_plans(uint64_t seed, bool vary, bool extras, int plans, bool all_modes = false, bool int8 = false) {
  auto c = make_case(seed, vary, extras, all_modes, int8);
  ASSERT_TRUE(c);
  SCOPED_TRACE("case seed " + std::to_string(seed) + ": " + h3::h3_config_summary(c->cfg));
  // kv_tile is a numerics setting: fixed per case (both plans), random across cases so
  // key tiles of every size incl. a last tile of one key are exercised.
  std::mt19937_64 rng(seed * 7919 + 1);
  exec::PlanKnobs stock_knobs;
  stock_knobs.kv_tile = std::uniform_int_distribution<int64_t>(0, 2)(rng) == 0 ? 1024 : std::uniform_int_distribution<int64_t>(1, 16)(rng);
  // int8: a run's kv_tile divides the statistics block (a power of two).
  if (int8) stock_knobs.kv_tile = std::bit_floor(static_cast<uint64_t>(stock_knobs.kv_tile));
  stock_knobs.int8_attention = int8;
  ASSERT_TRUE(test::use_kv_tile(*c->be, stock_knobs.kv_tile).ok());  // a plan's kv_tile is the backend's
  auto stock_plan = exec::make_plan(c->cfg, c->cond, stock_knobs);
  ASSERT_TRUE(stock_plan.ok()) << stock_plan.error().message;
  ASSERT_TRUE(stock_plan->stock());
  const exec::ForwardResult ref = run(*c, *stock_plan);
  // Not vacuous: the outputs are non-zero.
  ASSERT_GT(test::sum_abs(ref.video), 0.0);
  ASSERT_GT(test::sum_abs(ref.audio), 0.0);
  EXPECT_EQ(ref.report.measured_peak_bytes, ref.report.predicted_peak_bytes);
  const int64_t S = stock_plan->sizes.S, tr = stock_plan->sizes.target_rows;
  for (int i = 0; i < plans; ++i) {
    exec::PlanKnobs k;
    k.kv_tile = stock_knobs.kv_tile;
    k.int8_attention = int8;
    k.attn_chunk_tokens = random_slice(rng, S);
    k.mlp_chunk_tokens = random_slice(rng, S);
    k.final_chunk_tokens = random_slice(rng, tr);
    auto p = exec::make_plan(c->cfg, c->cond, k);
    ASSERT_TRUE(p.ok()) << p.error().message;
    SCOPED_TRACE("S " + std::to_string(S) + ", plan " + p->describe());
    const exec::ForwardResult r = run(*c, *p);
    EXPECT_TRUE(test::same_bytes(ref.video, r.video)) << "video differs";
    EXPECT_TRUE(test::same_bytes(ref.audio, r.audio)) << "audio differs";
  }
}

}  // namespace

// t2va only, fixed tiny config, many plans.
TEST(Exactness, PlansMatchStockT2va) {
  for (uint64_t seed = 1; seed <= 10; ++seed) check_plans(seed, /*vary=*/false, /*extras=*/false, 8);
}

// Random configurations (heads, head_dim, layers, curve form, PDD bank) x random layouts
// (keyframes, references, masks, text tags) x random plans.
TEST(Exactness, PlansMatchStockRandomConfigsAndLayouts) {
  for (uint64_t seed = 100; seed < 180; ++seed) check_plans(seed, /*vary=*/true, /*extras=*/true, 6);
}

// Attention int8 (docs/int8-attention.md): random configs, layouts and plans (stock with
// attention_int8_all, two-pass with the statistics over pass-1 slices) give the stock bytes.
TEST(Exactness, Int8PlansMatchStock) {
  for (uint64_t seed = 100; seed < 130; ++seed) check_plans(seed, /*vary=*/true, /*extras=*/true, 6, false, /*int8=*/true);
  for (uint64_t seed = 300; seed < 304; ++seed) check_plans(seed, /*vary=*/true, /*extras=*/false, 6, /*all_modes=*/true,
                                                             /*int8=*/true);
}

// int8 runs: its outputs differ from native's on the same case (the same source on a
// native backend) and stay close; a plan made without the int8 buffers is refused.
TEST(Exactness, Int8IsNotNativeAndPlansMustSayInt8) {
  auto b = make_case(7, /*vary=*/false, false, false, /*int8=*/true);
  ASSERT_TRUE(b);
  exec::PlanKnobs k;
  k.kv_tile = kInt8DefaultKvTile;  // the int8 backend's default
  k.int8_attention = true;
  auto p = exec::make_plan(b->cfg, b->cond, k);
  ASSERT_TRUE(p.ok()) << p.error().message;
  const auto r8 = run(*b, *p);
  ASSERT_GT(test::sum_abs(r8.video), 0.0);
  k.int8_attention = false;
  auto plain = exec::make_plan(b->cfg, b->cond, k);
  ASSERT_TRUE(plain.ok());
  auto refused = b->engine->forward(b->cond, b->text, b->in.video_view(b->cfg, b->cond),
                                    b->in.audio_view(b->cfg, b->cond), b->sigma, *plain);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("int8"), std::string::npos) << refused.error().message;
  // The same source, inputs and plan shape on a native backend.
  std::unique_ptr<Backend> native = make_cpu_backend();
  ASSERT_TRUE(test::use_kv_tile(*native, kInt8DefaultKvTile).ok());  // the same tiles
  auto e = exec::Engine::create(*b->src, *native);
  ASSERT_TRUE(e.ok());
  auto t = (*e)->refine_text(b->in.text_view(b->cfg, b->cond));
  ASSERT_TRUE(t.ok());
  auto rn = (*e)->forward(b->cond, *t, b->in.video_view(b->cfg, b->cond), b->in.audio_view(b->cfg, b->cond), b->sigma,
                          *plain);
  ASSERT_TRUE(rn.ok()) << rn.error().message;
  EXPECT_FALSE(test::same_bytes(rn->video, r8.video));
  double num = 0, den = 0;
  for (size_t i = 0; i < rn->video.size(); ++i) {
    const double d = static_cast<double>(r8.video[i]) - rn->video[i];
    num += d * d, den += static_cast<double>(rn->video[i]) * rn->video[i];
  }
  EXPECT_LT(std::sqrt(num / den), 0.1) << "int8 strays far from native";
}

// Every input mode beyond t2va at once: partial video and audio masks (not multiples of
// 1/256, not constant per patch), a keyframe with audio and two references at
// augmentation 0.5 (caller-drawn and generated noise), a PDD bank of 4 on both heads;
// random plans incl. 1-row slices and a short last slice give the stock bytes.
TEST(Exactness, PlansMatchStockAllInputModes) {
  for (uint64_t seed = 300; seed < 312; ++seed) check_plans(seed, /*vary=*/true, /*extras=*/false, 8, /*all_modes=*/true);
}

// The modes are not vacuous: each one changes the outputs (a mask, the augmentation, the
// caller's noise, the PDD window through the schedule).
TEST(Exactness, InputModesChangeOutputs) {
  auto c = make_case(300, true, false, true);
  ASSERT_TRUE(c);
  // sigma 0.95 with the bank of 4: start 2, stop from the next schedule entry (0.9 -> 3;
  // the changed schedule's 0.3 -> 4), so the window moves with the schedule.
  c->sigma = 0.95f;
  auto plan = exec::make_plan(c->cfg, c->cond, {});
  ASSERT_TRUE(plan.ok());
  const auto ref = run(*c, *plan);
  auto differs = [&](const char* what, auto&& change) {
    h3::Conditioning saved = c->cond;
    change(c->cond);
    auto p = exec::make_plan(c->cfg, c->cond, {});
    ASSERT_TRUE(p.ok()) << p.error().message;
    const auto r = run(*c, *p);
    EXPECT_FALSE(test::same_bytes(ref.video, r.video) && test::same_bytes(ref.audio, r.audio)) << what;
    c->cond = saved;
  };
  differs("video mask", [](h3::Conditioning& k) { k.video_mask.clear(); });
  differs("audio mask", [](h3::Conditioning& k) { k.audio_mask.clear(); });
  differs("vis_aug", [](h3::Conditioning& k) { k.vis_aug = 1.0; });
  differs("aud_aug", [](h3::Conditioning& k) { k.aud_aug = 1.0; });
  differs("caller noise", [](h3::Conditioning& k) { k.keyframes[0].noise = h3::ConditionNoise{}; });
  differs("seed", [](h3::Conditioning& k) { k.seed += 1; });
  differs("PDD window", [](h3::Conditioning& k) { k.sample_sigmas = {1.0f, 0.3f, 0.0f}; });
}

// Two-pass attention with every slice size from 1 to S.
TEST(Exactness, EverySliceSize) {
  auto c = make_case(977, true, true);
  ASSERT_TRUE(c);
  auto stock = exec::make_plan(c->cfg, c->cond, {});
  ASSERT_TRUE(stock.ok());
  const auto ref = run(*c, *stock);
  const int64_t S = stock->sizes.S;
  for (int64_t n = 1; n <= S; ++n) {
    exec::PlanKnobs k;
    k.attn_chunk_tokens = n;
    k.mlp_chunk_tokens = n;
    k.final_chunk_tokens = n;
    auto p = exec::make_plan(c->cfg, c->cond, k);
    ASSERT_TRUE(p.ok());
    const auto r = run(*c, *p);
    EXPECT_TRUE(test::same_bytes(ref.video, r.video) && test::same_bytes(ref.audio, r.audio)) << "slice " << n << " of S " << S;
  }
}

TEST(Exactness, SameInputsSameBytes) {
  for (uint64_t seed : {5u, 6u}) {
    auto a = make_case(seed, true, true), b = make_case(seed, true, true);
    ASSERT_TRUE(a && b);
    exec::PlanKnobs k;
    k.attn_chunk_tokens = 3;
    auto p = exec::make_plan(a->cfg, a->cond, k);
    ASSERT_TRUE(p.ok());
    const auto ra = run(*a, *p), rb = run(*b, *p), ra2 = run(*a, *p);
    EXPECT_TRUE(test::same_bytes(ra.video, rb.video) && test::same_bytes(ra.audio, rb.audio));
    EXPECT_TRUE(test::same_bytes(ra.video, ra2.video) && test::same_bytes(ra.audio, ra2.audio));
  }
}

TEST(Exactness, OneThreadEqualsAllThreads) {
  for (uint64_t seed : {11u, 12u, 13u}) {
    auto c = make_case(seed, true, true);
    ASSERT_TRUE(c);
    exec::PlanKnobs k;
    k.attn_chunk_tokens = 2;
    k.mlp_chunk_tokens = 3;
    auto p = exec::make_plan(c->cfg, c->cond, k);
    ASSERT_TRUE(p.ok());
    set_num_threads(0);
    const auto all = run(*c, *p);
    set_num_threads(1);
    const auto one = run(*c, *p);
    set_num_threads(0);
    EXPECT_TRUE(test::same_bytes(all.video, one.video) && test::same_bytes(all.audio, one.audio));
  }
}

// AdaLN precompute over a whole schedule gives the bytes of computing the tables per step.
TEST(Exactness, AdalnPrecomputeEqualsPerStep) {
  for (uint64_t seed : {21u, 22u, 23u, 24u}) {
    auto c = make_case(seed, true, true);
    ASSERT_TRUE(c);
    auto p = exec::make_plan(c->cfg, c->cond, {});
    ASSERT_TRUE(p.ok());
    const std::vector<float> schedule = {1.0f, 0.97f, 0.9f, 0.75f, 0.4f, 0.0f};
    std::vector<exec::ForwardResult> per_step;
    for (float s : schedule) {
      if (s == 0.0f) continue;
      c->sigma = s;
      per_step.push_back(run(*c, *p));
      EXPECT_FALSE(per_step.back().report.adaln_precomputed);
    }
    ASSERT_TRUE(c->engine->precompute_adaln(schedule, c->cond).ok());
    size_t i = 0;
    for (float s : schedule) {
      if (s == 0.0f) continue;
      c->sigma = s;
      const auto r = run(*c, *p);
      EXPECT_TRUE(r.report.adaln_precomputed);
      EXPECT_TRUE(test::same_bytes(per_step[i].video, r.video) && test::same_bytes(per_step[i].audio, r.audio)) << "sigma " << s;
      ++i;
    }
  }
}

// A plan made for another clip is refused.
TEST(Exactness, MismatchedPlanIsRefused) {
  auto c = make_case(31, false, false);
  ASSERT_TRUE(c);
  h3::Conditioning other = c->cond;
  other.geometry.A += 1;
  auto p = exec::make_plan(c->cfg, other, {});
  ASSERT_TRUE(p.ok());
  auto r = c->engine->forward(c->cond, c->text, c->in.video_view(c->cfg, c->cond), c->in.audio_view(c->cfg, c->cond), 0.5f, *p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("plan"), std::string::npos);
}

// The comparisons above are not vacuous: a one-ulp change of one input value, or
// another kv_tile (a numerics setting), changes the output bytes.
TEST(Exactness, OutputsAreSensitive) {
  auto c = make_case(41, false, false);
  ASSERT_TRUE(c);
  exec::PlanKnobs k;
  k.kv_tile = 1;
  auto p1 = exec::make_plan(c->cfg, c->cond, k);
  auto p = exec::make_plan(c->cfg, c->cond, {});
  ASSERT_TRUE(p.ok() && p1.ok());
  const auto ref = run(*c, *p);
  ASSERT_TRUE(test::use_kv_tile(*c->be, 1).ok());  // a plan's kv_tile is the backend's
  const auto tiled = run(*c, *p1);
  ASSERT_TRUE(test::use_kv_tile(*c->be, 1024).ok());
  EXPECT_FALSE(test::same_bytes(ref.video, tiled.video) && test::same_bytes(ref.audio, tiled.audio));
  c->in.video[3] = std::nextafter(round_bf16(c->in.video[3]), 1e9f);
  c->in.video[3] = std::nextafter(c->in.video[3] + 0.01f, 1e9f);
  const auto moved = run(*c, *p);
  EXPECT_FALSE(test::same_bytes(ref.video, moved.video));
}
