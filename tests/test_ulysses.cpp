// Sequence parallel (Ulysses, docs/multi-gpu.md) on the CPU loopback: the exactness
// property "N ranks give the bytes of one rank" (memcmp), for random tiny configs with
// 14 or 28 heads, random layouts (video + audio + text, keyframes, references, masks),
// random per-rank plans (slices down to one row, per-rank budgets, weight streaming,
// precomputed or per-call AdaLN tables) and N in {1, 2, 4, 7} (4 only where it divides
// the heads; 7 ranks on S of a few dozen rows leave the last ranks short or empty). Plus
// the refusals (ranks not dividing the heads, offload across ranks, a plan for another
// rank count) and a failing rank that must not leave its peers waiting.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <thread>

#include "backend/comm.h"
#include "description_util.h"
#include "exactness_util.h"
#include "exec/plan.h"
#include "exec/planner.h"

using namespace ls;

namespace {

int g_compared = 0;  // N-rank forwards compared with one rank

struct Ranks {
  std::vector<std::unique_ptr<Backend>> backends;  // rank 0 first
  std::unique_ptr<exec::Engine> engine;
};

Ranks make_ranks(const h3::H3TensorSource& src, int n, int64_t kv_tile, const exec::Residency& residency = {},
                 bool int8 = false) {
  Ranks r;
  for (int i = 0; i < n; ++i) {
    r.backends.push_back(make_cpu_backend());
    if (int8) {
      Numerics num;
      num.attention = AttentionAlgorithm::int8;
      EXPECT_TRUE(r.backends.back()->set_numerics(num, {}).ok());
    }
    EXPECT_TRUE(test::use_kv_tile(*r.backends.back(), kv_tile).ok());
  }
  exec::EngineOptions o;
  o.residency = residency;
  for (int i = 1; i < n; ++i) o.peer_backends.push_back(r.backends[static_cast<size_t>(i)].get());
  auto e = exec::Engine::create(src, *r.backends[0], o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().message);
  if (e.ok()) r.engine = std::move(*e);
  return r;
}

// A tiny config whose heads 7 (and maybe 4) divide: 14 or 28 heads of a small head_dim.
h3::H3Config ulysses_cfg(std::mt19937_64& rng) {
  h3::H3Config c = test::tiny_cfg(rng, true);
  c.heads = std::uniform_int_distribution<int>(0, 1)(rng) == 0 ? 14 : 28;
  c.rope_inv_freq_len = 1;
  c.head_dim = 2 * (3 + std::uniform_int_distribution<int>(0, 2)(rng));  // 6, 8 or 10
  return c;
}

int64_t random_slice(std::mt19937_64& rng, int64_t n) {
  switch (std::uniform_int_distribution<int>(0, 5)(rng)) {
    case 0: return 1;
    case 1: return n;
    case 2: return n > 1 ? n - 1 : 1;
    case 3: return 0;
    default: return std::uniform_int_distribution<int64_t>(1, std::max<int64_t>(1, n))(rng);
  }
}

exec::ForwardResult run(exec::Engine& e, const h3::H3Config& cfg, const h3::Conditioning& cond, test::Inputs& in,
                        const exec::RefinedText& text, float sigma, const exec::Plan& p) {
  auto r = e.forward(cond, text, in.video_view(cfg, cond), in.audio_view(cfg, cond), sigma, p);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  if (!r.ok()) return {};
  EXPECT_LE(r->report.measured_peak_bytes, r->report.predicted_peak_bytes);
  return std::move(*r);
}

// int8: every rank runs attention int8 (head dim 8: a power of two), plans with its buffers.
void check_case(uint64_t seed, int plans_per_n, bool all_modes = false, bool int8 = false) {
  std::mt19937_64 rng(seed);
  h3::H3Config cfg = ulysses_cfg(rng);
  if (all_modes) cfg.pdd_heads = 4;
  if (int8) cfg.head_dim = 8;
  SCOPED_TRACE("case seed " + std::to_string(seed) + ": " + h3::h3_config_summary(cfg));
  ASSERT_TRUE(h3::check_h3_config(cfg).ok()) << h3::check_h3_config(cfg).message();
  const h3::H3SyntheticSource src(cfg, seed);
  h3::Conditioning cond = test::random_cond(rng, cfg, /*extras=*/true);
  if (all_modes) test::add_all_modes(rng, cfg, cond);
  test::Inputs in = test::random_inputs(rng, cfg, cond);
  const float sigmas[] = {1.0f, 0.95f, 0.8f, 0.5f, 0.1f};
  const float sigma = sigmas[std::uniform_int_distribution<int>(0, 4)(rng)];
  int64_t kv_tile = std::uniform_int_distribution<int>(0, 2)(rng) == 0 ? 1024 : std::uniform_int_distribution<int64_t>(1, 16)(rng);
  if (int8) kv_tile = static_cast<int64_t>(std::bit_floor(static_cast<uint64_t>(kv_tile)));  // divides 4096

  // The reference: one rank, stock plan.
  Ranks one = make_ranks(src, 1, kv_tile, {}, int8);
  ASSERT_TRUE(one.engine);
  auto text = one.engine->refine_text(in.text_view(cfg, cond));
  ASSERT_TRUE(text.ok()) << text.error().message;
  exec::PlanKnobs k1;
  k1.kv_tile = kv_tile;
  k1.int8_attention = int8;
  auto p1 = exec::make_plan(cfg, cond, k1);
  ASSERT_TRUE(p1.ok()) << p1.error().message;
  const exec::ForwardResult ref = run(*one.engine, cfg, cond, in, *text, sigma, *p1);
  ASSERT_GT(test::sum_abs(ref.video), 0.0);  // not vacuous
  ASSERT_GT(test::sum_abs(ref.audio), 0.0);
  const int64_t S = p1->sizes.S;

  std::vector<int> ns = {2, 7};
  if (cfg.heads % 4 == 0) ns.push_back(4);
  for (int n : ns) {
    SCOPED_TRACE(std::to_string(n) + " ranks, S " + std::to_string(S));
    exec::Residency res;
    if (std::uniform_int_distribution<int>(0, 1)(rng)) {  // weight streaming on every rank
      res.resident_blocks = std::uniform_int_distribution<int64_t>(0, cfg.num_layers)(rng);
      res.slots = std::uniform_int_distribution<int>(1, 2)(rng);
    }
    Ranks many = make_ranks(src, n, kv_tile, res, int8);
    ASSERT_TRUE(many.engine);
    EXPECT_EQ(many.engine->ranks(), n);
    // The refined text is rank 0's (the same engine code on the same backend kind).
    auto text_n = many.engine->refine_text(in.text_view(cfg, cond));
    ASSERT_TRUE(text_n.ok()) << text_n.error().message;
    EXPECT_EQ(text_n->bf16, text->bf16);
    if (std::uniform_int_distribution<int>(0, 1)(rng)) {
      ASSERT_TRUE(many.engine->precompute_adaln(cond.sample_sigmas, cond).ok());
    }
    const int64_t R = exec::rank_rows(S, n);
    for (int i = 0; i < plans_per_n; ++i) {
      Expected<exec::Plan> p = Error{};
      if (i == 0) {
        exec::PlanKnobs k;
        k.kv_tile = kv_tile;
        k.ranks = n;
        k.int8_attention = int8;
        p = exec::make_plan(cfg, cond, k);  // stock per rank
      } else if (i == 1) {
        // A per-rank activation budget halfway between the smallest and the stock one.
        auto lo = exec::min_activation_budget(cfg, cond, n, int8);
        ASSERT_TRUE(lo.ok()) << lo.error().message;
        exec::PlanKnobs k;
        k.kv_tile = kv_tile;
        k.ranks = n;
        k.int8_attention = int8;
        auto stock = exec::make_plan(cfg, cond, k);
        ASSERT_TRUE(stock.ok());
        p = exec::plan_for_budget(cfg, cond, (*lo + stock->predicted_peak_bytes) / 2, kv_tile, n, int8);
        ASSERT_TRUE(p.ok()) << p.error().message;
        EXPECT_LE(p->predicted_peak_bytes, (*lo + stock->predicted_peak_bytes) / 2);
      } else {
        exec::PlanKnobs k;
        k.kv_tile = kv_tile;
        k.ranks = n;
        k.int8_attention = int8;
        k.attn_chunk_tokens = random_slice(rng, R);
        k.mlp_chunk_tokens = random_slice(rng, R);
        k.final_chunk_tokens = random_slice(rng, p1->sizes.target_rows);
        p = exec::make_plan(cfg, cond, k);
      }
      ASSERT_TRUE(p.ok()) << p.error().message;
      SCOPED_TRACE("plan " + p->describe());
      EXPECT_EQ(p->ranks, n);
      const exec::ForwardResult r = run(*many.engine, cfg, cond, in, *text_n, sigma, *p);
      EXPECT_TRUE(test::same_bytes(ref.video, r.video)) << "video differs";
      EXPECT_TRUE(test::same_bytes(ref.audio, r.audio)) << "audio differs";
      EXPECT_EQ(r.report.ranks, n);
      ++g_compared;
      ASSERT_EQ(r.report.rank_measured_peak_bytes.size(), static_cast<size_t>(n));
      for (uint64_t b : r.report.rank_measured_peak_bytes) EXPECT_LE(b, p->predicted_peak_bytes);
    }
  }
}

}  // namespace

