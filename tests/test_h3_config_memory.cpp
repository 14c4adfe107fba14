// Buffer sizes (h3-model.md §6.4) and per-block activation memory (DESIGN.md §2).
#include <gtest/gtest.h>

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

TEST(H3MemoryTable, StockPlanMatchesLiveSet) {
  // §6.4: attention phase ≈ 9.3 GiB, MLP phase ≈ 12.3 GiB at S = 111,274.
  const H3Config cfg = *h3_preset("h3");
  const BlockMemory m = h3_block_memory_stock(cfg, 111274);
  ASSERT_EQ(m.phases.size(), 2u);
  EXPECT_EQ(m.phases[0].bytes(), 3 * 1196418048LL + 4785672192LL + 1595224064LL);
  EXPECT_NEAR(m.phases[0].bytes() / kGiB, 9.285, 0.001);
  EXPECT_NEAR(m.phases[1].bytes() / kGiB, 12.256, 0.001);
  EXPECT_EQ(m.peak_bytes(), m.phases[1].bytes());
  EXPECT_EQ(m.peak_phase().name, "MLP");
  EXPECT_EQ(m.residual_bytes, 1196418048);
}

TEST(H3MemoryTable, SlicedPlan) {
  const H3Config cfg = *h3_preset("h3");
  const int64_t S = 111274, c = 8192, D = 5376, I = 7168, F = 14336, H = 56;
  const BlockMemory m = h3_block_memory_sliced(cfg, S, c);
  ASSERT_EQ(m.phases.size(), 3u);
  const int64_t resident = S * D * 2 + 2 * S * I * 2;
  EXPECT_EQ(m.phases[0].bytes(), resident + c * D * 2 + c * 2 * I * 2);
  EXPECT_EQ(m.phases[1].bytes(), resident + c * (D * 2 + I * 2 + I * 4 + H * 2 * 4 + I * 2 + D * 2));
  EXPECT_EQ(m.phases[2].bytes(), S * D * 2 + c * (D * 2 + 2 * F * 2 + F * 2 + D * 2));
  EXPECT_EQ(m.peak_bytes(), m.phases[1].bytes());
  EXPECT_NEAR(m.peak_bytes() / kGiB, 4.69, 0.01);
  // Without the residual: K, V and the slice buffers, DESIGN.md's "≈ 3.5 GiB".
  EXPECT_NEAR((m.peak_bytes() - m.residual_bytes) / kGiB, 3.5, 0.1);
  // A slice larger than S is clamped to S; the stock MLP phase then equals the sliced one.
  const BlockMemory whole = h3_block_memory_sliced(cfg, 1000, 8192);
  EXPECT_EQ(whole.phases[2].bytes(), h3_block_memory_stock(cfg, 1000).phases[1].bytes());
}

TEST(H3MemoryTable, FollowsConfig) {
  const H3Config tiny = *h3_preset("tiny");
  const auto t = h3_buffer_table(tiny, 100, 64);
  EXPECT_EQ(t[0].bytes(), 100 * 128 * 2);
  EXPECT_EQ(t[1].bytes(), 100 * 3 * 128 * 2);
  EXPECT_EQ(t[6].bytes(), 100 * 24 * 4 * 2);  // 24 rope pairs
  EXPECT_EQ(t[8].bytes(), 64 * 128 * 4);
  EXPECT_GT(h3_block_memory_stock(tiny, 100).peak_bytes(), 0);
}
