// The planner: arithmetic against DESIGN.md §2 / h3-model.md §6.4 at real H3 size,
// budget search (fits, largest slices, fails before work naming the minimum), sizes.
#include <gtest/gtest.h>

#include <random>

#include "exactness_util.h"
#include "exec/plan.h"

using namespace ls;
using namespace ls::exec;

namespace {
h3::Conditioning clip(int64_t frames, int64_t w, int64_t h, int64_t L) {
  h3::Conditioning c;
  auto g = h3::clip_geometry(frames, w, h, L);
  EXPECT_TRUE(g.ok());
  c.geometry = *g;
  return c;
}
const PlannedBuffer* find(const std::vector<PlannedBuffer>& v, const std::string& what) {
  for (const auto& b : v)
    if (b.what == what) return &b;
  return nullptr;
}
}  // namespace

// §6.4 byte counts at S = 111,274 (15 s, 1 MP, L = 500) on the real dimensions.
TEST(ExecPlan, H3BufferSizesMatchTheSpec) {
  h3::H3Config cfg;
  auto p = make_plan(cfg, clip(362, 1024, 1024, 500), {});
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_EQ(p->sizes.S, 111274);
  EXPECT_EQ(p->sizes.target_rows, 111274 - 500);
  EXPECT_TRUE(p->stock());
  EXPECT_EQ(find(p->persistent, "residual x")->bytes(), 1196418048u);
  const PlanPhase& attn = p->phases[1];
  EXPECT_EQ(find(attn.buffers, "qkv")->bytes(), 4785672192u);
  EXPECT_EQ(find(attn.buffers, "attention out")->bytes(), 1595224064u);
  EXPECT_EQ(find(p->phases[2].buffers, "fc1 out")->bytes(), 6380896256u);
  EXPECT_EQ(find(p->phases[2].buffers, "swiglu out")->bytes(), 3190448128u);
  // Two-pass: K and V of all rows resident (1.486 GiB each) + 8192-row slices.
  PlanKnobs k;
  k.attn_chunk_tokens = k.mlp_chunk_tokens = k.final_chunk_tokens = 8192;
  auto s = make_plan(cfg, clip(362, 1024, 1024, 500), k);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(find(s->phases[1].buffers, "K")->bytes(), 1595224064u);
  EXPECT_EQ(find(s->phases[1].buffers, "Q")->rows, 8192);
  EXPECT_EQ(s->stock_peak_bytes, p->predicted_peak_bytes);
  EXPECT_LT(s->predicted_peak_bytes, p->predicted_peak_bytes / 2);
  // Peak = persistent + max over phases, each buffer 256-byte aligned.
  uint64_t mx = 0;
  for (const auto& ph : s->phases) mx = std::max(mx, ph.bytes());
  EXPECT_EQ(s->predicted_peak_bytes, sum_bytes(s->persistent) + mx);
  EXPECT_TRUE(s->two_pass_attention() && s->sliced_mlp() && s->sliced_head());
  std::printf("stock: %s\nsliced: %s\n", p->describe().c_str(), s->describe().c_str());
}

TEST(ExecPlan, SlicesClampAndResolve) {
  std::mt19937_64 rng(3);
  const auto cfg = test::tiny_cfg(rng, false);
  const auto c = clip(22, 64, 64, 8);
  PlanKnobs k;
  k.mlp_chunk_tokens = 1 << 30;
  k.attn_chunk_tokens = 5;
  auto p = make_plan(cfg, c, k);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->mlp_slice, p->sizes.S);
  EXPECT_EQ(p->attn_slice, 5);
  EXPECT_EQ(p->final_slice, p->sizes.target_rows);
  EXPECT_FALSE(p->sliced_mlp());
  k.kv_tile = 0;
  EXPECT_FALSE(make_plan(cfg, c, k).ok());
  k.kv_tile = 16;
  k.mlp_chunk_tokens = -1;
  EXPECT_FALSE(make_plan(cfg, c, k).ok());
}

