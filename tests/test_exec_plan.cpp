// The planner: arithmetic against DESIGN.md §2 / h3-model.md §6.4 at real H3 size,
// budget search (fits, largest slices, fails before work naming the minimum), sizes,
// the offloaded device lists (names, shapes, order, peaks by hand) and their errors.
#include <gtest/gtest.h>

#include <random>
#include <tuple>

#include "exactness_util.h"
#include "exec/plan.h"

using namespace ls;
using namespace ls::exec;

namespace {
using test::clip;
const PlannedBuffer* find(const std::vector<PlannedBuffer>& v, const std::string& what) {
  return find_buffer(v, what);
}
// "name dtype [rows, cols]" of every buffer, in order.
std::vector<std::string> specs(const std::vector<PlannedBuffer>& v) {
  std::vector<std::string> out;
  for (const auto& b : v)
    out.push_back(b.what + " " + dtype_name(b.dtype) + " [" + std::to_string(b.rows) + ", " + std::to_string(b.cols) + "]");
  return out;
}
uint64_t al(uint64_t b) { return (b + 255) / 256 * 256; }
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

// K/V and residual offload at H3 size (S = 111,274; D 5376, I 7168, H 56, Dh 128, F
// 14336, 2P 96): the lists as the device holds them, exact names, shapes and order.
TEST(ExecPlan, OffloadListsAtH3Size) {
  h3::H3Config cfg;
  const auto c = clip(362, 1024, 1024, 500);
  const int64_t S = 111274;
  PlanKnobs k;
  k.attn_chunk_tokens = 8192;
  k.mlp_chunk_tokens = 4096;
  k.final_chunk_tokens = 2048;
  k.kv_offload = true;
  k.residual_offload = true;
  auto p = make_plan(cfg, c, k);
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_TRUE(p->kv_offload && p->residual_offload);
  EXPECT_EQ(p->kv_chunk, 4096);  // default: 4 tiles of 1024
  const std::string s = std::to_string(S);
  EXPECT_EQ(specs(p->persistent), (std::vector<std::string>{"rope table bf16 [" + s + ", 96]",
                                                            "modulation rows i32 [" + s + ", 1]",
                                                            "final rows i32 [" + s + ", 1]"}));
  ASSERT_EQ(p->phases.size(), 4u);
  EXPECT_EQ(specs(p->phase("embed").buffers),
            (std::vector<std::string>{"residual slice 0 bf16 [4096, 5376]", "residual slice 1 bf16 [4096, 5376]", "patch rows f32 [4096, 96]",
                                      "patch embedding f32 [4096, 5376]"}));
  EXPECT_EQ(specs(p->phase("attn").buffers),
            (std::vector<std::string>{"residual slice 0 bf16 [8192, 5376]", "residual slice 1 bf16 [8192, 5376]", "K chunk 0 bf16 [4096, 7168]",
                                      "K chunk 1 bf16 [4096, 7168]", "V chunk 0 bf16 [4096, 7168]",
                                      "V chunk 1 bf16 [4096, 7168]", "h bf16 [8192, 5376]", "Q bf16 [8192, 7168]",
                                      "attention out bf16 [8192, 7168]", "attention state f32 [8192, 7616]"}));
  EXPECT_EQ(specs(p->phase("mlp").buffers),
            (std::vector<std::string>{"residual slice 0 bf16 [4096, 5376]", "residual slice 1 bf16 [4096, 5376]", "h bf16 [4096, 5376]",
                                      "fc1 out bf16 [4096, 28672]", "swiglu out bf16 [4096, 14336]"}));
  EXPECT_EQ(specs(p->phase("final").buffers),
            (std::vector<std::string>{"residual slice 0 bf16 [2048, 5376]", "residual slice 1 bf16 [2048, 5376]", "h bf16 [2048, 5376]",
                                      "modulated rows f32 [2048, 5376]", "head out f32 [2048, 96]"}));
  // Peak by hand. Persistent: rope S x 96 x 2 + 2 x S x 4 (each 256-aligned).
  const uint64_t pers = al(S * 96 * 2) + 2 * al(S * 4);
  EXPECT_EQ(sum_bytes(p->persistent), pers);
  // attn: 2 x slices + h (8192 x 5376 x 2 each) + Q, out (8192 x 7168 x 2 each) + state
  // 8192 x 56 x 136 x 4 = 8192 x 91392 B, + 4 chunks 4096 x 7168 x 2 = 234,881,024 B.
  const uint64_t attn = 8192ull * 91392 + 4ull * 4096 * 7168 * 2;
  EXPECT_EQ(attn, 983564288u);
  EXPECT_EQ(p->phase("attn").bytes(), attn);
  EXPECT_EQ(p->phase("mlp").bytes(), 4096ull * (3 * 5376 * 2 + 3 * 14336 * 2));  // 484,442,112 < attn
  EXPECT_EQ(p->predicted_peak_bytes, pers + attn);
  EXPECT_EQ(p->predicted_peak_bytes, 1005819392u);
  const std::string d = p->describe();
  EXPECT_NE(d.find("K/V offloaded (chunks of 4096 keys)"), std::string::npos) << d;
  EXPECT_NE(d.find("residual offloaded"), std::string::npos) << d;
  std::printf("%s\n", d.c_str());

  // K/V offload alone: x stays persistent, no residual slices, the same chunks.
  k.residual_offload = false;
  k.kv_chunk_rows = 2048;
  auto kv = make_plan(cfg, c, k);
  ASSERT_TRUE(kv.ok()) << kv.error().message;
  EXPECT_EQ(kv->kv_chunk, 2048);
  EXPECT_EQ(specs(kv->persistent)[0], "residual x bf16 [" + s + ", 5376]");
  EXPECT_EQ(specs(kv->phase("attn").buffers),
            (std::vector<std::string>{"K chunk 0 bf16 [2048, 7168]", "K chunk 1 bf16 [2048, 7168]",
                                      "V chunk 0 bf16 [2048, 7168]", "V chunk 1 bf16 [2048, 7168]",
                                      "h bf16 [8192, 5376]", "Q bf16 [8192, 7168]", "attention out bf16 [8192, 7168]",
                                      "attention state f32 [8192, 7616]"}));
  EXPECT_EQ(find(kv->phase("mlp").buffers, "residual slice 0"), nullptr);
  EXPECT_EQ(kv->predicted_peak_bytes, pers + al(S * 5376 * 2) + 8192ull * (91392 - 2 * 10752) + 4ull * 2048 * 7168 * 2);
  EXPECT_EQ(kv->describe().find("residual offloaded"), std::string::npos);

  // Residual offload alone: K and V of all rows stay, no attention state, kv_chunk 0.
  k.kv_offload = false;
  k.residual_offload = true;
  auto res = make_plan(cfg, c, k);
  ASSERT_TRUE(res.ok()) << res.error().message;
  EXPECT_EQ(res->kv_chunk, 0);
  EXPECT_EQ(specs(res->phase("attn").buffers),
            (std::vector<std::string>{"residual slice 0 bf16 [8192, 5376]", "residual slice 1 bf16 [8192, 5376]", "K bf16 [" + s + ", 7168]",
                                      "V bf16 [" + s + ", 7168]", "h bf16 [8192, 5376]", "Q bf16 [8192, 7168]",
                                      "attention out bf16 [8192, 7168]"}));
  EXPECT_EQ(res->predicted_peak_bytes, pers + 2 * al(S * 7168 * 2) + 8192ull * (3 * 5376 * 2 + 2 * 7168 * 2));

  // No offload: the lists are the ones the engine has always used (no offload names).
  k.residual_offload = false;
  auto none = make_plan(cfg, c, k);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->kv_chunk, 0);
  EXPECT_EQ(specs(none->phase("attn").buffers)[0], "K bf16 [" + s + ", 7168]");
  EXPECT_EQ(none->persistent.size(), 4u);
  EXPECT_EQ(none->describe().find("offloaded"), std::string::npos);
}