TEST(Ulysses, RanksGiveOneRanksBytes) {
  for (uint64_t seed = 1; seed <= 40; ++seed) check_case(seed, 6);
  for (uint64_t seed = 41; seed <= 46; ++seed) check_case(seed, 6, /*all_modes=*/true);
  EXPECT_GE(g_compared, 46 * 2 * 6);  // every case compared (2 or 3 rank counts x 6 plans)
  std::printf("%d N-rank forwards compared\n", g_compared);
}

// One rank with PlanKnobs::ranks = 1 is the plan it always was.
// Attention int8 on every rank (docs/int8-attention.md §6): each rank prepares its heads'
// keys once after the all-to-all; every rank count and plan gives one rank's bytes.
TEST(Ulysses, Int8RanksGiveOneRanksBytes) {
  for (uint64_t seed = 1; seed <= 4; ++seed) check_case(seed, 3, false, /*int8=*/true);
}

TEST(Ulysses, OneRankPlanIsUnchanged) {
  std::mt19937_64 rng(11);
  const h3::H3Config cfg = ulysses_cfg(rng);
  const h3::Conditioning cond = test::random_cond(rng, cfg, true);
  exec::PlanKnobs k;
  k.attn_chunk_tokens = 5;
  k.mlp_chunk_tokens = 7;
  auto a = exec::make_plan(cfg, cond, k);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->ranks, 1);
  EXPECT_EQ(a->phase("attn").buffers.size(), 5u);  // K, V, h, Q, attention out
  EXPECT_EQ(exec::find_buffer(a->persistent, "residual x")->rows, a->sizes.S);
  k.ranks = 7;
  auto b = exec::make_plan(cfg, cond, k);
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_EQ(exec::find_buffer(b->persistent, "residual x")->rows, exec::rank_rows(b->sizes.S, 7));
  EXPECT_NE(exec::find_buffer(b->phase("attn").buffers, "K all"), nullptr);
  EXPECT_LT(b->predicted_peak_bytes, a->predicted_peak_bytes);
}

