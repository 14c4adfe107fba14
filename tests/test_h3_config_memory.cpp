// Buffer sizes (h3-model.md §6.4), and the planner's activation plans made of them.
#include <gtest/gtest.h>

#include "exec/planner.h"
#include "model/h3/memory_table.h"

using namespace ls;
using namespace ls::h3;

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
}

TEST(H3MemoryTable, WorkedExampleBytesExact) {
  // 362 frames, 1024x1024, L = 500 on the real dimensions: S = 111,274 (§6.4).
  const H3Config cfg = *h3_preset("h3");
  auto g = clip_geometry(362, 1024, 1024, 500);
  ASSERT_TRUE(g.ok());
  ASSERT_EQ(g->tokens(), 111274);
  const auto t = h3_buffer_table(cfg, g->tokens(), g->video_tokens());
  ASSERT_EQ(t.size(), 9u);
  EXPECT_EQ(t[0].bytes(), 1196418048);  // residual [S, 5376]
  EXPECT_EQ(t[1].bytes(), 4785672192);  // qkv [S, 21504]
  EXPECT_EQ(t[2].bytes(), 1595224064);  // K [S, 56, 128]
  EXPECT_EQ(t[3].bytes(), 1595224064);  // attention output [S, 7168]
  EXPECT_EQ(t[4].bytes(), 6380896256);  // fc1 [S, 28672]
  EXPECT_EQ(t[5].bytes(), 3190448128);  // swiglu [S, 14336]
  EXPECT_EQ(t[6].bytes(), 42729216);    // rope table bf16 [1, S, 1, 48, 2, 2]: "42.7 MB"
  EXPECT_EQ(t[7].bytes(), 42729216);    // fp32 angles [S, 96]
  EXPECT_EQ(t[8].bytes(), 2356150272);  // final-layer fp32 rows [109568, 5376]
  EXPECT_EQ(t[1].shape_str(), "[111274, 21504]");
  // GiB column of §6.4.
  EXPECT_NEAR(t[0].bytes() / kGiB, 1.114, 0.0005);
  EXPECT_NEAR(t[4].bytes() / kGiB, 5.943, 0.0005);
  // i2v S = 113,330: K/V 1.513 GiB, qkv 4.539 GiB, fc1 6.052 GiB.
  const auto i2v = h3_buffer_table(cfg, 113330, 109568);
  EXPECT_NEAR(i2v[2].bytes() / kGiB, 1.513, 0.0005);
  EXPECT_NEAR(i2v[1].bytes() / kGiB, 4.539, 0.0005);
  EXPECT_NEAR(i2v[4].bytes() / kGiB, 6.052, 0.0005);
}

// What the device holds at once comes from the one planner (exec::plan_memory), whose
// buffer lists forward allocates; `info` prints its tables beside the §6.4 sizes above.
// Here: its stock and 8192-row plans at S = 111,274 are made of exactly those tensors
// (each rounded up to the arena's 256 bytes).
namespace {
uint64_t al(int64_t b) { return (static_cast<uint64_t>(b) + 255) / 256 * 256; }
exec::PlanResult knobs_plan(const H3Config& cfg, const Conditioning& cond, int64_t slice) {
  exec::PlanRequest q;
  q.cfg = &cfg;
  q.cond = &cond;
  q.knobs.attn_chunk_tokens = q.knobs.mlp_chunk_tokens = q.knobs.final_chunk_tokens = slice;
  auto r = exec::plan_memory(q);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return *r;
}
}  // namespace

TEST(H3MemoryTable, StockPlanIsMadeOfTheTableBuffers) {
  const H3Config cfg = *h3_preset("h3");
  Conditioning cond;
  cond.geometry = *clip_geometry(362, 1024, 1024, 500);
  const int64_t S = 111274;
  const auto t = h3_buffer_table(cfg, S, 109568);
  const exec::Plan p = knobs_plan(cfg, cond, 0).plan;
  ASSERT_EQ(p.sizes.S, S);
  // Persistent: x [S, D] + the rope table [S, 2P] (= the table's [S, P, 2, 2]: 2 entries
  // per pair, cos and sin) + two i32 row-index vectors.
  const uint64_t persistent = al(t[0].bytes()) + al(t[6].bytes() / 2) + 2 * al(S * 4);
  EXPECT_EQ(exec::sum_bytes(p.persistent), persistent);
  // The peak is the MLP phase: h [S, D] + fc1 [S, 2F] + swiglu [S, F] (fc2 writes into h).
  EXPECT_EQ(p.predicted_peak_bytes, persistent + al(t[0].bytes()) + al(t[4].bytes()) + al(t[5].bytes()));
  EXPECT_EQ(p.phase("mlp").bytes(), al(t[0].bytes()) + al(t[4].bytes()) + al(t[5].bytes()));
  // Stock attention: h + fused qkv + attention out (out_proj writes into h).
  EXPECT_EQ(p.phase("attn").bytes(), al(t[0].bytes()) + al(t[1].bytes()) + al(t[3].bytes()));
  EXPECT_NEAR(p.predicted_peak_bytes / kGiB, 11.163, 0.001);  // docs/memory.md
}

TEST(H3MemoryTable, SlicedPlanKeepsKAndVResident) {
  const H3Config cfg = *h3_preset("h3");
  Conditioning cond;
  cond.geometry = *clip_geometry(362, 1024, 1024, 500);
  const int64_t S = 111274, c = 8192, D = 5376, I = 7168, F = 14336;
  const auto t = h3_buffer_table(cfg, S, 109568);
  const exec::Plan p = knobs_plan(cfg, cond, c).plan;
  EXPECT_EQ(p.attn_slice, c);
  // Pass 2 holds K and V of all S rows (the table's K alone, twice) + h, Q, attention out of one slice.
  EXPECT_EQ(p.phase("attn").bytes(), 2 * al(t[2].bytes()) + al(c * D * 2) + 2 * al(c * I * 2));
  EXPECT_EQ(p.phase("mlp").bytes(), al(c * D * 2) + al(c * 2 * F * 2) + al(c * F * 2));
  EXPECT_EQ(p.predicted_peak_bytes, exec::sum_bytes(p.persistent) + p.phase("attn").bytes());
  EXPECT_NEAR(p.predicted_peak_bytes / kGiB, 4.407, 0.001);  // docs/memory.md
  // A slice larger than S is S: the MLP phase of 1M-row slices is the stock plan's.
  EXPECT_EQ(knobs_plan(cfg, cond, 1 << 20).plan.phase("mlp").bytes(), knobs_plan(cfg, cond, 0).plan.phase("mlp").bytes());
}

TEST(H3MemoryTable, FollowsConfig) {
  const H3Config tiny = *h3_preset("tiny");
  const auto t = h3_buffer_table(tiny, 100, 64);
  EXPECT_EQ(t[0].bytes(), 100 * 128 * 2);
  EXPECT_EQ(t[1].bytes(), 100 * 3 * 128 * 2);
  EXPECT_EQ(t[6].bytes(), 100 * 24 * 4 * 2);  // 24 rope pairs
  EXPECT_EQ(t[8].bytes(), 64 * 128 * 4);
}