// The K/V chunk: the knob, or min(S, kv_tile * ceil(4096 / kv_tile)); a multiple of
// kv_tile unless it equals S.
TEST(ExecPlan, KvChunkResolution) {
  EXPECT_EQ(*resolve_kv_chunk(0, 1024, 111274), 4096);
  EXPECT_EQ(*resolve_kv_chunk(0, 1000, 111274), 5000);  // ceil(4096 / 1000) = 5 tiles
  EXPECT_EQ(*resolve_kv_chunk(0, 3000, 111274), 6000);
  EXPECT_EQ(*resolve_kv_chunk(0, 4096, 111274), 4096);
  EXPECT_EQ(*resolve_kv_chunk(0, 8192, 111274), 8192);
  EXPECT_EQ(*resolve_kv_chunk(0, 1024, 3000), 3000);  // whole sequence in one chunk
  EXPECT_EQ(*resolve_kv_chunk(0, 16, 97), 97);
  // attention int8: 16,384 keys by default (fewer state-carrying calls per query slice).
  EXPECT_EQ(*resolve_kv_chunk(0, 128, 111274, /*int8=*/true), 16384);
  EXPECT_EQ(*resolve_kv_chunk(0, 128, 9000, /*int8=*/true), 9000);
  EXPECT_EQ(*resolve_kv_chunk(4096, 128, 111274, /*int8=*/true), 4096);  // an explicit chunk stays
  // attention int8, contract v4: a chunk shorter than S is whole 128-key tiles too (keys are
  // prepared chunk by chunk; K's scale groups lie in 128-key tiles), whatever kv_tile and S.
  EXPECT_EQ(*resolve_kv_chunk(256, 64, 1000, /*int8=*/true), 256);
  EXPECT_EQ(*resolve_kv_chunk(1536, 512, 111274, /*int8=*/true), 1536);
  EXPECT_EQ(*resolve_kv_chunk(0, 64, 111274, /*int8=*/true), 16384);
  EXPECT_EQ(*resolve_kv_chunk(200, 8, 97, /*int8=*/true), 97);  // >= S: S
  for (auto [knob, tile, S] : {std::tuple<int64_t, int64_t, int64_t>{64, 64, 1000}, {192, 64, 9000},
                               {1040, 16, 9000}, {8, 8, 200}}) {
    auto r = resolve_kv_chunk(knob, tile, S, /*int8=*/true);
    ASSERT_FALSE(r.ok()) << knob << " " << tile << " " << S;
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(r.error().message.find("multiple of 128"), std::string::npos) << r.error().message;
    EXPECT_TRUE(resolve_kv_chunk(knob, tile, S).ok()) << "bf16: whole kv_tile tiles suffice";
  }
  EXPECT_EQ(*resolve_kv_chunk(2048, 1024, 111274), 2048);
  EXPECT_EQ(*resolve_kv_chunk(1024, 1024, 111274), 1024);
  EXPECT_EQ(*resolve_kv_chunk(1500, 1024, 1400), 1400);      // >= S: S, multiple or not
  EXPECT_EQ(*resolve_kv_chunk(200000, 1024, 111274), 111274);
  for (auto [knob, tile, S] : {std::tuple<int64_t, int64_t, int64_t>{1500, 1024, 111274}, {-1, 1024, 111274},
                               {4096, 0, 111274}, {17, 16, 97}}) {
    auto r = resolve_kv_chunk(knob, tile, S);
    ASSERT_FALSE(r.ok()) << knob << " " << tile;
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  }
  EXPECT_NE(resolve_kv_chunk(1500, 1024, 111274).error().message.find("multiple of kv_tile 1024"), std::string::npos);
}