// The total-budget planner plans one rank: at its own minimum for 7 ranks it finds a
// plan (no offload across ranks) that fits.
TEST(Ulysses, TotalBudgetIsPerRank) {
  std::mt19937_64 rng(17);
  h3::H3Config cfg = ulysses_cfg(rng);
  cfg.heads = 14;
  h3::Conditioning cond = test::random_cond(rng, cfg, false);
  cond.geometry.T = 3, cond.geometry.Hl = 6, cond.geometry.Wl = 6;  // S of a few dozen rows
  exec::PlanRequest q;
  q.cfg = &cfg;
  q.cond = &cond;
  q.sigmas = {0.8f};
  q.mode = exec::MemoryMode::total_budget;
  q.device = test::cuda_profile(AttentionAlgorithm::backend_default, CudaBuild{false, true});
  q.device.workspace_bytes = 0;
  q.knobs.ranks = 7;
  auto seven = exec::minimum_budget(q);
  ASSERT_TRUE(seven.ok()) << seven.error().message;
  q.budget_bytes = *seven;
  auto r = exec::plan_memory(q);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->plan.ranks, 7);
  EXPECT_EQ(r->knobs.ranks, 7);
  EXPECT_FALSE(r->plan.kv_offload || r->plan.residual_offload);
  EXPECT_LE(r->peak.predicted_peak_bytes, *seven);
}