TEST(ExecPlan, BudgetSearch) {
  h3::H3Config cfg;  // real dimensions: pure arithmetic, nothing allocated
  const auto c = clip(362, 1024, 1024, 500);
  auto stock = make_plan(cfg, c, {});
  ASSERT_TRUE(stock.ok());
  // A budget at or above the stock peak gives the stock plan.
  auto p = plan_for_budget(cfg, c, stock->predicted_peak_bytes);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->stock());
  // Smaller budgets: the plan fits and its slices are the largest that fit.
  uint64_t prev_attn = UINT64_MAX;
  for (const char* b : {"11GiB", "8GiB", "6GiB", "5GiB", "4.5GiB", "4.4GiB"}) {
    auto bytes = parse_byte_size(b);
    ASSERT_TRUE(bytes.ok());
    auto q = plan_for_budget(cfg, c, *bytes);
    ASSERT_TRUE(q.ok()) << b << ": " << q.error().message;
    EXPECT_LE(q->predicted_peak_bytes, *bytes) << b;
    EXPECT_FALSE(q->stock());
    if (q->two_pass_attention()) {
      // One more row would not fit.
      PlanKnobs k = q->knobs;
      if (q->attn_slice < q->sizes.S) {
        k.attn_chunk_tokens = q->attn_slice + 1;
        auto bigger = make_plan(cfg, c, k);
        ASSERT_TRUE(bigger.ok());
        EXPECT_GT(bigger->predicted_peak_bytes, *bytes) << b;
      }
      EXPECT_LE(static_cast<uint64_t>(q->attn_slice), prev_attn);
      prev_attn = static_cast<uint64_t>(q->attn_slice);
    }
    // The plan's knobs reproduce it.
    auto again = make_plan(cfg, c, q->knobs);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->predicted_peak_bytes, q->predicted_peak_bytes);
  }
  // Too small: fails before any work, naming the smallest budget that works.
  auto small = plan_for_budget(cfg, c, 3ull << 30);
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.error().code, ErrorCode::out_of_budget);
  const std::string msg = small.error().message;
  const auto at = msg.find("smallest budget that works is ");
  ASSERT_NE(at, std::string::npos) << msg;
  const auto paren = msg.find('(', at);
  const uint64_t need = std::stoull(msg.substr(paren + 1));
  EXPECT_TRUE(plan_for_budget(cfg, c, need).ok());
  EXPECT_FALSE(plan_for_budget(cfg, c, need - 1).ok());
  // The floor is K and V of all rows resident: more than 2 * S * I * 2 bytes.
  EXPECT_GT(need, 2ull * 111274 * 7168 * 2);
}

TEST(ExecPlan, ParseByteSize) {
  EXPECT_EQ(*parse_byte_size("512M"), 512ull << 20);
  EXPECT_EQ(*parse_byte_size("3G"), 3ull << 30);
  EXPECT_EQ(*parse_byte_size("3.5GiB"), 7ull << 29);
  EXPECT_EQ(*parse_byte_size("1.5 GB"), 1500000000ull);
  EXPECT_EQ(*parse_byte_size("123456"), 123456ull);
  EXPECT_EQ(*parse_byte_size("64k"), 65536ull);
  for (const char* bad : {"", "G", "3..5G", "3X", "-1G", "3 G B"}) {
    auto r = parse_byte_size(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.error().message.find("512M"), std::string::npos);
    }
  }
}

// With real (tiny) forwards: the planner's choice fits its budget when run, and a
// too-small budget fails before any work.
TEST(ExecPlan, BudgetPlansRunWithinBudget) {
  std::mt19937_64 rng(9);
  const auto cfg = test::tiny_cfg(rng, false);
  h3::H3SyntheticSource src(cfg, 1);
  auto be = make_cpu_backend();
  auto eng = exec::Engine::create(src, *be);
  ASSERT_TRUE(eng.ok());
  auto c = clip(22, 64, 64, 8);
  auto in = test::random_inputs(rng, cfg, c);
  auto text = (*eng)->refine_text(in.text_view(cfg, c));
  ASSERT_TRUE(text.ok());
  auto stock = make_plan(cfg, c, {});
  ASSERT_TRUE(stock.ok());
  auto ref = (*eng)->forward(c, *text, in.video_view(cfg, c), in.audio_view(cfg, c), 0.7f, *stock);
  ASSERT_TRUE(ref.ok());
  std::string need_msg;
  auto fail = plan_for_budget(cfg, c, 1000);
  ASSERT_FALSE(fail.ok());
  const uint64_t need = std::stoull(fail.error().message.substr(fail.error().message.find('(', fail.error().message.find("works is")) + 1));
  for (uint64_t budget = need; budget <= stock->predicted_peak_bytes + 4096; budget += (stock->predicted_peak_bytes - need) / 13 + 1) {
    auto p = plan_for_budget(cfg, c, budget);
    ASSERT_TRUE(p.ok()) << p.error().message;
    auto r = (*eng)->forward(c, *text, in.video_view(cfg, c), in.audio_view(cfg, c), 0.7f, *p);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_LE(r->report.measured_peak_bytes, budget);
    EXPECT_TRUE(test::same_bytes(ref->video, r->video) && test::same_bytes(ref->audio, r->audio)) << p->describe();
  }
}