TEST(ExecPlan, OffloadErrors) {
  std::mt19937_64 rng(4);
  const auto cfg = test::tiny_cfg(rng, false);
  const auto c = clip(22, 64, 64, 8);
  auto S = sequence_sizes(cfg, c);
  ASSERT_TRUE(S.ok());
  ASSERT_GT(S->S, 40);
  for (int which = 0; which < 2; ++which) {
    PlanKnobs k;
    k.mlp_chunk_tokens = 16;
    (which == 0 ? k.kv_offload : k.residual_offload) = true;
    auto r = make_plan(cfg, c, k);  // stock attention
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(r.error().message.find("two-pass attention"), std::string::npos) << r.error().message;
    k.attn_chunk_tokens = 7;
    EXPECT_TRUE(make_plan(cfg, c, k).ok());
  }
  PlanKnobs k;
  k.attn_chunk_tokens = 7;
  k.kv_offload = true;
  k.kv_tile = 16;
  k.kv_chunk_rows = -16;
  EXPECT_EQ(make_plan(cfg, c, k).error().code, ErrorCode::invalid_argument);
  k.kv_chunk_rows = 24;  // not a multiple of 16, < S
  auto bad = make_plan(cfg, c, k);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("multiple of kv_tile 16"), std::string::npos) << bad.error().message;
  k.kv_chunk_rows = 32;
  auto ok = make_plan(cfg, c, k);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->kv_chunk, 32);
  EXPECT_EQ(find(ok->phase("attn").buffers, "V chunk 1")->rows, 32);
  k.kv_chunk_rows = S->S + 5;  // >= S: one chunk of all keys
  ok = make_plan(cfg, c, k);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->kv_chunk, S->S);
  // The knobs reproduce the plan (Engine::forward re-plans from them and compares).
  auto again = make_plan(cfg, c, ok->knobs);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->predicted_peak_bytes, ok->predicted_peak_bytes);
  EXPECT_EQ(specs(again->phase("attn").buffers), specs(ok->phase("attn").buffers));
}

TEST(ExecPlan, MinActivationBudgetIsTheNamedMinimum) {
  // min_activation_budget is what plan_for_budget's refusal names: it plans, one byte
  // less does not, on the real width (stock attention larger than one-row slices) and on
  // random tiny configs and clips.
  std::mt19937_64 rng(11);
  std::vector<std::pair<h3::H3Config, h3::Conditioning>> cases = {{*h3::h3_preset("h3"), clip(362, 1024, 1024, 500)},
                                                                   {*h3::h3_preset("small"), clip(22, 64, 64, 7)}};
  for (int i = 0; i < 10; ++i)
    cases.push_back({test::tiny_cfg(rng), clip(5 + 17 * static_cast<int64_t>(rng() % 3), 32 * static_cast<int64_t>(1 + rng() % 3),
                                              32 * static_cast<int64_t>(1 + rng() % 3), static_cast<int64_t>(rng() % 9))});
  for (const auto& [cfg, cond] : cases) {
    auto need = min_activation_budget(cfg, cond);
    ASSERT_TRUE(need.ok()) << need.error().message;
    auto at = plan_for_budget(cfg, cond, *need);
    ASSERT_TRUE(at.ok()) << at.error().message;
    EXPECT_LE(at->predicted_peak_bytes, *need);
    auto below = plan_for_budget(cfg, cond, *need - 1);
    ASSERT_FALSE(below.ok());
    EXPECT_EQ(below.error().code, ErrorCode::out_of_budget);
    std::string want = "(";  // built in steps: GCC 12 warns (-Wrestrict) on "(" + std::string
    want += std::to_string(*need);
    want += " bytes";
    EXPECT_NE(below.error().message.find(want), std::string::npos) << below.error().message;
  }
}