TEST(Ulysses, Refusals) {
  std::mt19937_64 rng(5);
  h3::H3Config cfg = ulysses_cfg(rng);
  cfg.heads = 14;
  const h3::H3SyntheticSource src(cfg, 5);
  const h3::Conditioning cond = test::random_cond(rng, cfg, false);
  // Ranks that do not divide the heads: the message names the counts that do.
  exec::PlanKnobs k;
  k.ranks = 4;
  auto p = exec::make_plan(cfg, cond, k);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("1, 2, 7 or 14"), std::string::npos) << p.error().message;
  std::vector<std::unique_ptr<Backend>> b;
  for (int i = 0; i < 3; ++i) b.push_back(make_cpu_backend());
  exec::EngineOptions o;
  o.peer_backends = {b[1].get(), b[2].get()};
  auto e = exec::Engine::create(src, *b[0], o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("3 ranks do not divide"), std::string::npos) << e.error().message;
  // A backend listed twice.
  o.peer_backends = {b[0].get()};
  e = exec::Engine::create(src, *b[0], o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("listed twice"), std::string::npos) << e.error().message;
  // Offload across ranks: refused, not run wrong.
  k.ranks = 2;
  k.attn_chunk_tokens = 4;
  k.kv_offload = true;
  p = exec::make_plan(cfg, cond, k);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("not supported yet"), std::string::npos) << p.error().message;
  k.kv_offload = false;
  k.residual_offload = true;
  EXPECT_FALSE(exec::make_plan(cfg, cond, k).ok());
  // Named intermediates need the whole residual.
  o.peer_backends = {b[1].get()};
  o.eval = [](const std::string&, int64_t, const TensorView&) {};
  e = exec::Engine::create(src, *b[0], o);
  ASSERT_FALSE(e.ok());
  // A plan for another rank count.
  o.eval = nullptr;
  e = exec::Engine::create(src, *b[0], o);
  ASSERT_TRUE(e.ok()) << e.error().message;
  exec::PlanKnobs one;
  auto p1 = exec::make_plan(cfg, cond, one);
  ASSERT_TRUE(p1.ok());
  const Status s = (*e)->prepare(cond, *p1);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("ranks = 2"), std::string::npos) << s.message();
}

// A rank that fails before a collective (non-finite rows after the embedding, on some
// ranks only) aborts the group: forward returns that rank's error instead of hanging,
// and the engine works again on good inputs (a new group).
TEST(Ulysses, FailingRankDoesNotHang) {
  std::mt19937_64 rng(21);
  h3::H3Config cfg = ulysses_cfg(rng);
  cfg.heads = 14;
  const h3::H3SyntheticSource src(cfg, 21);
  h3::Conditioning cond = test::random_cond(rng, cfg, false);
  test::Inputs in = test::random_inputs(rng, cfg, cond);
  Ranks one = make_ranks(src, 1, 1024);
  Ranks many = make_ranks(src, 7, 1024);
  ASSERT_TRUE(one.engine && many.engine);
  auto text = one.engine->refine_text(in.text_view(cfg, cond));
  ASSERT_TRUE(text.ok());
  exec::PlanKnobs k;
  k.ranks = 7;
  auto p = exec::make_plan(cfg, cond, k);
  ASSERT_TRUE(p.ok());
  auto p1 = exec::make_plan(cfg, cond, {});
  ASSERT_TRUE(p1.ok());
  test::Inputs bad = in;
  bad.video.back() = std::numeric_limits<float>::quiet_NaN();  // a video row near the end
  auto r = many.engine->forward(cond, *text, bad.video_view(cfg, cond), bad.audio_view(cfg, cond), 0.8f, *p);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::nonfinite) << r.error().message;
  const exec::ForwardResult a = run(*many.engine, cfg, cond, in, *text, 0.8f, *p);
  const exec::ForwardResult b = run(*one.engine, cfg, cond, in, *text, 0.8f, *p1);
  EXPECT_TRUE(test::same_bytes(a.video, b.video));
  EXPECT_TRUE(test::same_bytes(a.audio, b.audio));
}

// The loopback group's abort: a rank waiting in a collective returns an error naming
// the rank that aborted; later calls fail at once.
TEST(Ulysses, LoopbackAbortWakesPeers) {
  auto g = make_loopback_group(3);
  std::vector<float> s(3), d(3);
  const TensorView sv(s.data(), DType::f32, {3}), dv(d.data(), DType::f32, {3});
  Status st0, st1;
  std::thread t0([&] { st0 = g[0]->all_to_all(sv, dv); });
  std::thread t1([&] { st1 = g[1]->all_to_all(sv, dv); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  g[2]->abort();
  t0.join();
  t1.join();
  ASSERT_FALSE(st0.ok());
  ASSERT_FALSE(st1.ok());
  EXPECT_NE(st0.message().find("rank 2 aborted"), std::string::npos) << st0.message();
  EXPECT_FALSE(g[0]->all_gather(sv, TensorView(d.data(), DType::f32, {3})).ok());
}
